"""``distlab.Pool``: keep N ranks alive between calls, so a cell costs milliseconds, not seconds.

A cold :func:`distlab.run` pays for torchrun and for every rank importing torch (~4 s for 2
ranks, ~7 s for 4 on 2 cores). A pool pays that once::

    with distlab.Pool(nprocs=4) as pool:     # ranks start here, once
        pool.run(step, batch)                # each call: a few milliseconds of overhead
        distlab.run(step, batch, nprocs=4)   # same thing: run() uses an active pool of that size

or, in a notebook, ``%distributed start -n 4`` at the top and ``%distributed stop`` at the end.

Each call behaves like :func:`distlab.run`: live ``[rank k]`` output, :class:`RankError`,
:class:`DistTimeout` (its clock starts at the call, since the ranks are already up). A call
that raised on some ranks and returned on the others, every rank outside any distributed
call, leaves the ranks as fit as a success does, and they stay (a typo costs no restart).
After any other failure (a rank blocked in a collective, one that died, a timeout) the ranks
are stopped: a process group that lost a collective halfway cannot be trusted. So are ranks
whose network the relay's router stopped (a rank passed one of its caps), even when every rank
caught that and returned: their links to the router stay broken. The next call then starts
fresh ranks by itself and says so.

Between calls, each rank puts back what :mod:`distlab.runtime.isolation` lists (patched torch
functions, torch settings) and re-seeds its random generators; modules stay imported and
the process group stays up. The grader keeps one pool per notebook it grades.

While the book builds, a pool with default settings borrows warm ranks that the build
shares between its pages instead of starting its own (:mod:`distlab.runtime.launchers.shared`).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import shutil
import sys
import time
from pathlib import Path

from distlab.runtime import launchers, options, serialize
from distlab.runtime import rundir as files
from distlab.runtime.errors import DistTimeout, RankError
from distlab.runtime.launchers import shared

START_TIMEOUT = 180.0
"""Seconds the ranks of a pool may take to start (4 ranks importing torch on 2 busy cores)."""

_active: dict[tuple, "Pool"] = {}   # (nprocs, backend) -> the pool distlab.run uses for that many ranks
_no_pools = contextvars.ContextVar("distlab_no_pools", default=False)


class Pool:
    """N ranks started once and reused by every :meth:`run` until :meth:`stop`."""

    def __init__(self, nprocs: int = 2, backend: str | None = None, threads: int | None = None,
                 launcher: str = "auto", start_setup: list[dict] | None = None):
        """``start_setup``: :func:`distlab.runtime.options.rank_setup` steps with ``when="start"`` or
        ``"joined"`` that the ranks run once (the grader's resource caps, its private rooms).
        :func:`distlab.run` inside ``rank_setup`` blocks uses this pool only if their once-only
        steps are exactly these."""
        options.check_arguments(print, nprocs, 1.0, backend, threads)
        self.nprocs, self.backend, self.threads, self.launcher = nprocs, backend, threads, launcher
        self.start_setup = list(start_setup or [])
        if any(step.get("when") not in options.ONCE for step in self.start_setup):
            raise ValueError("a pool's start_setup holds only steps with when='start' or 'joined'")
        self.started_at: float | None = None
        self.job = None
        self.run_dir: Path | None = None
        self.calls = 0
        self.borrowed = False   # ranks of the book build's shared pool: never ours to end
        self.restart_reason: str | None = None
        atexit.register(self.stop)  # the kernel shuts down: stop the ranks (a killed kernel: see processes.py)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> "Pool":
        """Start the ranks (if not running) and wait until they are ready for calls."""
        if self.job is not None:
            return self
        self.job = shared.borrow(self.nprocs, self.backend, self.threads, self.launcher, self.start_setup)
        if self.job is not None:
            self.borrowed, self.run_dir, self.calls = True, self.job.run_dir, self.job.next_call
            self.started_at = time.monotonic()
            return self
        self.borrowed = False
        self.run_dir = files.new_run_dir("pool")
        options.write_options(self.run_dir, seed=0, setup=self.start_setup)
        self.calls = 0
        self.started_at = time.monotonic()
        try:
            job_class = launchers.choose(self.launcher, self.backend)
            self.job = job_class(self.run_dir, self.nprocs, START_TIMEOUT, self.backend, self.threads, pool=True)
            self.job.wait_until_ready(START_TIMEOUT)
        except BaseException:
            self._discard()
            raise
        return self

    def stop(self, gracefully: bool = True) -> None:
        """Stop the ranks and remove the pool's files. Safe to call twice.

        ``gracefully``: idle ranks first leave by themselves (up to ~2 s); otherwise they are
        ended at once (the grader, which throws the ranks away anyway, does not wait).
        Either way it returns once every process the pool started is gone.
        """
        self._discard(gracefully)
        if _active.get(self._key) is self:
            del _active[self._key]

    def _discard(self, gracefully: bool = False) -> None:
        job, self.job = self.job, None
        try:
            if job is not None:
                job.stop(gracefully=gracefully)
        finally:
            if self.run_dir is not None and not self.borrowed:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def activate(self) -> "Pool":
        """Start the pool and make :func:`distlab.run` use it for runs with ``nprocs`` ranks."""
        self.start()
        old = _active.get(self._key)
        if old is not None and old is not self:
            old.stop()
        _active[self._key] = self
        return self

    def __enter__(self) -> "Pool":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def _key(self) -> tuple:
        """Where :func:`distlab.run` finds it: one active pool per size and backend (gloo's and the
        relay's pools of the same size serve different runs)."""
        return (self.nprocs, self.backend)

    @property
    def running(self) -> bool:
        return self.job is not None

    # -- calls ----------------------------------------------------------------------------------

    def run(self, fn, *args, timeout: float = 60.0, seed: int = 0, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank of the pool; same contract as :func:`distlab.run`."""
        __tracebackhide__ = True  # noqa: F841
        options.check_arguments(fn, self.nprocs, timeout, self.backend, self.threads)
        blob = serialize.dumps_call(fn, args, kwargs)
        if self.job is None:
            if self.restart_reason:
                print(f"distlab: starting fresh ranks for this pool ({self.restart_reason})", file=sys.stderr)
                self.restart_reason = None
            self.start()
        call_dir = files.call_dir(self.run_dir, self.calls)
        call_dir.mkdir()
        self.calls += 1
        (call_dir / files.PAYLOAD).write_bytes(blob)
        options.write_options(call_dir, seed, options.current_rank_setup("call"),  # last: "go"
                              cwd=os.getcwd() if self.borrowed else None)   # borrowed ranks started elsewhere
        files.share_call(self.run_dir, call_dir)   # ranks in private rooms see only their own copy
        try:
            results = self.job.wait(call_dir, timeout)
        except RankError:
            network_stopped = self._network_stopped()
            if self.job.watcher.ranks_can_go_on() and not network_stopped:   # keep them
                files.remove_call(self.run_dir, call_dir)
                raise
            self.restart_reason = network_stopped or \
                "the previous call failed, and a process group that lost a collective cannot be trusted"
            self._discard()
            raise
        except DistTimeout:
            self.restart_reason = "the previous call timed out, and a process group that lost a collective cannot be trusted"
            self._discard()
            raise
        except BaseException:  # KeyboardInterrupt, or anything unexpected: the ranks are mid-call
            self.restart_reason = "the previous call was interrupted"
            self._discard()
            raise
        files.remove_call(self.run_dir, call_dir)
        network_stopped = self._network_stopped()
        if network_stopped:         # the ranks caught the router's verdict and returned
            self.restart_reason = network_stopped
            self._discard()
        return results

    def _network_stopped(self) -> str | None:
        """Why the relay's router stopped this pool's network, or ``None`` (not stopped, or not on
        the relay). A router stops for good when a rank passes one of its caps
        (:mod:`distlab.relay.holdings`): every rank's link to it is broken from then on, so the
        next call needs fresh ranks, however cleanly the ranks left this one."""
        stopped = getattr(getattr(self.job, "router", None), "stopped", None)
        return f"the grader's network stopped the previous call: {stopped}" if stopped else None


def active_pool(nprocs: int, backend, threads, launcher: str) -> Pool | None:
    """The active pool that can serve a :func:`distlab.run` with these settings, if any.

    Settings include the start-time steps of the enclosing ``rank_setup`` blocks: ranks that
    started without the grader's caps never serve a run that asks for them.
    """
    if _no_pools.get():
        return None
    pool = _active.get((nprocs, backend))
    if pool is None or pool.launcher != launcher:
        return None
    if threads != pool.threads:
        return None
    if options.current_rank_setup(*options.ONCE) != pool.start_setup:
        return None
    return pool


def active_pools() -> dict:
    """``{nprocs: pool}`` of the pools :func:`distlab.run` uses now (``{(nprocs, backend): pool}`` for
    a pool with a backend named, such as the relay's)."""
    return {(n if backend is None else (n, backend)): p for (n, backend), p in _active.items()}


def start_pool(nprocs: int = 2, **options) -> Pool:
    """Start a pool of ``nprocs`` ranks and make :func:`distlab.run` use it (what ``%distributed start`` does)."""
    return Pool(nprocs, **options).activate()


def stop_pools() -> None:
    """Stop every active pool (what ``%distributed stop`` does)."""
    for pool in list(_active.values()):
        pool.stop()


@contextlib.contextmanager
def fresh_processes():
    """Inside this block, :func:`distlab.run` ignores active pools and starts fresh ranks (the grader's choice)."""
    token = _no_pools.set(True)
    try:
        yield
    finally:
        _no_pools.reset(token)

