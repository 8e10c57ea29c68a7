"""Chapter 2, task 3 without a ring: rank 0 starts a TCPStore of its own on the loopback, every
rank puts its tensor there and reads the others'.

Expected: task 3 scores 0: each rank has a network of its own, without even a loopback
(distlab.grade.boundary.rank_room); the store has nobody to talk to.
"""
from _cheats import ALL_REDUCE, EXCHANGE_BY_OWN_STORE

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": EXCHANGE_BY_OWN_STORE + ALL_REDUCE}
OUTPUT_CONTAINS = ["Network is unreachable"]
