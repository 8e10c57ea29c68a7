"""The demo's read-only git mirror: the student edition of the repository, served by ``git daemon``.

Part of the demo course (hub/demo.py). The compute nodes have no internet, so the students'
servers fetch the book's repository (nbgitpuller, the launch links) from this mirror on
127.0.0.1; git's ``insteadOf`` rewrites the public address the links name.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from distlab.grade.author import edition

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from demo_processes import _answers, _end, _wait_for  # noqa: E402


def student_edition(served: Path) -> None:
    """The student edition (:mod:`distlab.grade.author.edition`, what the course publishes), as a bare
    repository for ``git daemon``: one commit with no parent, none of INSTRUCTOR_ONLY in it."""
    edition.write(served, REPO, bare=True)


@contextlib.contextmanager
def git_mirror(run_dir: Path, port: int, address: str = "127.0.0.1"):
    """Serve the student edition read-only at git://address:port/distlab (and on 127.0.0.1); address:
    where the cluster's nodes reach this machine."""
    served = run_dir / "git"
    student_edition(served / "distlab")
    daemon = subprocess.Popen(["git", "daemon", "--export-all", f"--base-path={served}", "--listen=127.0.0.1",
                               *([f"--listen={address}"] if address != "127.0.0.1" else []), f"--port={port}", "--reuseaddr", "--informative-errors", str(served / "distlab")],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        _wait_for(lambda: _answers(port), 15, "git daemon did not listen", daemon)
        yield f"git://{address}:{port}/distlab"
    finally:
        _end(daemon)
