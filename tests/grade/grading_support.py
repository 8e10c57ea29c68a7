"""A throw-away nbgrader course for the grading tests: its own work folder, the real config.

Every command goes through ``python -m distlab.grade`` exactly as an instructor types it,
with ``DISTLAB_GRADE_WORK`` pointing at a temporary folder, so the tests never touch the
repository's ``grader/work`` or ``notebooks/``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from process_support import run_in_own_group

from distlab.grade.author import book_checks

REPO = Path(__file__).resolve().parents[2]
SLUG = "00-first-steps"


class Course:
    def __init__(self, work: Path, db_url: str | None = None):
        """``db_url``: the gradebook on a database server (DISTLAB_GRADE_DB_URL); default sqlite."""
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.db_url = db_url or f"sqlite:///{self.work / 'gradebook.db'}"
        self.log = ""

    def env(self) -> dict:
        env = dict(os.environ)
        env["DISTLAB_GRADE_WORK"] = str(self.work)
        env.pop("DISTLAB_GRADE_DB_URL", None)
        if not self.db_url.startswith("sqlite:"):
            env["DISTLAB_GRADE_DB_URL"] = self.db_url
        return env

    def grade(self, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
        """``python -m distlab.grade ARGS``; its output is kept in ``self.log``."""
        start = time.monotonic()
        # Its own process group: a timeout must not leave nbgrader, its kernel or the clean room running.
        proc = run_in_own_group([sys.executable, "-m", "distlab.grade", *args], timeout, cwd=REPO, env=self.env())
        proc.seconds = time.monotonic() - start
        self.log += f"\n$ grade {' '.join(args)}  ({proc.seconds:.1f} s, exit {proc.returncode})\n" + proc.stdout + proc.stderr
        return proc

    def release(self, slug: str = SLUG) -> Path:
        target = self.work / "release"
        proc = self.grade("release", slug, "--to", str(target))
        assert proc.returncode == 0, self.log
        return target / slug / f"{slug}.ipynb"

    def submit(self, incoming: Path, student: str, notebook_bytes: bytes, slug: str = SLUG) -> None:
        """Put a student's file where ``collect --from incoming`` expects it."""
        folder = incoming / student
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{slug}.ipynb").write_bytes(notebook_bytes)

    def scores(self, slug: str = SLUG) -> dict:
        """``{student: {test grade id: score}}`` straight from the gradebook."""
        from nbgrader.api import Gradebook

        found: dict = {}
        with Gradebook(self.db_url) as gb:
            for student in gb.students:
                try:
                    submission = gb.find_submission_notebook(slug, slug, student.id)
                except Exception:  # noqa: BLE001 - no submission for this student
                    continue
                found[student.id] = {g.name: g.score for g in submission.grades}
        return found

    def max_scores(self, slug: str = SLUG) -> dict:
        """``{test grade id: points}`` of the assignment, from the gradebook."""
        from nbgrader.api import Gradebook

        with Gradebook(self.db_url) as gb:
            return {c.name: c.max_score for c in gb.find_notebook(slug, slug).grade_cells}

    def table(self, name: str) -> list:
        with sqlite3.connect(self.work / "gradebook.db") as db:
            return db.execute(f"select * from {name} order by 1").fetchall()

    def autograded_text(self) -> str:
        """Every autograded notebook of the course, as one string (what the checks printed)."""
        return "".join(p.read_text() for p in (self.work / "autograded").rglob("*.ipynb"))

    def integrity(self) -> str:
        with sqlite3.connect(self.work / "gradebook.db") as db:
            return db.execute("pragma integrity_check").fetchone()[0]


def notebook_cells(path) -> list:
    import nbformat

    return nbformat.read(str(path), as_version=4).cells


def notebook_definitions(slug: str) -> dict:
    """What a student's kernel holds once every cell ran, with the solution's answers: the
    setup, the answers, and the definitions of the test cells (their checks not called)."""
    namespace: dict = {}
    for cell in notebook_cells(solution_path(slug)):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade_id"):
            continue
        source = visible_part(cell.source)
        source = "\n".join(line for line in source.splitlines() if "### " not in line)  # solution markers
        test_cell = meta.get("grade") and not meta.get("solution")
        tree = definitions_only(source) if test_cell else ast.parse(source)   # a test cell's checks not called
        exec(compile(tree, f"<{meta['grade_id']}>", "exec"), namespace)
    return namespace


