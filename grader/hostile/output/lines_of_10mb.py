"""The kernel and the ranks write lines of 10 MB straight to their standard output and error
(ipykernel's saved copy of the real stdout, and the file descriptors), which went to the
instructor's terminal and log whole.

Expected: no line of the grader's log is longer than its cap, the log stays small; every
task counts normally.
"""
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", '''import os, sys
for _ in range(3):
    sys.__stdout__.write("k" * (10 * 2**20) + "\\n"); sys.__stdout__.flush()
    os.write(2, b"e" * (10 * 2**20) + b"\\n")
''')]
ANSWERS = {"task1-answer": '''def my_rank():
    import os
    os.write(1, b"r" * (10 * 2**20) + b"\\n")
    return dist.get_rank()
'''}
