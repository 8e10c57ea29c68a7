"""Streaming what the ranks print into the notebook, live, one ``[rank k]`` line at a time.

Each rank's standard output and error go to files in the run directory (see
:mod:`distlab.runtime.worker`); :class:`OutputEcho` reads what is new in them every few
milliseconds and prints complete lines with the rank in front, to ``sys.stdout`` or
``sys.stderr`` like the rank did. A rank that prints without end cannot flood the
notebook: past ``DISTLAB_MAX_OUTPUT_BYTES`` (default 1 MiB per rank and stream) we stop
echoing and say how much was left out.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from distlab.runtime import rundir as files

MAX_OUTPUT_BYTES = int(os.environ.get("DISTLAB_MAX_OUTPUT_BYTES", 1 << 20))


class _Stream:
    def __init__(self, path: Path, rank: int, target: str):
        self.path, self.rank, self.target = path, rank, target
        self.file = None
        self.partial = b""
        self.echoed = 0
        self.dropped = 0

    def pump(self, final: bool) -> None:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")
            except FileNotFoundError:
                return
        budget = MAX_OUTPUT_BYTES - self.echoed
        data = self.file.read(budget) if budget > 0 else b""
        if data:
            self.echoed += len(data)
            self.partial += data
            *lines, self.partial = self.partial.split(b"\n")
            self._print(lines)
        if self.echoed >= MAX_OUTPUT_BYTES:  # over the limit: skip what is new, but count it
            end = os.fstat(self.file.fileno()).st_size
            self.dropped += end - self.file.tell()
            self.file.seek(end)
        if final:
            if self.partial:
                self._print([self.partial])
                self.partial = b""
            if self.dropped:
                self._print([f"... {self.dropped} more bytes of output not shown "
                             f"(limit: DISTLAB_MAX_OUTPUT_BYTES={MAX_OUTPUT_BYTES})".encode()])
            self.file.close()
            self.file = None

    def skip_existing(self) -> None:
        """Start echoing at the end of what the file holds now."""
        try:
            self.file = open(self.path, "rb")
        except FileNotFoundError:
            return
        self.file.seek(0, os.SEEK_END)

    def _print(self, lines) -> None:
        if not lines:
            return
        stream = sys.stdout if self.target == "out" else sys.stderr
        prefix = f"[rank {self.rank}] "
        stream.write("".join(prefix + line.decode(errors="replace") + "\n" for line in lines))
        stream.flush()


class OutputEcho:
    """Echo every rank's new output lines; call :meth:`pump` often, and once with ``final=True``."""

    def __init__(self, run_dir: Path, nprocs: int):
        self.streams = []
        for rank in range(nprocs):
            self.streams.append(_Stream(files.out_file(run_dir, rank), rank, "out"))
            self.streams.append(_Stream(files.err_file(run_dir, rank), rank, "err"))

    def pump(self, final: bool = False) -> None:
        for stream in self.streams:
            stream.pump(final)

    def skip_existing(self) -> None:
        """Echo only what the ranks print from now on (ranks borrowed from a shared pool)."""
        for stream in self.streams:
            stream.skip_existing()

    def mute(self) -> None:
        """Echo nothing (the owner of shared ranks: what they print is shown by the borrowers)."""
        self.streams = []
