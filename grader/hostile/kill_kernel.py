"""A cell of the student's own kills the notebook's kernel (SIGKILL to itself), after the answers.

Expected: the kernel's death ends the kernel run; the tests, which run outside the kernel,
still count normally.
"""
OUTPUT_CONTAINS = ["DeadKernelError"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")]
