"""Task 1's function prints 100 MB on every rank.

Expected: the rank's output cap stops it ("File too large") and task 1 scores 0; the
notebook receives at most the echo limit of it.
"""
OUTPUT_CONTAINS = ["File too large"]
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''def my_rank():
    print("x" * (100 * 2**20), flush=True)
    return dist.get_rank()
'''}
