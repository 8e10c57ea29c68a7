"""The exercise's forbidden list comes from the instructor's source notebook, never the submission.

The attack (grader/hostile/metadata/*.py): a chapter 2 submission whose notebook metadata has
no forbidden list (deleted, or emptied) and whose task 3 calls torch's own all_reduce. The
grader read the list it hands the clean room, which forbids it on every graded rank, from the
submitted notebook's metadata: the student chose it. Here a real course is released (its
gradebook holds the instructor's cells) and the grader's clean-room step prepares its job for
each hostile submission as autograde does; the job's list must be the source notebook's.
Then the class is graded: each hostile submission scores 0 on task 3, as an honest classmate's
copy with the same answer would, and full marks elsewhere.
"""

from __future__ import annotations

import functools

import nbformat
import pytest
from grading_support import (
    REPO,
    Course,
    forbidden_list,
    hand_in,
    honest_spec,
    hostile_builder,
    hostile_specs,
    hostile_student,
)

hostile = hostile_builder()
SPECS = hostile_specs("metadata")
SLUG = "02-collectives"
CONTROL = "aa-control"
_student = functools.partial(hostile_student, prefix="m")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("source-rules")
    course = Course(root / "work")
    return root, course, course.release(SLUG)


def _job_for(course: Course, submission: bytes, monkeypatch, source_directory: str | None = None) -> dict:
    """The job the grader's clean-room step prepares for ``submission``, with the course's real
    nbgrader configuration (the clean room itself is not started: the job is what it is told)."""
    from traitlets.config.loader import PyFileConfigLoader

    from distlab.grade.pipeline import nbplugins

    monkeypatch.setenv("DISTLAB_GRADE_WORK", str(course.work))
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "grader")).load_config()
    if source_directory is not None:
        config.CourseDirectory.source_directory = source_directory
    jobs = []

    class Prepared(nbplugins.CleanRoomTests):
        def run_clean_room(self, job, n_tests):
            jobs.append(job)
            return {}, "not started"

    nb = nbformat.reads(submission.decode(), as_version=4)
    resources = {"nbgrader": {"db_url": course.db_url, "assignment": SLUG, "notebook": SLUG, "student": "m-x"}}
    Prepared(config=config).preprocess(nb, resources)
    (job,) = jobs
    return job


def test_the_attacks_are_there():
    assert set(SPECS) == {"delete_forbidden_list", "empty_forbidden_list"}
    for spec in SPECS.values():
        assert spec.SLUG == SLUG and spec.__doc__


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_clean_room_forbids_what_the_source_notebook_lists_whatever_the_submission_says(
        released, name, monkeypatch):
    _, course, release = released
    submission = hostile.build(SPECS[name], str(release))
    assert nbformat.reads(submission.decode(), as_version=4).metadata.get("distlab", {}).get("forbidden", []) == []
    listed = forbidden_list(SLUG)
    assert "all_reduce" in listed
    assert _job_for(course, submission, monkeypatch)["forbidden"] == listed


def test_a_course_without_its_source_notebook_grades_nothing_rather_than_forbid_nothing(released, monkeypatch):
    from distlab.grade.pipeline.source_rules import SourceNotebookMissing

    _, course, release = released
    correct = hostile.build(honest_spec(SLUG), str(release))
    with pytest.raises(SourceNotebookMissing, match="no-such-folder"):
        _job_for(course, correct, monkeypatch, source_directory="no-such-folder")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_submission_without_its_forbidden_list_scores_as_if_it_had_it(released):
    _, course, release = released
    hand_in(course, {CONTROL: honest_spec(SLUG), **{_student(name): spec for name, spec in SPECS.items()}},
            SLUG, release)
    course.grade("autograde", SLUG, "--Execute.timeout=60", timeout=3000)
    scores, points = course.scores(SLUG), course.max_scores(SLUG)
    assert scores[CONTROL] == points, course.log[-5000:]
    for name, spec in SPECS.items():
        expected = {test: (0.0 if test in spec.AFFECTED else full) for test, full in points.items()}
        assert scores[_student(name)] == expected, (name, scores[_student(name)])
    assert "not allowed in this exercise" in course.autograded_text()
