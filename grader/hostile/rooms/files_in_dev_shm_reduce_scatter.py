"""Chapter 2, task 1 without a ring: the ranks pass their tensors through files in /dev/shm
(POSIX shared memory is a file there) and each keeps its chunk of the sum.

Expected: task 1 scores 0: each rank's /dev/shm is its own (distlab.grade.boundary.rank_room).
"""
from _cheats import REDUCE_SCATTER, through

SLUG = "02-collectives"
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": through("/dev/shm") + REDUCE_SCATTER}
OUTPUT_CONTAINS = ["never appeared in /dev/shm"]
