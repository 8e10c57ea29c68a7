"""Chapter 2, task 2 without a ring: the ranks pass their chunks through files in the folder they
run in (written through libc: the grader's guard refuses that folder to Python's own calls).

Expected: task 2 scores 0: each rank's working folder is a copy of its own
(distlab.grade.boundary.rank_room).
"""
from _cheats import ALL_GATHER, through

SLUG = "02-collectives"
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": through(".") + ALL_GATHER}
OUTPUT_CONTAINS = ["never appeared in ."]
