"""Chapter 2, task 3 without a ring: every rank puts its tensor in a SysV shared-memory segment
(through libc) and reads the others'.

Expected: task 3 scores 0: each rank has an IPC namespace of its own (distlab.grade.boundary.rank_room),
so the others' segments never appear.
"""
from _cheats import ALL_REDUCE, EXCHANGE_BY_SYSV

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": EXCHANGE_BY_SYSV + ALL_REDUCE}
OUTPUT_CONTAINS = ["never appeared in shared memory"]
