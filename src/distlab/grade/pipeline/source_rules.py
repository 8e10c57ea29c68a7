"""An exercise's rules as the instructor wrote them: read from the source notebook, never the submission.

An exercise notebook names the APIs it switches off in its metadata
(``{"distlab": {"forbidden": [...]}}``), and the clean room forbids them on every graded rank
(:class:`distlab.grade.pipeline.nbplugins.CleanRoomTests`). The student's copy carries the same
metadata, because releasing copies it; but the student's copy is the student's: a notebook's
metadata is one menu away in Jupyter (Edit > Notebook Metadata), and a submission may hold
any JSON at all. Read from there, the list is whatever the student left in it, or nothing.

So the grader reads it from the instructor's source notebook of the assignment
(``solutions/<assignment>/<notebook>.ipynb`` in this course: nbgrader's ``CourseDirectory``
says where), the same file the gradebook's test cells came from. A source notebook that cannot
be read stops the grading of that notebook with the reason: grading it with nothing forbidden
would be grading a different exercise.
"""

from __future__ import annotations

import os

import nbformat
from nbgrader.coursedir import CourseDirectory


class SourceNotebookMissing(RuntimeError):
    """The instructor's source notebook of an assignment cannot be read."""


def source_notebook_path(config, assignment: str, notebook: str) -> str:
    """Where the course keeps the instructor's version of ``notebook`` of ``assignment``
    (``config``: the nbgrader configuration in force)."""
    course = CourseDirectory(config=config)
    return os.path.join(course.format_path(course.source_directory, ".", assignment), f"{notebook}.ipynb")


def forbidden_in_source(config, assignment: str, notebook: str) -> list[str]:
    """The notebook-level forbidden list of the instructor's source notebook (empty if it names none)."""
    path = source_notebook_path(config, assignment, notebook)
    try:
        source = nbformat.read(path, as_version=4)
    except (OSError, ValueError) as exc:
        raise SourceNotebookMissing(f"cannot read the source notebook {path} for the exercise's rules "
                                    f"(what is forbidden while the tests run): {exc}") from None
    forbidden = source.metadata.get("distlab", {}).get("forbidden", [])
    if not (isinstance(forbidden, list) and all(isinstance(name, str) for name in forbidden)):
        raise SourceNotebookMissing(f"{path}: the forbidden list of its metadata must be a list of API names")
    return list(forbidden)
