"""Task 1's answer cell sleeps forever at the top level, before defining the function.

Expected: the kernel's per-cell timeout interrupts it; on the ranks the per-cell limit does;
`my_rank` is never defined, so task 1 scores 0. Later cells still run: tasks 2 and 3 count.
"""
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import time
time.sleep(10**6)

def my_rank():
    return dist.get_rank()
'''}
