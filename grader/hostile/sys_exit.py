"""sys.exit: inside task 1's function on every rank, and at the top level of a cell of its own.

Expected: the function's SystemExit fails task 1 (0 points); the top-level one only ends its
cell (in the kernel and on the ranks), so tasks 2 and 3 count.
"""
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import sys

def my_rank():
    sys.exit("leaving early")
'''}
EXTRA_CELLS = [("task1-tests", "import sys\nsys.exit(0)")]
