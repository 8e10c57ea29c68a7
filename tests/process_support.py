"""Finding the processes a test started, and how often the process-tree tests repeat under load."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil

from distlab.runtime import processes


def alive_with_marker(marker: str) -> list[psutil.Process]:
    """Running (non-zombie) processes whose command line holds ``marker``: a test's own children.

    What it finds is killed (by pid: they are the test's), so a failing check leaves nothing
    running into the next test; the caller asserts the list is empty.
    """
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in cmdline and proc.pid != os.getpid():
            found.append(proc)
    for proc in found:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return found


REPEAT_UNDER_LOAD = int(os.environ.get("DISTLAB_REPEAT_UNDER_LOAD", "3"))
"""How many times the process-tree tests run under load (the proof ran them 20 times:
``DISTLAB_REPEAT_UNDER_LOAD=20 pytest -k under_load``)."""


def run_in_own_group(command: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` in a process group of its own,
    which is ended whatever happens.

    ``subprocess.run``'s own timeout kills only the command, and pytest-timeout raises in this
    process without killing anything: either way a launcher's children (torchrun's workers,
    nbgrader's kernel, a book build's kernels and ranks) would run on. Here they all go.
    """
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    # die_with_parent: a test process that is itself killed (CI's time limit, a SIGTERM) takes
    # the command along, instead of leaving it to run on unseen.
    proc = subprocess.Popen(command, text=True, start_new_session=True, preexec_fn=processes.die_with_parent,
                            **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
