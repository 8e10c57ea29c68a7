"""Chapter 2, task 3 without a ring: the ranks pass their tensors through files in $HOME, and send
zeros around a ring for the byte counts.

Expected: task 3 scores 0: each rank's home is its own (distlab.grade.boundary.rank_room).
"""
from _cheats import ALL_REDUCE, through

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": through("~") + ALL_REDUCE}
OUTPUT_CONTAINS = ["never appeared in ~"]