def definitions_only(source: str) -> ast.Module:
    """A test cell's imports, functions and classes, without the calls that run its checks."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                                  ast.ClassDef))]
    return tree


def solution_path(slug: str) -> Path:
    """The instructor's notebook of an assignment."""
    return REPO / "solutions" / slug / f"{slug}.ipynb"


@functools.lru_cache(maxsize=None)
def _solution(slug: str):
    """The solution notebook, read once per test session (callers get copies of its parts)."""
    import nbformat

    return nbformat.read(str(solution_path(slug)), as_version=4)


def forbidden_list(slug: str) -> list[str]:
    """The names an assignment switches off on the ranks (its notebook metadata, in order)."""
    return list(_solution(slug).metadata["distlab"]["forbidden"])


def _cells_by_grade_id(slug: str, kind: str) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in _solution(slug).cells
            if c.metadata.get("nbgrader", {}).get(kind)}


def grade_cells(slug: str) -> dict:
    """``{grade_id: source}`` of every nbgrader cell of an assignment's solution notebook."""
    return _cells_by_grade_id(slug, "grade_id")


def solution_answers(slug: str) -> dict:
    """``{grade_id: source}`` of the cells a student answers, as the solution answers them."""
    return _cells_by_grade_id(slug, "solution")


def with_answers(release_path, answers: dict) -> bytes:
    """The released notebook with ``answers`` (``{grade_id: source}``) put in: a submission."""
    import nbformat

    nb = nbformat.read(str(release_path), as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nbformat.writes(nb).encode()


HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n?(.*?)(?:### END HIDDEN TESTS\n?|$)", re.S)


def visible_part(source: str) -> str:
    """A test cell as the student's notebook has it: every hidden block taken out."""
    return HIDDEN_BLOCK.sub("", source)


def hidden_part(source: str) -> str:
    """What only the grader runs of a test cell: its hidden blocks (references first, where a
    later task is graded with the reference of an earlier one; then the hidden checks)."""
    return "\n".join(HIDDEN_BLOCK.findall(source))


def assert_tasks_graded_on_2_and_4_ranks(slug: str, tasks=("task1-tests", "task2-tests", "task3-tests")) -> dict:
    """Each coding task's visible tests run on 2 ranks and its hidden tests on 4 (never 1 or 3),
    with the grading seed; return the grade cells, for a chapter's own further checks."""
    found = grade_cells(slug)
    for task in tasks:
        visible, hidden = visible_part(found[task]), hidden_part(found[task])
        assert "nprocs=2" in visible and "nprocs=4" in hidden, task
        assert "nprocs=1" not in found[task] and "nprocs=3" not in found[task], task
        assert "grading_seed()" in hidden, task
    return found


@functools.lru_cache(maxsize=None)
def release_text(slug: str) -> str:
    """The student notebook of ``notebooks/``, as its JSON text."""
    return (REPO / "notebooks" / slug / f"{slug}.ipynb").read_text()


def in_plain_sight(line: str, slug: str) -> bool:
    """Whether the released notebook itself shows ``line`` (an import, say): showing it again
    in feedback leaks nothing."""
    import json

    return json.dumps(line)[1:-1] in release_text(slug)


def hidden_test_lines(slug: str = SLUG) -> list[str]:
    """Every non-trivial line of hidden-test code in the solution notebook."""
    from distlab.grade.boundary.cleanroom import _hidden_lines

    lines = []
    for cell in _solution(slug).cells:
        source_lines = cell.source.splitlines()
        for number in sorted(_hidden_lines(cell.source)):
            text = source_lines[number - 1].strip()
            if len(text) >= 8 and not text.startswith("###"):
                lines.append(text)
    return lines


solution_lines = book_checks.solution_lines   # the lines between BEGIN/END SOLUTION


def graded_solution_tokens() -> list[tuple[str, str, list[str]]]:
    """(chapter, answer grade id, normalised tokens of its solution lines) for every graded answer
    cell: what distlab.grade.author.near_copy compares with the book's listings and with the package."""
    return book_checks.graded_solutions(REPO)


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


HOSTILE = REPO / "grader" / "hostile"


def hostile_builder():
    """grader/hostile/build.py, imported as its submissions import it (``import build``): it turns
    each hostile spec into a student's notebook (``build``), and knows the points (``POINTS``)."""
    if str(HOSTILE) not in sys.path:
        sys.path.insert(0, str(HOSTILE))
    import build

    return build


def hostile_specs(folder: str = "") -> dict:
    """``{name: spec}`` of the hostile submissions in grader/hostile/``folder`` (its top by default;
    ``rooms``, ``caps``, ``output``, ``metadata``), that folder made importable first: its
    submissions share parts by plain imports (rooms/_cheats.py, metadata/delete_forbidden_list.py)."""
    where = str(HOSTILE / folder) if folder else str(HOSTILE)
    builder = hostile_builder()
    if where not in sys.path:
        sys.path.insert(0, where)
    return builder.specs(where)


def honest_spec(slug: str = SLUG):
    """A spec that changes nothing: the solution's answers, an honest classmate's submission."""
    return type("Correct", (), {"SLUG": slug})()


def hand_in(course: Course, specs: dict, slug: str = SLUG, release: Path | None = None) -> dict:
    """Release ``slug`` (unless ``release``, its released notebook, is given), hand in one notebook per
    ``{student: spec}`` (built by grader/hostile/build.py from the release) and collect them, as the
    instructor does; ``{student: size in bytes}``."""
    builder, release = hostile_builder(), str(release or course.release(slug))
    incoming = fresh_dir(course.work.parent / f"incoming-{slug}")
    sizes = {}
    for student, spec in specs.items():
        body = builder.build(spec, release)
        course.submit(incoming, student, body, slug)
        sizes[student] = len(body)
    assert course.grade("collect", slug, "--from", str(incoming)).returncode == 0, course.log
    return sizes


HOSTILE_CONTROLS = ("aa-control", "zz-control")
"""The honest classmates of a hostile class, graded first and last (nbgrader goes in name order)."""


def hostile_student(name: str, prefix: str = "h") -> str:
    """The account that hands in the hostile submission grader/hostile/<name>.py (``prefix``: a
    test's own letter for the submissions of a folder below it)."""
    return f"{prefix}-" + name.replace("_", "-")


def grade_hostile_class(root: Path, specs: dict, *autograde_args: str, timeout: float) -> dict:
    """Hand in each of ``specs`` (:func:`hostile_specs`) beside the two honest HOSTILE_CONTROLS;
    collect, autograde (``autograde_args``, waiting ``timeout`` seconds) and make feedback, as the
    instructor does. Returns the course, its scores, the two
    runs, autograde's seconds, the source cells and the gradebook's mode from before autograde,
    and the size of each submission (tests/grade/test_hostile.py, tests/grade/test_hostile_output.py)."""
    course = Course(root / "work")
    submitted = hand_in(course, {**dict.fromkeys(HOSTILE_CONTROLS, honest_spec()),
                                 **{hostile_student(name): spec for name, spec in specs.items()}})
    source_cells_before, gradebook_mode = course.table("source_cell"), (course.work / "gradebook.db").stat().st_mode
    start = time.monotonic()
    autograde = course.grade("autograde", SLUG, *autograde_args, timeout=timeout)
    seconds = time.monotonic() - start
    return {"course": course, "autograde": autograde, "seconds": seconds, "feedback": course.grade("feedback", SLUG),
            "scores": course.scores(), "source_cells_before": source_cells_before, "gradebook_mode": gradebook_mode,
            "submitted": submitted}


def grade_one_student(root: Path, slug: str, student: str, answers: dict) -> tuple[Course, dict]:
    """Release ``slug``, submit its release with ``answers`` (``{grade_id: source}``) filled in as
    ``student``, and take that one student through ``grade class``; return the course and the
    student's ``{test grade id: score}``."""
    course = Course(root / "work")
    release = course.release(slug)
    incoming = fresh_dir(root / "incoming")
    course.submit(incoming, student, with_answers(release, answers), slug)
    proc = course.grade("class", slug, "--from", str(incoming), "--to", str(root / "grades.csv"))
    assert proc.returncode == 0, course.log
    return course, course.scores(slug)[student]


def test_points(slug: str) -> dict:
    """``{test grade id: points}`` of an assignment's autograded test cells."""
    return {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in _solution(slug).cells
            if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")}


def assert_wrong_answers_lose_only_their_tasks(root: Path, slug: str, answers: dict, wrong: dict,
                                               reasons=()) -> None:
    """Grade one student whose answers are ``answers`` (the solution's, some replaced by plausible
    wrong ones): each test of ``wrong`` (``{test grade id: what its wrong answer does}``) scores 0,
    every other test keeps all its points (the wrong answers cost only their own tasks), and the
    feedback says each of ``reasons`` (the check that caught it, not another)."""
    course, scores = grade_one_student(root, slug, "plausible", answers)
    for test, what in wrong.items():
        assert scores[test] == 0.0, f"{what} was not caught"
    kept = {test: (scores[test], points) for test, points in test_points(slug).items()
            if test not in wrong and scores[test] != points}
    assert not kept, f"tests that lost points although their answers are right: {kept}"
    feedback = course.autograded_text()
    for reason in reasons:
        assert reason in feedback, f"the wrong answer failed, but not with the expected check: {reason!r}"


def wrong_answers_test(slug: str, wrong_answers: dict, caught: dict, reasons=()):
    """A slow test of ``slug``'s grading: plausible wrong answers lose their own tasks and nothing else.

    ``wrong_answers``: ``{answer grade id: code}``, or ``{answer grade id: (old, new)}`` for the
    solution's code with ``old`` replaced by ``new`` (``old`` must still be in the solution);
    ``caught`` and ``reasons``: see :func:`assert_wrong_answers_lose_only_their_tasks`.
    """
    import pytest

    @pytest.mark.slow
    @pytest.mark.timeout(900)
    def test(tmp_path):
        solution = solution_answers(slug)
        answers = dict(solution)
        for cell, change in wrong_answers.items():
            if isinstance(change, tuple):
                old, new = change
                assert old in solution[cell], f"the solution's {cell} changed: update this test"
                answers[cell] = solution[cell].replace(old, new)
            else:
                answers[cell] = change
        assert_wrong_answers_lose_only_their_tasks(tmp_path, slug, answers, caught, reasons)

    return test


def try_each(attempts: dict) -> dict:
    """Call each of ``{name: call}`` (on a rank, with APIs forbidden); ``{name: verdict}`` where the
    verdict is ``"allowed"``, ``"ForbiddenError"``, or another error's type and message."""
    from distlab.grade.boundary.forbid import ForbiddenError

    verdicts = {}
    for name, call in attempts.items():
        try:
            call()
            verdicts[name] = "allowed"
        except ForbiddenError:
            verdicts[name] = "ForbiddenError"
        except Exception as error:  # noqa: BLE001 - anything else is a wrong verdict, said in full
            verdicts[name] = f"{type(error).__name__}: {error}"
    return verdicts


def value_errors(attempts: dict) -> dict:
    """Call each of ``{name: call}`` (on a rank); ``{name: the message of the ValueError it raised}``,
    None where the call was accepted. Any other exception propagates: a wrong size must be refused
    with a ValueError that says why, not fail somewhere deeper."""
    messages = {}
    for name, call in attempts.items():
        try:
            call()
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    return messages


def groups_left_by(nbgrader_pid: int, seconds: float = 10) -> list[Path]:
    """The control groups of a killed grader (named after its nbgrader's process id) still there
    after ``seconds`` of the next grader's sweep (test_submission_caps checks the sweep). A test
    that killed a grader is that next grader, so that no group of it is left for the rest of the run."""
    from distlab.grade.boundary import cgroups

    left_by = f"{cgroups.PREFIX}-{nbgrader_pid}-"
    deadline = time.monotonic() + seconds
    while True:
        cgroups.remove_groups_of_dead_graders(cgroups.group_roots())
        left = [folder for root in cgroups.group_roots() for folder in root.glob(left_by + "*")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
