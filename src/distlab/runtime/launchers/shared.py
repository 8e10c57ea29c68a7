"""Borrowing warm ranks that another process started: how the book's pages share two pools.

Every executed page of the book runs in a kernel of its own, and a page that starts
``distlab.Pool(nprocs=4)`` would pay a cold start (torchrun, four ranks importing torch: about
5 s on 2 cores) for ranks that the page before it had just thrown away. So the book build
keeps warm pools of 2 and 4 ranks for the whole build (:mod:`distlab.runtime.shared_pools`)
and names their folder in the environment variable :data:`SHARED_POOLS`, which every kernel
it starts inherits. A pool a page starts with default settings *borrows* those ranks instead
of starting its own; nothing else about it changes: same calls, same output, same errors.

Only the owner's own children borrow (the kernels it starts, or forks through a process it
names: the book's kernel template): a process that a page starts itself, like the appendix's
stand-in for a kernel that gets killed, starts its own ranks, as it would outside a build.
Borrowing is safe because of three rules:

1. **One borrower at a time.** The borrower holds an exclusive lock (``flock``) on the pool's
   lock file from the moment it attaches until its pool stops, or its process ends (the
   kernel crashed: the system drops the lock). Whoever cannot get the lock at once starts
   its own ranks, as if there were no shared pool.
2. **Only ranks that can be trusted.** A call that failed, timed out or was interrupted
   leaves a ``broken`` mark, and a call in progress a ``busy`` mark; a borrower that finds
   either (or a dead rank) does not use the ranks, and the owner replaces them.
3. **The owner ends its ranks; a borrower never does.** Stopping a borrowed pool only lets go
   of it (:meth:`BorrowedJob.stop`).

The ranks run each call in the caller's working directory (the ``cwd`` of ``options.json``),
so a page that reads files next to it behaves as it would with ranks of its own.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import psutil

from distlab.runtime import processes
from distlab.runtime import rundir as files
from distlab.runtime.errors import RankError
from distlab.runtime.watcher import Watcher

SHARED_POOLS = "DISTLAB_SHARED_POOLS"
"""Environment variable: the folder where the owner of shared pools publishes them."""

BROKEN = "broken"
"""In a shared pool's run folder: its ranks must not be used again (a call failed or hung)."""
BUSY = "busy"
"""In a shared pool's run folder while a borrower's call runs (left behind if the borrower died mid-call)."""
NEXT_CALL = "next-call"
"""In a shared pool's run folder: the number of the next call (its ranks run call-0, call-1, ...)."""


def lock_file(folder: Path, nprocs: int) -> Path:
    return Path(folder) / f"pool-{nprocs}.lock"


def info_file(folder: Path, nprocs: int) -> Path:
    """``{"run_dir", "agent_pid", "parents"}`` of the shared pool of ``nprocs`` ranks, once it is ready."""
    return Path(folder) / f"pool-{nprocs}.json"


def try_lock(path: Path) -> int | None:
    """An open descriptor holding the exclusive lock on ``path``, or ``None`` if someone holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def healthy(run_dir: Path, nprocs: int, agent_pid: int) -> bool:
    """Are these ranks fit for a call: not marked, launcher and every rank alive?"""
    if (run_dir / BROKEN).exists() or (run_dir / BUSY).exists():
        return False
    pids = [agent_pid] + [files.read_pid(run_dir, rank) for rank in range(nprocs)]
    return all(pid is not None and _alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        return bool(processes.alive([psutil.Process(pid)]))
    except psutil.Error:   # no such process
        return False


def borrow(nprocs: int, backend, threads, launcher: str, start_setup: list) -> "BorrowedJob | None":
    """The shared pool of ``nprocs`` ranks, if one is published by our parent, free, healthy and
    asked for with these settings (the defaults: only default pools are shared); else ``None``."""
    folder = os.environ.get(SHARED_POOLS)
    if not folder or (backend, threads, launcher, list(start_setup)) != (None, None, "auto", []):
        return None
    if not lock_file(folder, nprocs).exists():
        return None
    fd = try_lock(lock_file(folder, nprocs))
    if fd is None:
        return None
    try:
        info = json.loads(info_file(folder, nprocs).read_text())
        run_dir = Path(info["run_dir"])
        if os.getppid() not in info["parents"] or not healthy(run_dir, nprocs, info["agent_pid"]):
            unlock(fd)
            return None
    except (OSError, ValueError, KeyError):
        unlock(fd)
        return None
    return BorrowedJob(run_dir, nprocs, info["agent_pid"], fd)


class _AgentByPid:
    """The owner's launcher process, seen from a borrower: alive or not (it is not our child)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        return None if _alive(self.pid) else -1


class BorrowedJob:
    """A job over ranks another process started: calls like :class:`~.local.LocalJob`, stops by letting go."""

    def __init__(self, run_dir: Path, nprocs: int, agent_pid: int, lock_fd: int):
        self.run_dir, self.nprocs, self.lock_fd = run_dir, nprocs, lock_fd
        self.watcher = Watcher(run_dir, nprocs, _AgentByPid(agent_pid), self._explain_end, ranks_here=True)
        self.watcher.echo.skip_existing()   # what earlier borrowers' calls printed is not ours to show
        self.next_call = self._first_free_call()

    def _first_free_call(self) -> int:
        try:
            index = int((self.run_dir / NEXT_CALL).read_text())
        except (OSError, ValueError):
            index = 0
        while files.call_dir(self.run_dir, index).exists():  # a call whose borrower died before counting it
            index += 1
        return index

    def wait(self, call_dir: Path, timeout: float) -> list:
        """Watch one call (the pool wrote its files into ``call_dir``); return the results."""
        __tracebackhide__ = True  # noqa: F841
        files.write_atomically(self.run_dir / BUSY, b"")
        index = int(Path(call_dir).name.rsplit("-", 1)[1])
        files.write_atomically(self.run_dir / NEXT_CALL, str(index + 1).encode())
        try:
            results = self.watcher.wait(timeout, call_dir)
        except RankError:
            if self.watcher.ranks_can_go_on():   # every rank finished the call (see Pool.run): still fit
                (self.run_dir / BUSY).unlink()
            raise
        (self.run_dir / BUSY).unlink()
        return results

    def stop(self, gracefully: bool | None = None) -> None:
        """Let go of the ranks; after a call that did not succeed, mark them broken for the owner."""
        if self.lock_fd is None:
            return
        if (self.run_dir / BUSY).exists():   # the last call failed, hung or was interrupted
            files.write_atomically(self.run_dir / BROKEN, b"")
        self.watcher.echo.pump(final=True)
        unlock(self.lock_fd)
        self.lock_fd = None

    def _explain_end(self, dead: list[int]) -> Exception:
        rank = (dead or self.watcher.missing() or [0])[0]
        return RankError(rank, "ProcessExited",
                         f"the process of rank {rank} of the build's shared warm pool ended before returning a "
                         "result or raising", "", None, {})
