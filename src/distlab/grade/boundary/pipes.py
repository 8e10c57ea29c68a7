"""The grader's ends of the clean room's two pipes: the job goes in, the verdict comes out.

A pipe, unlike a file, has no name: only the processes given one of its descriptors can use
it. The grader writes the job (the notebook's cells and the hidden tests) to the clean room's
standard input and reads the verdict from a pipe whose write end only the clean room holds
(see :mod:`distlab.grade.boundary.cleanroom`), so neither ever sits where the student's ranks could
read or write it.
"""

from __future__ import annotations

import os
import subprocess
import threading


def send(proc: subprocess.Popen, data: bytes) -> None:
    """Write ``data`` to the process's standard input and close it (a process that died first: nothing)."""
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # BrokenPipeError among them
        pass


class Reader(threading.Thread):
    """Reads a pipe to its end in the background.

    The grader waits for the clean room to exit; a verdict larger than the pipe's buffer
    (64 KiB on Linux) would block the clean room's write meanwhile, so it is read as it comes.
    """

    def __init__(self, fd: int):
        super().__init__(name="distlab-verdict-reader", daemon=True)
        self.fd, self.chunks = fd, []
        self.start()

    def run(self) -> None:
        with os.fdopen(self.fd, "rb") as pipe:
            while chunk := pipe.read(1 << 16):
                self.chunks.append(chunk)

    def result(self, timeout: float) -> bytes:
        """What was read, once the pipe ended (or ``timeout`` seconds passed)."""
        self.join(timeout)
        return b"".join(self.chunks)
