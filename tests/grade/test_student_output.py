"""A student's printing on its way to the instructor: capped, neutralised, marked (fast, no grading).

The whole path, a hostile kernel graded next to a classmate, is in tests/grade/test_hostile_output.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

from nbformat.notebooknode import NotebookNode

from distlab.grade.__main__ import ungraded
from distlab.grade.boundary import student_output
from distlab.grade.pipeline import nbgrader_app

FORGED = "[AutogradeApp | ERROR] There was an error processing assignment '00-first-steps' for student 'victim'"


def test_long_lines_are_cut_escapes_neutralised_and_the_total_capped():
    printed = (b"x" * (10 * 2**20) + b"\n" + b"\x1b[2J\x1b]0;owned\x07bell\rback\n" + "caf\u00e9 \u202eevil\n".encode()
               + b"\xff\xfe not utf-8\n" + b"y" * 5000 + b"no newline at the end")
    lines = list(student_output.capped_lines(io.BytesIO(printed), max_line=100, max_bytes=10_000))
    assert lines[0] == "x" * 100 + f" [... {10 * 2**20 - 100} more bytes of this line not shown]"
    assert lines[1] == "\\x1b[2J\\x1b]0;owned\\x07bell\\rback"
    assert lines[2] == "caf\u00e9 \\u202eevil"
    assert lines[3] == "\ufffd\ufffd not utf-8"
    assert lines[4].startswith("y" * 100 + " [... ")
    assert all(line.isprintable() for line in lines)
    few = list(student_output.capped_lines(io.BytesIO(b"abc\n" * 10_000), max_line=100, max_bytes=400))
    assert few[:-1] == ["abc"] * 100 and few[-1].startswith(f"[... {4 * 9_900} more bytes not shown")


def test_a_drain_marks_every_line_a_process_prints_and_keeps_each_write_atomic():
    """The attack: a process that prints nbgrader's status line, a terminal escape and a 10 MB
    line. Through the drain every line it makes starts with the mark, and none is longer than
    one atomic pipe write."""
    read_fd, write_fd = os.pipe()
    drain = student_output.Drain("the kernel", out_fd=write_fd)
    script = (f"import sys, os; print({FORGED!r}); print('\\x1b[31mred\\x1b[0m'); sys.stdout.flush();"
              f"os.write(2, b'z' * (10 * 2**20) + b'\\n' + {FORGED.encode()!r} + b'\\n')")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=drain.write_fd, stderr=drain.write_fd)
    drain.started()
    child.wait(timeout=60)
    drain.close(wait_s=30)
    os.close(write_fd)
    with open(read_fd, "rb") as stream:
        written = stream.read().decode()
    lines = written.splitlines()
    assert len(lines) == 4, lines[:2]
    assert all(line.startswith(student_output.MARK + "the kernel: ") for line in lines)
    assert all(len(line.encode()) < student_output.PIPE_ATOMIC_BYTES for line in lines)
    assert "\x1b" not in written and "\\x1b[31mred" in written
    assert ungraded(lines) == {}


def test_only_nbgraders_own_first_line_of_a_record_names_a_student_not_graded(monkeypatch):
    """A student's text inside a log record (an exception that quotes the notebook) is indented
    after the record's first line; one printed by a student's process is marked. Neither counts."""
    import logging

    monkeypatch.setattr(logging.Formatter, "format", logging.Formatter.format)   # put back afterwards
    nbgrader_app.indent_continued_lines()
    record = logging.LogRecord("AutogradeApp", logging.ERROR, __file__, 1,
                               "Traceback (most recent call last):\nValueError: bad cell\n" + FORGED, None, None)
    quoted = logging.Formatter("[AutogradeApp | %(levelname)s] %(message)s").format(record).splitlines()
    log = [*quoted, student_output.MARK + "the kernel: " + FORGED,
           "[AutogradeApp | ERROR] There was an error processing assignment '00-first-steps' for student 'mallory'"]
    assert ungraded(log) == {"mallory": "ValueError: bad cell"}


class _Printer:
    """nbclient's part that CappedCellOutputs wraps: each message becomes one stream output."""

    def reset_execution_trackers(self):
        pass

    def output(self, outs, msg, display_id, cell_index):
        out = NotebookNode(output_type="stream", name="stdout", text=msg["text"])
        outs.append(out)
        return out


class _CappedPrinter(student_output.CappedCellOutputs, _Printer):
    pass


def test_cell_outputs_are_capped_per_cell_and_per_notebook_counted_afresh_for_each_notebook():
    """nbgrader grades the whole class with one client: the counts of one student's notebook
    once carried over to the next, whose outputs were then dropped without a note."""
    client = _CappedPrinter()
    cell_cap, notebook_cap = student_output.MAX_CELL_OUTPUT_CHARS, student_output.MAX_NOTEBOOK_OUTPUT_CHARS
    for notebook in range(2):
        client.reset_execution_trackers()
        cells = []
        for index in range(notebook_cap // cell_cap + 2):
            outs = []
            for _ in range(3):
                client.output(outs, {"text": "y" * (cell_cap // 2 + 1)}, None, index)
            cells.append(outs)
        kept = [sum(len(o["text"]) for o in outs if o["name"] == "stdout") for outs in cells]
        notes = [sum("was not kept" in o["text"] for o in outs if o["name"] == "stderr") for outs in cells]
        assert kept[:notebook_cap // cell_cap] == [cell_cap] * (notebook_cap // cell_cap), (notebook, kept)
        assert kept[notebook_cap // cell_cap:] == [0, 0], (notebook, kept)
        assert notes == [1] * len(cells), (notebook, notes)
