"""What a student's processes print, on its way to the instructor: capped, neutralised, marked.

A submission's kernel, its clean room and every rank they start print what the student's code
makes them print. Nothing of it may reach the instructor's terminal or the grader's log as it
is: a 10 MB line fills the log, a terminal escape sequence talks to the instructor's terminal,
and a line shaped like nbgrader's own (``There was an error processing assignment ... for
student 'victim'``) used to make ``autograde`` report another student NOT GRADED. So:

* **Marked.** The kernel's and the clean room's standard output and error are a pipe of the
  grader's (:class:`Drain`), never nbgrader's own output: each line is written to the log
  behind :data:`MARK`, which no status line of nbgrader or distlab.grade starts with, and a
  process cannot print a line without it.
* **Neutralised.** Control characters (escape, carriage return, bell...), Unicode's line
  separators and text-direction overrides are shown as Python escapes (``\\x1b``):
  :func:`neutralise`.
* **Capped.** A line keeps at most :data:`MAX_LINE_CHARS` characters; one submission's phase
  (its kernel, or its clean room) at most :data:`MAX_LOGGED_BYTES` in the log; past that
  the rest is read and counted, not kept (:func:`capped_lines`). The same reader tidies
  nbgrader's own log in :mod:`distlab.grade.pipeline.run_nbgrader`, with its own larger cap.

What the kernel sends as cell outputs (through Jupyter's messages, not its standard output)
is capped as it is kept in the graded notebook: :class:`CappedCellOutputs`.
"""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict
from typing import BinaryIO, Iterator

from nbformat.notebooknode import NotebookNode

MARK = "  [submission output] "
"""The start of every line a student's process printed, in the grader's log."""

MAX_LINE_CHARS = 2000
"""Longest line kept in the log, in bytes as printed; the rest of a longer line is counted, not kept."""

MAX_LOGGED_BYTES = 64 * 2**10
"""Most bytes of one kernel's or one clean room's printing kept in the log."""

MAX_CELL_OUTPUT_CHARS = 2**20
"""Most characters of output kept in the graded notebook for one cell (its feedback page too)."""

MAX_NOTEBOOK_OUTPUT_CHARS = 8 * 2**20
"""Most characters of kernel output kept in one graded notebook, all cells together."""

PIPE_ATOMIC_BYTES = 4096
"""A write to a pipe of at most this many bytes (``PIPE_BUF`` on Linux) is never interleaved."""

UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters that move a terminal's cursor, change its state or reorder what it shows."""


def neutralise(text: str) -> str:
    """``text`` with every :data:`UNSAFE` character written as its Python escape."""
    return UNSAFE.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def capped_lines(stream: BinaryIO, max_line: int = MAX_LINE_CHARS, max_bytes: int = MAX_LOGGED_BYTES) -> Iterator[str]:
    """The lines of ``stream``, neutralised, each cut at ``max_line`` characters, until
    ``max_bytes`` were given; the rest is read to its end (the writer must never block on a
    full pipe) and counted in one last line."""
    given = dropped = 0
    while chunk := stream.readline(max_line):
        cut = 0
        if not chunk.endswith(b"\n"):   # a longer line: read the rest of it, keep none
            while (more := stream.readline(2**16)) and not more.endswith(b"\n"):
                cut += len(more)
            cut += len(more.rstrip(b"\n"))
        if given + len(chunk) > max_bytes:
            dropped += len(chunk) + cut
            continue
        given += len(chunk)
        line = neutralise(chunk.decode("utf-8", "replace").rstrip("\n"))
        yield line + (f" [... {cut} more bytes of this line not shown]" if cut else "")
    if dropped:
        yield f"[... {dropped} more bytes not shown: past the {max_bytes // 2**10} KiB kept]"


class Drain:
    """A pipe for a student's process's standard output and error, drained into the log.

    Give :attr:`write_fd` to the process as its stdout and stderr, then call :meth:`started`
    (the grader's copy of the write end is closed, so the drain ends when the process and every
    child holding it have). :meth:`close` waits a little for the last lines. Each line goes
    out in one ``write`` of at most :data:`PIPE_ATOMIC_BYTES`, which a pipe never interleaves
    with another process's or thread's write: no status line of the grader can be split by it.
    """

    def __init__(self, label: str, out_fd: int = 1):
        self.label, self.out_fd = label, out_fd
        read_fd, self.write_fd = os.pipe()
        self.thread = threading.Thread(target=self._drain, args=(read_fd,), daemon=True,
                                       name=f"drain of {label}")
        self.thread.start()

    def _drain(self, read_fd: int) -> None:
        with open(read_fd, "rb") as stream:
            for line in capped_lines(stream):
                data = f"{MARK}{self.label}: {line}".encode()[:PIPE_ATOMIC_BYTES - 1]
                try:
                    os.write(self.out_fd, data.decode("utf-8", "ignore").encode() + b"\n")
                except OSError:   # the log is gone (the grader is ending): read on, so no writer blocks
                    pass

    def started(self) -> None:
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def close(self, wait_s: float = 5.0) -> None:
        self.started()
        self.thread.join(timeout=wait_s)   # a grandchild may still hold the pipe: it is the log's loss


def _size(output) -> int:
    text = output.get("text", "")
    data = output.get("data", {})
    return len(text) + sum(len(str(value)) for value in data.values()) + sum(len(line) for line in output.get("traceback", []))


class CappedCellOutputs:
    """For nbclient's ``NotebookClient``: keeps at most :data:`MAX_CELL_OUTPUT_CHARS` of
    output per cell and :data:`MAX_NOTEBOOK_OUTPUT_CHARS` per notebook (counted afresh for
    each notebook); past either, a note says the rest was not kept. (A message arrives whole
    before it is cut, at most :data:`distlab.grade.boundary.kernel_messages.MAX_MESSAGE_BYTES`.)"""

    def reset_execution_trackers(self) -> None:
        """Before each notebook (nbclient calls it; nbgrader uses one client for the class)."""
        super().reset_execution_trackers()
        self._kept_chars = defaultdict(int)   # per cell index; None: the whole notebook
        self._full_cells = set()

    def output(self, outs, msg, display_id, cell_index):
        out = super().output(outs, msg, display_id, cell_index)
        if out is None or not outs or outs[-1] is not out:
            return out
        kept, full = self._kept_chars, self._full_cells
        room = min(MAX_CELL_OUTPUT_CHARS - kept[cell_index], MAX_NOTEBOOK_OUTPUT_CHARS - kept[None])
        size = _size(out)
        if size > room:
            outs.pop()
            size = 0
            if room > 0 and out.get("output_type") == "stream":   # the first part of it fits
                out["text"], size = out["text"][:room], room
                outs.append(out)
            if cell_index not in full:
                full.add(cell_index)
                outs.append(NotebookNode(output_type="stream", name="stderr", text=(
                    f"\n[distlab.grade: output past {MAX_CELL_OUTPUT_CHARS // 2**20} MiB in a cell, or "
                    f"{MAX_NOTEBOOK_OUTPUT_CHARS // 2**20} MiB in the notebook, was not kept]\n")))
            kept[cell_index] = MAX_CELL_OUTPUT_CHARS
        kept[cell_index] += size
        kept[None] += size
        return out
