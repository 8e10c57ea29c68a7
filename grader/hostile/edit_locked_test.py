"""Edit the locked test cell of task 2 down to a print, with a wrong answer.

Expected: nbgrader restores the cell from the gradebook (and the clean room only ever runs
the gradebook's copy); task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    return t
'''}


def mutate(nb):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "task2-tests":
            cell.source = "print('all tests passed')"
    return nb
