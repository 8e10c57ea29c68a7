"""``state-<rank>.json``: what a rank is doing, written so that it costs the rank almost nothing.

The launcher reads a rank's state file only when something is wrong (a timeout: "rank 2 is
blocked in recv(float32[4], from rank 1) for 30.0 s"), but the rank changes state at every
distributed call: twice per call, thousands of times a second in a ring all-reduce. Writing a
file each time (open, write, rename) costs about a millisecond, which on a busy machine made
every ``dist.all_reduce(..., async_op=True)`` take 4 ms instead of 0.1 ms.

So a rank keeps its latest state in memory (:meth:`RankState.soon`, a few hundred
nanoseconds), and a background thread writes it only once it has *settled*: unchanged for
``settle`` seconds. A rank that hangs in a call keeps one state forever, so its file says so
within ``2 * settle`` seconds (``IDLE_PAUSE + settle`` after an idle spell, when the thread
looks less often); a rank racing through calls writes nothing. Changes the
launcher waits for (starting, ready, returned) are written at once (:meth:`RankState.now`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from distlab.runtime import rundir as files

IDLE_PAUSE = 0.5
"""Seconds between looks while nothing changes: a hang that follows a long idle is on file
within about ``IDLE_PAUSE + settle`` seconds (a timeout reads it seconds later)."""


class RankState:
    """This rank's state file: :meth:`now` writes at once, :meth:`soon` once the state settles."""

    def __init__(self, run_dir: Path, rank: int, settle: float = 0.1):
        self.run_dir, self.rank, self.settle = run_dir, rank, settle
        self._lock = threading.Lock()
        self._latest = None        # a dict, or a function that makes one (built only if written)
        self._version = 0          # bumped at every change
        self._written = 0          # the version on disk
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.start_thread()
        RankState.current = self

    current: "RankState | None" = None
    """The state of this process's rank (the worker makes one)."""

    def start_thread(self) -> None:
        """Start the thread that writes settled states (again, after :meth:`stop_thread`)."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._write_settled, args=(self._stopped,),
                                        name="distlab-rank-state", daemon=True)
        self._thread.start()

    def stop_thread(self) -> None:
        """End the writing thread and wait for it; until :meth:`start_thread`, only :meth:`now`
        writes. (A rank entering its private room restarts it from inside, see
        :mod:`distlab.grade.boundary.rank_room`: a thread keeps the namespaces it started in.)"""
        self._stopped.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def now(self, state: dict) -> None:
        """Record ``state`` and write it before returning."""
        with self._lock:
            self._version += 1
            self._latest = state
            self._write()

    def soon(self, make_state) -> None:
        """Record the state ``make_state()`` returns; it is built and written only if it settles."""
        with self._lock:
            self._version += 1
            self._latest = make_state

    def _write(self) -> None:
        state = self._latest() if callable(self._latest) else self._latest
        files.write_state(self.run_dir, self.rank, state)
        self._written = self._version

    def _write_settled(self, stopped: threading.Event) -> None:
        seen = 0
        pause = self.settle
        while not stopped.wait(pause):
            with self._lock:
                if self._version == seen and self._written != seen:
                    try:
                        self._write()
                    except OSError:     # the run directory is gone: the run is over, and so is this thread
                        return
                # Nothing changing (a warm rank waiting for its next call): look less often, up to
                # IDLE_PAUSE, so that idle ranks cost no CPU; any change brings back `settle`.
                pause = self.settle if self._version != seen else min(2 * pause, max(self.settle, IDLE_PAUSE))
                seen = self._version
