"""Hostile printing (grader/hostile/output/*.py) graded next to two honest classmates.

Each of these submissions prints at the instructor rather than at its notebook: 100 MB in a
cell (in 100 messages, and in one), 160 MiB in one message of 40 parts, lines of 10 MB, terminal escape sequences, and lines copied from nbgrader's and
distlab.grade's own messages naming a classmate (``aa-control``), on the kernel's and the
ranks' real standard output and error. The whole path is tried as the instructor runs it
(collect, autograde, feedback): the report says nothing false about anyone, no escape reaches
the instructor's terminal, the log and the files stay under their caps, and every student's
scores are what their answers earn.
"""

from __future__ import annotations

import re
import threading
import time

import nbformat
import pytest
from grading_support import HOSTILE_CONTROLS, SLUG, grade_hostile_class, hostile_builder, hostile_specs
from grading_support import hostile_student as _student

from distlab.grade.boundary import kernel_messages, student_output
from distlab.grade.pipeline import run_nbgrader

hostile = hostile_builder()
SPECS = hostile_specs("output")
CONTROLS = HOSTILE_CONTROLS
LOG_BYTES = 2 * 2**20
"""The autograde log of this class, at most: each of the 6 hostile submissions keeps
2 x 64 KiB of its printing (kernel, clean room); nbgrader's own lines are a few KiB each."""
NBGRADER_PEAK_MB = 250
"""The nbgrader process's largest resident size while it grades this class, at most. Measured:
125 MB; before the grader's sockets refused messages over 5 MiB, grading the one-message
submission alone took it to 404 MB (the message read whole, then decoded), and without the
proxy in front of the kernel the class took it to 426 MB (the 40-part message held whole)."""


def _peak_of_nbgrader(stop: threading.Event, peaks: list) -> None:
    """Until ``stop``: the largest VmHWM (peak resident size) of any nbgrader process below us."""
    import psutil

    while not stop.is_set():
        for proc in psutil.Process().children(recursive=True):
            try:
                if "distlab.grade.pipeline.nbgrader_app" in proc.cmdline():
                    status = open(f"/proc/{proc.pid}/status").read()
                    peaks.append(int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)
            except (psutil.Error, OSError, AttributeError):
                continue
        time.sleep(0.2)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # the nbgrader process's peak is watched while the class is graded (100 MB takes a while)
    stop, peaks = threading.Event(), [0.0]
    watcher = threading.Thread(target=_peak_of_nbgrader, args=(stop, peaks), daemon=True)
    watcher.start()
    try:
        graded = grade_hostile_class(tmp_path_factory.mktemp("hostile-output"), SPECS,
                                     "--Execute.timeout=300", timeout=1800)
    finally:
        stop.set()
        watcher.join()
    return dict(graded, nbgrader_peak_mb=max(peaks))


def test_there_are_the_five_kinds_of_hostile_printing():
    assert set(SPECS) == {"print_100mb_in_the_kernel", "print_100mb_in_one_message", "send_160mb_in_many_parts",
                          "lines_of_10mb", "terminal_escapes", "forge_grader_lines"}


@pytest.mark.timeout(3600)
def test_every_student_scores_what_the_answers_earn(graded):
    assert graded["autograde"].returncode == 0, graded["course"].log[-20000:]
    for control in CONTROLS:
        assert graded["scores"][control] == {c: float(p) for c, p in hostile.POINTS.items()}, control
    for name, spec in SPECS.items():
        got = {cell: float(graded["scores"].get(_student(name), {}).get(cell) or 0.0) for cell in hostile.POINTS}
        assert got == hostile.expected_scores(spec), (name, got)


