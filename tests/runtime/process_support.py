"""Finding the processes a test started, and how often the process-tree tests repeat under load."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil


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


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid`` now (none once it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def named(procs, text: str) -> list[psutil.Process]:
    """The processes among ``procs`` whose command line holds ``text``."""
    found = []
    for proc in procs:
        try:
            if text in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


REPEAT_UNDER_LOAD = int(os.environ.get("DISTLAB_REPEAT_UNDER_LOAD", "3"))
"""How many times the process-tree tests run under load (the proof ran them 20 times:
``DISTLAB_REPEAT_UNDER_LOAD=20 pytest -k under_load``)."""


GUARDIAN = """
import ctypes, os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))   # the whole group, itself too
ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG: SIGTERM when the test process dies
if os.getppid() == 1:   # it died before we could ask
    os.killpg(0, signal.SIGKILL)
sys.exit(subprocess.call(sys.argv[1:]))
"""
"""Runs a command in its own process group and ends the whole group when the test process
dies. Linux's parent-death signal reaches only a process's own child: ``make book`` would die
with a killed test run, but the jupyter-book it started (and that one's kernels and ranks)
would build on for twenty minutes."""


def run_in_own_group(command: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` in a process group of its own,
    which is ended whatever happens.

    ``subprocess.run``'s own timeout kills only the command, and pytest-timeout raises in this
    process without killing anything: either way a launcher's children (torchrun's workers,
    nbgrader's kernel, a book build's kernels and ranks) would run on. Here they all go, and
    when this test process is itself killed (CI's time limit, a SIGTERM that skips every
    ``finally``), :data:`GUARDIAN` ends the group.
    """
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    proc = subprocess.Popen([sys.executable, "-c", GUARDIAN, *command], text=True, start_new_session=True,
                            **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
