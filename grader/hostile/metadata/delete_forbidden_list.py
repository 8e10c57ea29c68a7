"""Chapter 2 with the notebook's ``distlab`` metadata deleted (Edit > Notebook Metadata in
Jupyter), and a task 3 that calls torch's own all_reduce: with the forbidden list read from
the submission, the clean room's ranks forbade nothing at the notebook level.

Expected: nothing changes: the grader reads the list from the instructor's source notebook
(distlab.grade.pipeline.source_rules); task 3 scores 0 (all_reduce is not allowed in this exercise).
"""
SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": '''def ring_all_reduce(tensor):
    """Every rank returns the element-wise sum over all ranks: torch's own collective."""
    total = tensor.clone()
    dist.all_reduce(total)
    return total
'''}


def mutate(nb):
    del nb.metadata["distlab"]
    return nb
