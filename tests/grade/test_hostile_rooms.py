"""Hostile submissions of chapters 2 and 3 (grader/hostile/rooms/*.py) that move tensors between
ranks without a message: through files in /tmp, /dev/shm, the working folder and the home,
through SysV shared memory, through a TCPStore of their own and through the ranks' store.

Graded through the instructor's commands, one autograde per chapter, beside an honest student:
each scores 0 on the task it attacks and full marks elsewhere, because every graded rank works
in a room of its own (distlab.grade.boundary.rank_room); the honest student keeps full marks.
(Chapter 0's attack, grader/hostile/exchange_through_tmp.py, is graded with the others of
tests/grade/test_hostile.py.)
"""

from __future__ import annotations

import functools

import pytest
from grading_support import Course, hand_in, honest_spec, hostile_specs, hostile_student

SPECS = hostile_specs("rooms")
SLUGS = sorted({spec.SLUG for spec in SPECS.values()})
CONTROL = "aa-control"
_student = functools.partial(hostile_student, prefix="r")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = Course(tmp_path_factory.mktemp("hostile-rooms") / "work")
    for slug in SLUGS:
        hand_in(course, {CONTROL: honest_spec(slug),
                         **{_student(name): spec for name, spec in SPECS.items() if spec.SLUG == slug}}, slug)
        course.grade("autograde", slug, "--Execute.timeout=60", timeout=3000)
    return course


def test_every_chapter_the_issue_names_is_attacked():
    assert SLUGS == ["02-collectives", "03-ddp"]
    for name, spec in SPECS.items():
        assert spec.__doc__ and spec.AFFECTED, name


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_cheat_through_a_shared_place_scores_zero_on_its_task(graded, name):
    spec = SPECS[name]
    full = graded.max_scores(spec.SLUG)
    got = {cell: float(score or 0.0) for cell, score in graded.scores(spec.SLUG).get(_student(name), {}).items()}
    expected = {cell: 0.0 if cell in spec.AFFECTED else float(points) for cell, points in full.items()}
    assert got == expected, f"{name}: {spec.__doc__.strip()}\n--- grading log ---\n{graded.log[-20000:]}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if hasattr(s, "OUTPUT_CONTAINS")))
def test_the_room_is_what_stopped_it(graded, name):
    spec = SPECS[name]
    text = (graded.work / "autograded" / _student(name) / spec.SLUG / f"{spec.SLUG}.ipynb").read_text()
    for needle in spec.OUTPUT_CONTAINS:
        assert needle in text, f"{name}: {needle!r} not in its graded notebook"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("slug", SLUGS)
def test_the_honest_student_beside_them_keeps_full_marks(graded, slug):
    assert graded.scores(slug)[CONTROL] == {c: float(p) for c, p in graded.max_scores(slug).items()}
