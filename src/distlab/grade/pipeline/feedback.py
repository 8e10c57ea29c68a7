"""The feedback page a student reads: each test named after its task and what it checks.

nbgrader's feedback template lists every test cell as "Test cell" and heads it with its
grade id (``task1-tests``), and loads MathJax from a CDN. The course's template
(``templates/distlab_feedback`` beside this file, set in ``grader/nbgrader_config.py``) names
each test instead, shows whether it passed, and loads MathJax from the student's own server
(``<base>/course/mathjax/``, hub/jupyter/course_feedback.py), so formulas render offline.

:class:`NameTests` runs first among the feedback preprocessors: it writes, into each test
cell's metadata (``distlab_feedback``), the task it belongs to (the heading of the exercise
text above it, "Task 1 — who am I?") and what it checks (the test's own first comment line,
"my_rank() on 4 ranks"; for a test without one, its question and the answer names it reads:
"Concept questions, question (a)", "ideal_step_seconds"). Only the visible part of a test (above ``### BEGIN
HIDDEN TESTS``) is read: a hidden test never names anything in the feedback.
:class:`HideHiddenTestDetails` removes any line of hidden-test code that shows up in a test
cell's output (nbgrader's ``ClearHiddenTests``, after it, removes it from the cell's source).
"""

from __future__ import annotations

import re
from pathlib import Path

from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor
from traitlets import List

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "distlab_feedback"

_HEADING = re.compile(r"^#{1,3}\s+(.+?)\s*$", re.M)
_POINTS = re.compile(r"\s*\(\s*\d+(?:\.\d+)?\s+points?\s*\)\s*$")
_TASK_TESTS = re.compile(r"^task\s+\d+\s+tests?\s*:\s*", re.I)
_QUESTION = re.compile(r"^concept-(\w+)-tests?$")
_DEFINED = re.compile(r"^(?:def\s+(\w+)|(\w+)\s*=(?!=))", re.M)
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


def task_heading(markdown: str) -> str | None:
    """The first heading of an exercise text, without its points: 'Task 1 — who am I?'."""
    match = _HEADING.search(markdown)
    return _POINTS.sub("", match.group(1)).strip() if match else None


def visible_part(source: str) -> str:
    return source.split(HIDDEN_MARK, 1)[0]


def what_it_checks(source: str, grade_id: str, answer_names: list[str]) -> tuple[str, str]:
    """(the part of the task, what the test checks): ("", its first comment line), or for a
    test without one (its question, the answer names it reads)."""
    visible = visible_part(source).strip()
    first = visible.splitlines()[0].strip() if visible else ""
    if first.startswith("#"):
        return "", _TASK_TESTS.sub("", first.lstrip("#").strip()).rstrip(".")
    question = _QUESTION.match(grade_id)
    used = [name for name in answer_names if re.search(rf"\b{re.escape(name)}\b", visible)]
    return (f"question ({question.group(1)})" if question else grade_id), ", ".join(used) or "the answer"


class NameTests(NbGraderPreprocessor):
    """Feedback: name every test cell after its task and what it checks (cell metadata)."""

    display_data_priority = List([]).tag(config=True)   # see QuietClearHiddenTests

    def preprocess(self, nb, resources):
        task, answer_names = None, []
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                task = task_heading(cell.source) or task
            elif cell.cell_type == "code" and utils.is_solution(cell):
                for function, variable in _DEFINED.findall(cell.source):
                    name = function or variable
                    if name not in answer_names:
                        answer_names.append(name)
            if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
                part, checks = what_it_checks(cell.source, grade_id, answer_names)
                cell.metadata["distlab_feedback"] = {
                    "task": ", ".join(filter(None, [task or "Test", part])), "checks": checks}
        return nb, resources


class QuietClearHiddenTests(ClearHiddenTests):
    """nbgrader's ``ClearHiddenTests`` that accepts nbconvert's ``display_data_priority``
    setting (nbconvert hands it to every preprocessor; nbgrader's base class declares it without
    ``config=True``, and traitlets then warns once per preprocessor and run)."""

    display_data_priority = List([]).tag(config=True)


class HideHiddenTestDetails(NbGraderPreprocessor):
    """Feedback: in test cells, replace hidden-test code that shows up in outputs."""

    display_data_priority = List([]).tag(config=True)   # see QuietClearHiddenTests

    def preprocess_cell(self, cell, resources, index):
        from distlab.grade.pipeline.nbplugins import is_test_cell

        if not is_test_cell(cell):
            return cell, resources
        from distlab.grade.boundary.cleanroom import _hidden_lines, redact

        hidden = [cell.source.splitlines()[n - 1] for n in sorted(_hidden_lines(cell.source))]
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                output.text = redact(output.text, hidden)
            elif output.output_type == "error":
                output.evalue = redact(output.evalue, hidden)
                output.traceback = [redact(line, hidden) for line in output.traceback]
            elif "data" in output:
                for key, value in list(output.data.items()):
                    if isinstance(value, str):
                        output.data[key] = redact(value, hidden)
        return cell, resources
