"""Chapter 2, task 1 without a ring: the ranks use the store they met through (the process group's
rendezvous store, a key-value server every rank is connected to) as a mailbox.

Expected: task 1 scores 0: each rank's connection to that store is shut before its code runs
(distlab.grade.rank_room).
"""
from _cheats import EXCHANGE_BY_THE_RANKS_STORE, REDUCE_SCATTER

SLUG = "02-collectives"
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": EXCHANGE_BY_THE_RANKS_STORE + REDUCE_SCATTER}
OUTPUT_CONTAINS = ["Broken pipe"]
