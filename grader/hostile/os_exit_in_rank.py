"""A rank ends its own process with os._exit (no exception, no result).

Expected: RankError ("the process of rank 1 exited with code 3"); task 1 scores 0.
"""
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import os

def my_rank():
    if dist.get_rank() == 1:
        os._exit(3)
    return dist.get_rank()
'''}
