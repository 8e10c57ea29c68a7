"""Change the working directory (in the kernel and on the ranks) before answering.

Expected: grading does not depend on the working directory: every task counts normally.
"""
AFFECTED = []
EXTRA_CELLS = [("setup", "import os, tempfile\nos.chdir(tempfile.gettempdir())\nos.chdir('/')\nprint(os.getcwd())")]