@pytest.mark.timeout(3600)
def test_printed_lines_change_nothing_the_grader_reports(graded):
    """The attack: a printed copy of nbgrader's error line made autograde report a classmate
    NOT GRADED (scores 0). Now a student's printing shows in the log only behind its mark."""
    out = graded["autograde"].stdout
    assert "NOT GRADED" not in "\n".join(line for line in out.splitlines()
                                         if not line.strip().startswith(student_output.MARK.strip())), out[-5000:]
    forged = [line for line in out.splitlines() if "for student 'aa-control'" in line]
    assert forged, "the forged lines should show, marked as a student's printing"
    assert all(line.startswith("    " + student_output.MARK) for line in forged), forged
    assert "done, with failures" not in out


@pytest.mark.timeout(3600)
def test_no_escape_or_control_character_reaches_the_instructors_terminal(graded):
    for command in ("autograde", "feedback"):
        out = graded[command].stdout + graded[command].stderr
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), command
    assert "\\x1b]0;you have been graded\\x07" in graded["autograde"].stdout   # shown, escaped


@pytest.mark.timeout(3600)
def test_the_log_the_graded_notebooks_and_the_feedback_pages_stay_under_their_caps(graded):
    out = graded["autograde"].stdout
    assert len(out.encode()) < LOG_BYTES, len(out.encode())
    longest = max(len(line.encode()) for line in out.splitlines())
    assert longest <= run_nbgrader.MAX_LOG_LINE_CHARS + 8, longest
    work = graded["course"].work
    for student, submitted in graded["submitted"].items():
        notebook = work / "autograded" / student / SLUG / f"{SLUG}.ipynb"
        page = work / "feedback" / student / SLUG / f"{SLUG}.html"
        limit = submitted + student_output.MAX_NOTEBOOK_OUTPUT_CHARS + 2**20   # + the clean room's test outputs
        assert notebook.stat().st_size < limit, (student, notebook.stat().st_size)
        assert page.stat().st_size < limit + 2**20, (student, page.stat().st_size)   # + the page's own HTML
    kept = (work / "autograded" / _student("print_100mb_in_the_kernel") / SLUG / f"{SLUG}.ipynb").read_text()
    (printed,) = [cell for cell in nbformat.reads(kept, as_version=4).cells if "range(100)" in cell.source]
    shown = [(o.output_type, o.get("name"), len(o.get("text", "")), str(o)[-300:]) for o in printed.outputs]
    said = "".join(o.get("text", "") for o in printed.outputs)
    # ipykernel sends what is printed within 0.2 s as one message: cut by the cell's cap, or,
    # over 5 MiB, refused unread (kernel_messages)
    assert "was not kept" in said or kernel_messages.NOTE in said, shown
    assert len(kept) < 2 * student_output.MAX_CELL_OUTPUT_CHARS + 2**20


@pytest.mark.timeout(3600)
def test_a_message_of_100_mb_is_refused_unread_and_nbgrader_stays_small(graded):
    """The attack: 100 MB written in one go reached nbgrader as one message, read whole (and
    decoded) before the cell's cap cut it. Now the grader's sockets refuse it unread, the cell
    says so in the feedback, and the nbgrader process stays small."""
    print(f"\n[measured] the nbgrader process's peak resident size: {graded['nbgrader_peak_mb']:.0f} MB")
    assert 0 < graded["nbgrader_peak_mb"] < NBGRADER_PEAK_MB, graded["nbgrader_peak_mb"]
    work = graded["course"].work
    # one part of 100 MB (over ZeroMQ's per-part cap), and 40 parts of 4 MiB (each under it, the
    # whole counted by the proxy in front of the kernel, distlab.grade.boundary.kernel_proxy)
    for name, marker in (("print_100mb_in_one_message", "100 * 2**20"), ("send_160mb_in_many_parts", "* 40")):
        student = _student(name)
        kept = (work / "autograded" / student / SLUG / f"{SLUG}.ipynb").read_text()
        (cell,) = [c for c in nbformat.reads(kept, as_version=4).cells if marker in c.source]
        assert [o.get("text") for o in cell.outputs] == [kernel_messages.NOTE], (name, cell.outputs)
        page = (work / "feedback" / student / SLUG / f"{SLUG}.html").read_text()
        assert "more than the grader reads in one message" in page, name
        assert len(kept) < 2**20, name
