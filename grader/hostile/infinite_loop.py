"""Task 1's function never returns (a busy loop on every rank).

Expected: the run hits its timeout (or the rank's wall-time cap) and task 1 scores 0.
"""
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''def my_rank():
    while True:
        pass
'''}
