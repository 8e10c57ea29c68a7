"""Chapter 2 with the notebook's forbidden list emptied (``"distlab": {"forbidden": []}``), and
a task 3 that calls torch's own all_reduce: with the list read from the submission, the clean
room's ranks forbade nothing at the notebook level.

Expected: nothing changes: the grader reads the list from the instructor's source notebook
(distlab.grade.pipeline.source_rules); task 3 scores 0 (all_reduce is not allowed in this exercise).
"""
from delete_forbidden_list import ANSWERS  # noqa: F401 - the same answers

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]


def mutate(nb):
    nb.metadata["distlab"] = {"forbidden": []}
    return nb
