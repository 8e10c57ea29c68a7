"""No graded solution is a near-copy of the package a student's kernel imports.

tests/book/test_book.py keeps the rendered pages from printing a graded answer. The other place a
student can read code is the package itself: ``inspect.getsource`` or ``??`` on anything
``import distlab`` reaches. The student edition (``python -m distlab.grade student-edition``)
ships ``src/distlab`` less what ``edition.instructor_only`` names, so the files measured here
are the tracked ones of ``src/distlab`` that the same rule keeps: a module added later, or an
instructor-only one moved back into the edition, is measured without touching this file.

Each graded solution (the lines between nbgrader's solution markers of every ``*-answer`` cell)
is compared, with distlab.grade.author.near_copy's measure, against every top-level function and class of
those files:

- against one of them alone, at ``near_copy.NEAR_COPY`` (0.5), the book's threshold;
- against all of them together, at :data:`WHOLE_PACKAGE`. Independent solutions share idioms
  with the package (``for p in model.parameters(): if p.grad is not None: dist.all_reduce(...)``,
  a ring's send/recv pair): measured before chapter 3's Task 1 and chapter 5's Task 3 were
  changed, solutions written separately from the package reached 0.54-0.57 against all of it
  together; the two copies were at 0.93 (chapter 3, Task 1: the package's naive DDP, piece by
  piece) and 0.65 (chapter 5, Task 3: its vocabulary-parallel loss).

Solutions shorter than ``4 * near_copy.MIN_RUN`` tokens are not measured, the same rule as the
book's check: chapter 0's ``global_mean`` (29 tokens: clone, all-reduce, divide) is the
all-reduce idiom itself, which the package must use too (its ``regions.all_reduce`` is 0.69 of
it); a one-line answer has nothing to copy.

Checked to fail on purpose: on the tree before the two tasks were changed (chapter 3's Task 1
at 0.93 together, chapter 5's Task 3 at 0.65 alone), and in a clone with a module committed
that holds chapter 5's Task 1 solution (its classes each alone stay under 0.5; together 0.88).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import subprocess
import textwrap
from pathlib import Path

import grading_support as gs

from distlab.data_parallel import naive
from distlab.grade.author import edition, near_copy

REPO = Path(__file__).resolve().parents[2]
WHOLE_PACKAGE = 0.6   # independent solutions reach 0.57 from shared idioms (see above)
SHORT = 4 * near_copy.MIN_RUN


def student_package_files() -> list[str]:
    """The package's Python files as the student edition has them (tracked, not instructor-only)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", "src/distlab"], capture_output=True,
                            text=True, check=True, timeout=60).stdout.split("\0")
    return sorted(p for p in listed if p.endswith(".py") and not edition.instructor_only(p))


@functools.lru_cache(maxsize=1)
def package_units() -> dict[str, list[str]]:
    """``{module:name: normalised tokens}`` of every top-level function and class (methods
    included in their class) of the student's package."""
    units = {}
    for path in student_package_files():
        source = (REPO / path).read_text()
        lines = source.splitlines()
        module = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                code = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno]))
                tokens = near_copy.normalised_tokens(code)
                if len(tokens) >= near_copy.MIN_RUN:
                    units[f"{module}:{node.name}"] = tokens
    return units


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    n = near_copy.MIN_RUN
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@functools.lru_cache(maxsize=1)
def unit_shingles() -> dict[str, set]:
    return {name: shingles(tokens) for name, tokens in package_units().items()}


def measure(tokens: list[str]) -> tuple[float, str, float]:
    """(largest share copied from one unit, that unit, share copied from all of them together).

    A run of ``MIN_RUN`` matching tokens is a shared ``MIN_RUN``-gram, so only the units sharing
    one with the solution can count; ``copied_fraction`` is then run on those alone (the same
    numbers as on all units, in a fraction of the time)."""
    mine = shingles(tokens)
    candidates = [name for name, theirs in unit_shingles().items() if mine & theirs]
    units = package_units()
    single = max(((near_copy.copied_fraction(tokens, [units[n]]), n) for n in candidates), default=(0.0, ""))
    whole = near_copy.copied_fraction(tokens, [units[n] for n in candidates])
    return single[0], single[1], whole


def test_the_measured_files_are_the_student_editions_package():
    files = student_package_files()
    assert "src/distlab/__init__.py" in files and "src/distlab/grade/checks.py" in files
    assert "src/distlab/data_parallel/naive.py" in files        # the reference the book runs stays
    assert not any(p.startswith("src/distlab/grade/author/new_chapter") for p in files)   # instructor-only
    assert len(package_units()) > 300, "found few functions and classes: has the layout changed?"


def test_the_shortcut_gives_the_full_measure_and_sees_a_renamed_copy():
    """The shingle filter drops no unit that shares a run: on one solution (chapter 3's Task 3,
    whose loop shares runs with several functions) the numbers equal the plain measure over every
    unit; and a renamed copy of a package function is found as one."""
    units = package_units()
    tokens = next(t for slug, grade_id, t in gs.graded_solution_tokens() if (slug, grade_id) == ("03-ddp", "task3-answer"))
    single, _, whole = measure(tokens)
    assert single > 0.3
    assert abs(whole - near_copy.copied_fraction(tokens, list(units.values()))) < 1e-12
    assert abs(single - max(near_copy.copied_fraction(tokens, [u]) for u in units.values())) < 1e-12

    renamed = re.sub(r"\bparam\b", "weight", inspect.getsource(naive.average_gradients)).replace("world", "n")
    single, name, whole = measure(near_copy.normalised_tokens(renamed))
    assert single > 0.9 and whole > 0.9 and name == "distlab.data_parallel.naive:average_gradients"


def test_no_graded_solution_is_a_near_copy_of_the_package_students_import():
    solutions = gs.graded_solution_tokens()
    assert len(solutions) >= 20
    copies = []
    for chapter, grade_id, tokens in solutions:
        if len(tokens) < SHORT:
            continue
        single, unit, whole = measure(tokens)
        if single >= near_copy.NEAR_COPY:
            copies.append(f"{chapter} {grade_id}: {single:.0%} of it is in {unit}")
        if whole >= WHOLE_PACKAGE:
            copies.append(f"{chapter} {grade_id}: {whole:.0%} of it is in the package's functions together")
    assert not copies, "graded solutions the student's own package holds:\n" + "\n".join(copies)
