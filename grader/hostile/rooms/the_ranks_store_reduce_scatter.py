"""Chapter 2, task 1 without a ring: the ranks use the store they met through (the process group's
rendezvous store, a key-value server every rank is connected to) as a mailbox.

Expected: task 1 scores 0. Chapter 2's ranks are graded on the relay (distlab.relay), whose
process-group store is each rank's own dictionary: a key another rank set never shows, and a
``get`` gives up after two seconds ("Wait timeout"). On a gloo rank the room shuts the
connection to the shared store before any student code runs (distlab.grade.boundary.rank_room), and
the same cheat meets a broken pipe.
"""
from _cheats import EXCHANGE_BY_THE_RANKS_STORE, REDUCE_SCATTER

SLUG = "02-collectives"
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": EXCHANGE_BY_THE_RANKS_STORE + REDUCE_SCATTER}
OUTPUT_CONTAINS = ["Wait timeout"]
