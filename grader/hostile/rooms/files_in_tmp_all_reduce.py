"""Chapter 2, task 3 without a ring: every rank writes its tensor to a file in /tmp (through libc,
past the grader's guard), reads the others' and sums them; then it sends zeros around a ring so
that the bytes it sends look like a ring's.

Expected: task 3 scores 0. Each rank's /tmp is its own (distlab.grade.boundary.rank_room): the other
ranks' files never appear, and the rank gives up with a TimeoutError.
"""
from _cheats import ALL_REDUCE, through

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": through("/tmp") + ALL_REDUCE}
OUTPUT_CONTAINS = ["never appeared in /tmp"]
