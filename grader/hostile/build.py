"""Build the hostile submissions of ``grader/hostile/*.py`` into student notebooks.

Each ``<name>.py`` here describes one way a student can break grading, by mistake or on
purpose. It is a small Python file with

* a docstring saying what it does and what must happen;
* ``AFFECTED``: the test cells (grade ids) that must score 0; every other test cell must
  score its normal full points (the rest of the submission is correct);
* ``ANSWERS``: ``{answer cell grade id: source}`` replacing the correct answers;
* optionally ``EXTRA_CELLS``: ``[(grade id to insert after, source), ...]`` (student cells);
* optionally ``mutate(nb)``: edits the notebook itself (e.g. edits a locked cell);
* optionally ``RAW``: a function returning the submission's bytes (e.g. invalid JSON);
* optionally ``MARKER``: a string that any process it starts carries in its command line,
  so the test can check that none survives grading;
* optionally ``SLUG``: the assignment it is a submission of (default: chapter 0's; ``rooms/``
  holds submissions of other chapters, tests/grade/test_hostile_rooms.py).

:func:`build` starts from the released notebook, fills every answer cell with the
solution's code (so the submission is correct), then applies the file's changes.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SLUG = "00-first-steps"
POINTS = {"task1-tests": 1, "task2-tests": 2, "concept-a-tests": 1, "concept-b-tests": 1, "concept-c-tests": 1}


def specs(folder: str = HERE) -> dict:
    """``{name: module}`` for every hostile submission file in ``folder`` (default: this one;
    ``caps/`` holds those that need the grader run with small caps, tests/grade/test_submission_caps.py)."""
    found = {}
    for filename in sorted(os.listdir(folder)):
        if filename.endswith(".py") and filename not in ("build.py", "__init__.py") and not filename.startswith("_"):
            name = filename[:-3]
            spec = importlib.util.spec_from_file_location(f"hostile_{name}", os.path.join(folder, filename))
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            found[name] = module
    return found


def solution_answers(slug: str = SLUG) -> dict:
    """``{answer grade id: the solution's code}`` (the BEGIN/END SOLUTION markers removed)."""
    nb = nbformat.read(os.path.join(REPO, "solutions", slug, f"{slug}.ipynb"), as_version=4)
    answers = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            answers[meta["grade_id"]] = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", "", cell.source, flags=re.M)
    return answers


def build(spec, release_path: str) -> bytes:
    """The submission (notebook bytes) that ``spec`` describes."""
    if hasattr(spec, "RAW"):
        return spec.RAW()
    nb = nbformat.read(release_path, as_version=4)
    answers = solution_answers(getattr(spec, "SLUG", SLUG))
    answers.update(getattr(spec, "ANSWERS", {}))
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    for after, source in reversed(getattr(spec, "EXTRA_CELLS", [])):
        index = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
        nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    if hasattr(spec, "mutate"):
        nb = spec.mutate(copy.deepcopy(nb)) or nb
    return nbformat.writes(nb).encode()


def expected_scores(spec) -> dict:
    affected = set(getattr(spec, "AFFECTED", []))
    return {cell: (0.0 if cell in affected else float(points)) for cell, points in POINTS.items()}
