"""Delete task 2's test cell altogether, with a wrong answer.

Expected: the test cell is put back (OverwriteCells.add_missing_cells) and run; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    return t
'''}


def mutate(nb):
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "task2-tests"]
    return nb
