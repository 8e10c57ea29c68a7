"""Hostile submissions (grader/hostile/*.py) graded in one autograde run, next to honest ones.

For each: the tasks it attacks score 0 and the others their normal score; grading stays
within its time bound; no process it started survives; the gradebook is intact; the honest
students graded before and after it keep their full marks.
"""

from __future__ import annotations

import psutil
import pytest
from grading_support import HOSTILE_CONTROLS, SLUG, grade_hostile_class, hostile_builder, hostile_specs
from grading_support import hostile_student as _student

hostile = hostile_builder()
SPECS = hostile_specs()
CONTROLS = HOSTILE_CONTROLS
SECONDS_PER_SUBMISSION = 150
"""Bound per hostile submission: three test cells, each with runs bounded by 20 s timeouts,
plus the kernel run (per-cell timeout 20 s here). Measured on two shared cores: the class of 41
in about 6 minutes, most submissions under 10 s, the hanging ones 25-60 s."""


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # The harness waits as long as the bound the tests below assert (per submission), no less.
    return grade_hostile_class(tmp_path_factory.mktemp("hostile"), SPECS, "--Execute.timeout=20",
                               timeout=(len(SPECS) + len(CONTROLS)) * SECONDS_PER_SUBMISSION)


def test_there_are_at_least_twenty_hostile_submissions():
    assert len(SPECS) >= 20
    for name, spec in SPECS.items():
        assert spec.__doc__ and set(getattr(spec, "AFFECTED", [])) <= set(hostile.POINTS), name


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_hostile_submission_scores(graded, name):
    got = graded["scores"].get(_student(name), {})
    got = {cell: float(got.get(cell) or 0.0) for cell in hostile.POINTS}
    expected = hostile.expected_scores(SPECS[name])
    assert got == expected, (f"{name}: {SPECS[name].__doc__.strip()}\n"
                             f"scores {got}, expected {expected}\n--- grading log ---\n{graded['course'].log[-20000:]}")


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if hasattr(s, "OUTPUT_CONTAINS")))
def test_the_defence_that_stopped_it_shows_in_the_graded_notebook(graded, name):
    """A positive check per mechanism (memory cap, process cap, guard...), not just a zero."""
    course = graded["course"]
    text = (course.work / "autograded" / _student(name) / SLUG / f"{SLUG}.ipynb").read_text()
    for needle in SPECS[name].OUTPUT_CONTAINS:
        assert needle in text or needle.replace("'", "\\'") in text, f"{name}: {needle!r} not in its graded notebook"
    for needle in getattr(SPECS[name], "OUTPUT_EXCLUDES", []):
        assert needle.format(work=course.work) not in text, name


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_honest_students_around_them_keep_full_marks(graded):
    for control in CONTROLS:
        assert graded["scores"][control] == {c: float(p) for c, p in hostile.POINTS.items()}, control


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_gradebook_is_intact(graded):
    course = graded["course"]
    assert course.integrity() == "ok"
    assert course.table("source_cell") == graded["source_cells_before"], "the instructor's cells changed"
    assert not (course.work / "planted.txt").exists()
    submitted = {p.name for p in (course.work / "submitted").iterdir()}
    assert set(CONTROLS) | {_student(n) for n in SPECS} <= submitted


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_grading_stays_within_its_time_bound(graded):
    course = graded["course"]
    n = len(SPECS) + len(CONTROLS)
    assert graded["seconds"] <= n * SECONDS_PER_SUBMISSION
    # per submission: the autograded notebooks are written one after the other
    stamps = sorted(p.stat().st_mtime for p in (course.work / "autograded").glob(f"*/{SLUG}/{SLUG}.ipynb"))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert max(gaps) <= SECONDS_PER_SUBMISSION, f"slowest submission took {max(gaps):.0f} s"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_no_process_survives_grading(graded):
    markers = [spec.MARKER for spec in SPECS.values() if hasattr(spec, "MARKER")]
    assert markers
    survivors = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmd for m in markers):
            survivors.append((proc.pid, cmd))
    assert not survivors


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_broken_submission_is_reported_and_the_rest_graded(graded):
    log = graded["course"].log
    assert graded["autograde"].returncode != 0  # malformed_notebook: nbgrader reports a failure ...
    assert "h-malformed-notebook" in log
    assert graded["scores"]["zz-control"]  # ... and grades everyone after it
    assert graded["feedback"].returncode in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_links_a_kernel_leaves_never_reach_the_graded_folder(graded):
    """grader/hostile/plant_links.py: its kernel leaves a link named like the notebook, to a file
    beside the gradebook, and a link to the gradebook. When the kernel worked in the graded
    folder, nbgrader (as root) wrote the graded notebook through the first, set the gradebook's
    mode and copied it into the feedback through the second; now the kernel has a folder of its
    own, deleted (links unfollowed) once its processes have ended."""
    course, student = graded["course"], _student("plant_links")
    graded_folder = course.work / "autograded" / student / SLUG
    assert SPECS["plant_links"].OUTPUT_CONTAINS[0] in (graded_folder / f"{SLUG}.ipynb").read_text()  # links made
    assert sorted(p.name for p in graded_folder.iterdir()) == [f"{SLUG}.ipynb"]
    assert not (course.work / "planted-by-link.txt").exists(), "nbgrader wrote through the notebook's link"
    assert (course.work / "gradebook.db").stat().st_mode == graded["gradebook_mode"]
    for folder in (course.work / "autograded", course.work / "feedback"):
        links = [p for p in folder.rglob("*") if p.is_symlink()]
        assert not links, links
    returned = [p for p in (course.work / "feedback" / student).rglob("*") if p.is_file()]
    assert returned and not any(p.read_bytes().startswith(b"SQLite format 3") for p in returned), returned
