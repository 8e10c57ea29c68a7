"""Keeping the processes we start on a leash, and ending exactly those.

Two rules, because a login node or a JupyterHub server is shared with other people:

* We only ever signal processes we started ourselves, by process id or by the process group
  we created for them, never by name (``pkill -f torchrun`` would kill other users' jobs).
* Nothing we start may outlive us. torchrun puts every worker in a session of its own, so
  killing torchrun does not reach the workers. We therefore (1) ask the kernel to send
  SIGKILL to torchrun when the notebook process dies and to each worker when torchrun dies
  (Linux's "parent-death signal", ``prctl(PR_SET_PDEATHSIG)``), and (2) on every normal,
  failing or interrupted exit, signal each worker's process group ourselves: SIGTERM first,
  SIGKILL for whatever is still there shortly after.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import psutil

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent process dies.

    It survives ``exec``, so calling it in a ``preexec_fn`` covers the program started there.
    (On other systems this is a no-op; :func:`end_processes` still runs on every exit path.)
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def snapshot(pids) -> list[psutil.Process]:
    """The live processes among ``pids`` and all their descendants, as psutil handles.

    psutil remembers each process's start time, so signalling a handle later can never hit
    an unrelated process that happened to reuse the same pid.
    """
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found[proc.pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            continue
    return list(found.values())


def _signal_groups_and_processes(procs: list[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process and to the process group it leads (if it leads one)."""
    for proc in procs:
        try:
            if not proc.is_running():
                continue
            if os.getpgid(proc.pid) == proc.pid:  # a group leader we created: take its group
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def end_processes(procs: list[psutil.Process], grace: float = 1.0) -> None:
    """SIGTERM the processes (and the groups they lead), then SIGKILL any left after ``grace`` s."""
    _signal_groups_and_processes(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(procs):
            return
        time.sleep(0.02)
    # A process may have started children after the first snapshot: take them too.
    left = snapshot(p.pid for p in _alive(procs)) + _alive(procs)
    _signal_groups_and_processes(left, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _alive(left):
        time.sleep(0.02)
