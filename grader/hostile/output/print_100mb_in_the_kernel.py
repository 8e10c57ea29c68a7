"""A cell of the student's own prints 100 MB in the notebook's kernel (100 lines of 1 MiB).

Expected: the graded notebook keeps at most the cell's output cap of it, with a note saying
the rest was not kept; the graded notebook and the feedback page stay under their stated
sizes; every task counts normally (the answers are correct).
"""
OUTPUT_CONTAINS = ["was not kept"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", 'for _ in range(100):\n    print("y" * 2**20)')]
