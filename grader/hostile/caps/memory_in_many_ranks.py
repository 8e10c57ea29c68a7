"""Task 1's function holds 1 GB on every rank, under each rank's own memory cap (3 GiB of
address space), so that per-process caps alone let the ranks hold N GB together, however many
the test starts.

The clean room's control group caps the ranks together: graded with
``--SubmissionCaps.memory_mb=2048``, the system ends a rank (SIGKILL; the others are then
stopped, so the error may name another rank), and task 1 scores 0. (The rest of
the submission is correct and keeps its points; an honest clean room holds about 1.2 GiB with
four ranks.)
"""
OUTPUT_CONTAINS = ["ProcessExited"]   # a rank ended by the system; which rank the message names varies
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import time

def my_rank():
    held = bytearray(2**30)
    held[::4096] = b"x" * len(range(0, len(held), 4096))   # touch every page: really held
    time.sleep(2)
    return dist.get_rank()
'''}
