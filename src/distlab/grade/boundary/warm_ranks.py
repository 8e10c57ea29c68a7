"""The clean room's warm ranks: one pool per world size (and backend) for the tests of one notebook.

Split from :mod:`distlab.grade.boundary.cleanroom`, which uses them: a notebook's tests make a dozen runs,
and a cold run pays seconds of starting ranks each time.
"""

from __future__ import annotations

import time

LAUNCHER = "fork"
"""How the clean room starts its ranks: forked from one process that imported torch once
(:mod:`distlab.runtime.launchers.forked`). A notebook's ranks serve only its own tests and are
thrown away after it, so a class of N notebooks starts 2N pools: with torchrun each rank would
import torch again (a 4-rank pool: ~13 s of CPU instead of ~3 s, measured side by side by
``benchmarks/launch.py``). The agents themselves are spares the clean room forks before it
reads its job (:mod:`distlab.runtime.launchers.spares`): a pool then starts without a new
Python importing torch (``benchmarks/launch.py``, 4 ranks on 2 loaded cores: 0.52 s and 0.21 s
of CPU per launch instead of 4.7 s and 2.1 s)."""


class WarmRanks:
    """One warm :class:`distlab.Pool` per world size, for the tests of one notebook.

    A cold run pays seconds of starting ranks; a notebook's tests make a dozen runs. The pools
    start with the instructor's caps (``start_steps``) and each call still runs under the
    guard. Between calls the ranks put back what :mod:`distlab.runtime.isolation` watches. A
    call that times out, or fails with a rank inside a collective, ends its pool (see
    :class:`distlab.Pool`) and the next call gets new ranks; a blank answer that raises
    ``NotImplementedError`` on every rank keeps them. A pool older than half the ranks'
    wall-clock cap is replaced before it could run into that cap.
    """

    def __init__(self, start_steps: list[dict], max_age_s: float):
        self.start_steps, self.max_age_s = start_steps, max_age_s
        self.pools: dict = {}      # nprocs -> pool, on gloo (or NCCL)
        self.relayed: dict = {}    # nprocs -> pool, on the grader's relay (distlab.relay)

    def ready(self, nprocs: int, backend: str | None = None) -> None:
        from distlab.runtime.pool import Pool

        pools = self.relayed if backend == "relay" else self.pools
        pool = pools.get(nprocs)
        if pool is not None and pool.running and time.monotonic() - pool.started_at < self.max_age_s:
            return
        if pool is not None:
            pool.stop(gracefully=False)
        pools[nprocs] = Pool(nprocs, backend=backend, start_setup=self.start_steps, launcher=LAUNCHER).activate()

    def smallest_running(self) -> int:
        """The smallest world size with warm ranks (1 if none): where a one-off run costs least."""
        return min((n for n, pool in self._all() if pool.running), default=1)

    def backend_of_smallest(self) -> str | None:
        """The backend of that smallest warm pool (None: gloo's, or no pool yet)."""
        running = [(n, pool.backend or "") for n, pool in self._all() if pool.running]
        return (min(running)[1] or None) if running else None

    def _all(self) -> list:
        return list(self.pools.items()) + list(self.relayed.items())

    def stop(self) -> None:
        for _, pool in self._all():
            pool.stop(gracefully=False)
