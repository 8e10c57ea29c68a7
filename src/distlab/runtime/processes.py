"""Keeping the processes we start on a leash, and ending exactly those, all of them.

Two rules, because a login node or a JupyterHub server is shared with other people:

* We only ever signal processes we started ourselves, by process id or by the process group
  we created for them, never by name (``pkill -f torchrun`` would kill other users' jobs).
* Nothing we start may outlive the run. torchrun puts every worker in a session of its own,
  so killing torchrun does not reach the workers, and a rank's own children may start
  sessions of their own too. Three Linux features keep the whole tree in reach:

  1. the *parent-death signal* (``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`): the
     kernel sends SIGKILL to torchrun when the notebook process dies, and to each rank when
     torchrun dies;
  2. the *child subreaper* flag (``prctl(PR_SET_CHILD_SUBREAPER)``, :func:`become_subreaper`),
     set on torchrun and on every rank: a process whose parent dies is re-parented to the
     nearest subreaper above it instead of to ``init``, so what a rank started (even in a new
     session, even after the rank died) stays below torchrun, where we can find it;
  3. :class:`ProcessTree`: the launcher remembers every process it has seen below torchrun
     (it looks again whenever a rank ends), and at the end of a run signals them, SIGTERM
     first and SIGKILL shortly after, and *waits until every one of them is gone*, with a
     bound. A run returns or raises only then.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

END_BOUND_SECONDS = 10.0
"""The longest :meth:`ProcessTree.end` waits for killed processes to be gone (a SIGKILLed
process on a loaded machine takes milliseconds, rarely a second, to disappear)."""


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(option, int(value), 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent process dies.

    It survives ``exec``, so calling it in a ``preexec_fn`` covers the program started there.
    (On other systems this is a no-op; :class:`ProcessTree` still ends everything on every exit path.)
    """
    _prctl(_PR_SET_PDEATHSIG, sig)


def become_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it, not to ``init`` (Linux; else False).

    The flag survives ``exec`` (set it in a ``preexec_fn``), and is not inherited by children.
    """
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def leash(subreaper: bool = True) -> None:
    """``preexec_fn`` of a launcher's agent (torchrun, srun): dies with us, adopts its orphans."""
    die_with_parent()
    if subreaper:
        become_subreaper()


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


def alive(procs) -> list[psutil.Process]:
    """The processes among ``procs`` still running (a zombie has ended: it only awaits its parent)."""
    found = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _signal_groups_and_processes(procs, sig: int) -> None:
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


def _wait_gone(procs, seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while True:
        left = alive(procs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


class ProcessTree:
    """Every process seen below some roots (an agent and its ranks), ended together at the end.

    ``remember()`` adds what is below the roots now: call it whenever a process of the tree
    may be about to end (its orphans are re-parented to the nearest subreaper, which may be
    gone a moment later). :meth:`end` ends everything remembered and everything below the
    roots now, and returns only when all of it is gone or ``bound`` seconds have passed.
    """

    def __init__(self, roots=()):
        self.roots: list[int] = list(roots)
        self.seen: dict[int, psutil.Process] = {}

    def add_root(self, pid: int) -> None:
        if pid not in self.roots:
            self.roots.append(pid)

    def remember(self) -> None:
        """Add every process below the roots and below what was seen before (still running)."""
        handles = []
        for pid in self.roots:               # our own children: their pids are ours until we reap them
            try:
                handles.append(psutil.Process(pid))
            except psutil.Error:
                continue
        for proc in handles + list(self.seen.values()):
            try:
                if not proc.is_running():    # gone (is_running also catches a pid reused by another process)
                    continue
                self.seen.setdefault(proc.pid, proc)
                for child in proc.children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:
                continue

    def end(self, grace: float = 0.5, bound: float = END_BOUND_SECONDS) -> list[psutil.Process]:
        """SIGTERM, then SIGKILL after ``grace`` s, every process of the tree; wait until all are gone.

        Returns the processes still alive after ``bound`` seconds (normally none).
        """
        deadline = time.monotonic() + bound
        self.remember()
        procs = list(self.seen.values())
        _signal_groups_and_processes(procs, signal.SIGTERM)
        if not _wait_gone(procs, grace):
            return []
        while time.monotonic() < deadline:
            self.remember()              # a process may have started children after the first look
            procs = alive(self.seen.values())
            if not procs:
                return []
            _signal_groups_and_processes(procs, signal.SIGKILL)
            _wait_gone(procs, min(0.2, max(0.0, deadline - time.monotonic())))
        return alive(self.seen.values())


def end_processes(procs, grace: float = 1.0) -> None:
    """SIGTERM the processes (and the groups they lead), SIGKILL what is left after ``grace`` s,
    and wait (bounded) until they and their descendants are gone."""
    tree = ProcessTree(p.pid for p in procs)
    tree.seen.update({p.pid: p for p in procs})
    tree.end(grace)
