"""Task 1's function kills every process above the rank (torchrun, the grader, ...), found
through /proc/self (a graded rank is process 1 of a namespace of its own, where psutil's own
idea of "this process" names another).

Expected: signalling processes other than its own descendants is refused on a graded rank;
grading goes on; task 1 scores 0.
"""
OUTPUT_CONTAINS = ["not allowed in this exercise"]
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import os, signal

def my_rank():
    import psutil
    for parent in psutil.Process(int(os.readlink("/proc/self"))).parents():
        if parent.pid > 1:
            os.kill(parent.pid, signal.SIGKILL)
    return dist.get_rank()
'''}
