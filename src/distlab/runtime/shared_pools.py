"""Warm pools one process keeps for every kernel it starts: the book build's, page after page.

The owner (book/_ext/distlab_book.py, for the length of a build) starts a pool of each size
once, publishes it in a folder named by ``DISTLAB_SHARED_POOLS``, and before each page looks
whether the ranks are still fit (a page's call may have failed or hung on them): unfit ranks
are ended and replaced. The kernels borrow them (:mod:`distlab.runtime.launchers.shared`)::

    with SharedPools(sizes=(2, 4)) as shared:   # ranks start here, once
        ... run kernels; each distlab.Pool(nprocs=4) borrows the warm ranks ...
        shared.refresh()                          # between two kernels: replace unfit ranks

A borrower that finds the ranks busy, locked or unfit starts its own, so sharing can only
save time, never change what a page computes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from distlab.runtime import rundir as files
from distlab.runtime.launchers import shared
from distlab.runtime.pool import Pool

LOCK_WAIT = 10.0
"""Seconds the owner waits for a borrower to let go before it leaves the ranks as they are."""


class SharedPools:
    """Pools of ``sizes`` ranks that the kernels this process starts borrow (see the module)."""

    def __init__(self, sizes=(2, 4), parents=()):
        self.sizes = tuple(sizes)
        # Whose children may borrow: ours (the kernels we start), and those of ``parents``
        # (the book build forks its kernels from a template process: they are its children).
        self.parents = [os.getpid(), *parents]
        self.folder: Path | None = None
        self.pools: dict[int, Pool] = {}
        self.restarts = 0
        self.calls_served = 0   # by ranks already replaced or stopped; see :meth:`calls`
        self._saved_variable: str | None = None

    def start(self) -> "SharedPools":
        """Start every pool and publish them to the kernels started from now on.

        Call :meth:`start` and :meth:`refresh` from a thread that lives as long as the pools
        (the main thread): a launcher dies with the thread that started it
        (:func:`distlab.runtime.processes.leash`), not only with the process."""
        if self.folder is not None:
            return self
        self.folder = Path(tempfile.mkdtemp(prefix="distlab-shared-"))
        self._saved_variable = os.environ.pop(shared.SHARED_POOLS, None)  # ours are not borrowed from elsewhere
        for nprocs in self.sizes:
            self._start_one(nprocs)
        os.environ[shared.SHARED_POOLS] = str(self.folder)
        return self

    def add(self, nprocs: int) -> None:
        """Share a pool of ``nprocs`` ranks too, from now on (a page wants a size the others do not)."""
        if self.folder is not None and nprocs not in self.sizes:
            self.sizes += (nprocs,)
            self._start_one(nprocs)

    def _start_one(self, nprocs: int) -> None:
        """Start the pool of ``nprocs`` ranks and publish it; a pool that cannot start is not published.

        The lock is held meanwhile: no kernel borrows half-started ranks, and the pool's own
        :meth:`Pool.start` cannot borrow from the folder it is being started for."""
        fd = _lock(shared.lock_file(self.folder, nprocs))
        if fd is None:
            return
        try:
            pool = Pool(nprocs)
            try:
                pool.start()
            except Exception:   # the kernels start their own ranks, as without sharing
                return
            pool.job.watcher.echo.mute()   # what the ranks print belongs to the borrowers' cells
            self.pools[nprocs] = pool
            info = {"run_dir": str(pool.run_dir), "agent_pid": pool.job.agent.pid, "parents": self.parents}
            files.write_atomically(shared.info_file(self.folder, nprocs), json.dumps(info).encode())
        finally:
            shared.unlock(fd)

    def refresh(self) -> None:
        """Replace the ranks a borrower left unfit (a failed or hung call, a rank that died)."""
        for nprocs in self.sizes:
            pool = self.pools.get(nprocs)
            if pool is not None and pool.running and \
                    shared.healthy(pool.run_dir, nprocs, pool.job.agent.pid):
                continue
            fd = _lock(shared.lock_file(self.folder, nprocs))
            if fd is None:
                continue
            try:
                shared.info_file(self.folder, nprocs).unlink(missing_ok=True)
                if pool is not None:
                    self.calls_served += _calls(pool)
                    pool.stop(gracefully=False)
                    self.restarts += 1
            finally:
                shared.unlock(fd)
            self._start_one(nprocs)

    def stop(self) -> None:
        """End every shared rank, unpublish the pools, remove the folder. Safe to call twice."""
        if self.folder is None:
            return
        for pool in list(self.pools.values()):
            self.calls_served += _calls(pool)
            pool.stop(gracefully=False)
        self.pools.clear()
        if self._saved_variable is None:
            os.environ.pop(shared.SHARED_POOLS, None)
        else:
            os.environ[shared.SHARED_POOLS] = self._saved_variable
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def calls(self) -> int:
        """How many calls the kernels ran on the shared ranks so far (a measure of what sharing saved)."""
        return self.calls_served + sum(_calls(pool) for pool in self.pools.values())

    def __enter__(self) -> "SharedPools":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _lock(path: Path, wait: float = LOCK_WAIT) -> int | None:
    """The lock on ``path``, waiting up to ``wait`` seconds for a borrower to let go."""
    deadline = time.monotonic() + wait
    while True:
        fd = shared.try_lock(path)
        if fd is not None or time.monotonic() > deadline:
            return fd
        time.sleep(0.05)


def _calls(pool: Pool) -> int:
    """Calls borrowers ran on this pool's ranks (they number them in its ``next-call`` file)."""
    try:
        return int((pool.run_dir / shared.NEXT_CALL).read_text())
    except (OSError, ValueError, TypeError):
        return 0
