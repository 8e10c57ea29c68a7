"""Task 1's function forks 50 children through libc (ctypes), getting past Python's audit hooks.

This is what the process cap is for when RLIMIT_NPROC does not bind (root): the rank's
watchdog sees more live descendants than its cap, kills them and ends the rank.
Expected: task 1 scores 0 and no forked child survives.
"""
OUTPUT_CONTAINS = ["more than its cap of"]
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import ctypes, time

def my_rank():
    libc = ctypes.CDLL(None)
    for _ in range(50):
        if libc.fork() == 0:
            while True:
                libc.pause()
    time.sleep(5)
    return dist.get_rank()
'''}
