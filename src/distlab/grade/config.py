"""Paths and defaults of the grading setup (nbgrader_config.py reads them from here)."""

from __future__ import annotations

import os

CELL_TIMEOUT_S = 60
"""Per-cell timeout in the student's kernel: a cell still running after it is interrupted
(it scores as an error) and grading goes on with the next cell."""

TEST_CELL_TIMEOUT_S = 180
"""Per-test-cell limit in the clean room. Each ``distlab.run`` in a test has its own timeout;
this is the backstop for a test that launches several runs."""

COLLECT_REGEXP = r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9.@+-]*)/(?:.*/)?(?P<file_id>[^/]+\.ipynb)$"
"""``nbgrader zip_collect``: ``archive/<student_id>.zip`` (or ``archive/<student_id>/``) holding
``<slug>.ipynb`` becomes ``submitted/<student_id>/<slug>/<slug>.ipynb``. Student ids are letters,
digits and ``. @ + -`` (no ``/``, no ``_`` at the start)."""


COURSE_ID = "distlab"
"""nbgrader's course id: the exchange keeps each course's files under it."""


def repo_root() -> str:
    """The course root: the repository this distlab comes from (``src/distlab/grade`` → ``.``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def work_dir(repo: str | None = None) -> str:
    """The git-ignored working folder (``DISTLAB_GRADE_WORK`` overrides ``grader/work``)."""
    return os.path.abspath(os.environ.get("DISTLAB_GRADE_WORK") or os.path.join(repo or repo_root(), "grader", "work"))


def exchange_root() -> str:
    """nbgrader's exchange: ``DISTLAB_GRADE_EXCHANGE`` on the course hub, else ``<work>/exchange``."""
    return os.path.abspath(os.environ.get("DISTLAB_GRADE_EXCHANGE") or os.path.join(work_dir(), "exchange"))


def protected_paths(repo: str | None = None) -> list[str]:
    """What student code may not touch while graded: solutions, grader files, git history, work folder."""
    repo = repo or repo_root()
    return [os.path.join(repo, "solutions"), os.path.join(repo, "grader"), os.path.join(repo, ".git"),
            work_dir(repo)]
