"""A cell of the student's own allocates 10 GB in the notebook's kernel itself.

Expected: the kernel's memory cap makes the cell fail; the kernel survives and every task
counts normally (the answers are correct).
"""
OUTPUT_CONTAINS = ["can't allocate memory"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", "import torch\nhog = torch.ones(10 * 2**30 // 4)\nprint(hog.sum())")]
