"""A cell of the student's own prints 100 MB in the notebook's kernel (100 lines of 1 MiB).

Expected: the graded notebook keeps at most the cell's output cap of it, with a note saying
the rest was not kept (or, where ipykernel gathered more than 5 MiB of it into one message,
a note that the message was refused unread); the graded notebook and the feedback page stay under their stated
sizes; every task counts normally (the answers are correct).
"""
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", 'for _ in range(100):\n    print("y" * 2**20)')]
