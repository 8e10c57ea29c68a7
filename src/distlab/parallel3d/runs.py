"""Training several layouts of the same ranks from a notebook, and summarising each run.

:func:`run_layouts` starts ``nprocs`` ranks once and trains every layout on them in turn
(from scratch, :mod:`.train`, or with torch's tools, :mod:`.torch_train`); each comes back as
a :class:`LayoutRun`: the loss curve, the step time, and per rank the bytes held and sent.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from distlab.parallel3d.mesh import Grid
from distlab.parallel3d.torch_train import train_torch
from distlab.parallel3d.train import train

ENGINES = {"distlab": train, "torch": train_torch}


@dataclass
class LayoutRun:
    """One layout's run, summarised over its ranks."""

    grid: Grid
    engine: str
    losses: list[float]                   # full-batch loss before each step
    seconds: float                        # median step time (slowest rank)
    bytes: list[dict] = field(default_factory=list)   # per rank: parameters, gradients, optimizer, total
    sent: list[dict] = field(default_factory=list)    # per rank: bytes sent in a step, by axis
    calls: list[dict] = field(default_factory=list)   # per rank: calls by op (by axis for distlab)
    ranks: list[dict] = field(default_factory=list)   # everything ``train`` returned, per rank


def _train_each(layouts: dict, engine: str, kwargs: dict) -> dict:
    return {name: ENGINES[engine](grid, **kwargs) for name, grid in layouts.items()}


def run_layouts(layouts: dict[str, Grid], nprocs: int, engine: str = "distlab", timeout: float = 300,
                **kwargs) -> dict[str, LayoutRun]:
    """Train each layout in turn, in one launch of ``nprocs`` ranks; ``kwargs`` go to the engine's ``train``.

    ::

        runs = run_layouts({"dp4": Grid(dp=4), "tp4": Grid(tp=4), "dp2 x tp2": Grid(dp=2, tp=2)}, nprocs=4)
        runs["tp4"].losses, runs["tp4"].bytes[0], runs["tp4"].sent[0]
    """
    from distlab.runtime.run import run

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    for grid in layouts.values():
        grid.check(nprocs)
    per_rank = run(_train_each, layouts, engine, kwargs, nprocs=nprocs, timeout=timeout)
    out = {}
    for name, grid in layouts.items():
        ranks = [r[name] for r in per_rank]
        out[name] = LayoutRun(grid=grid, engine=engine, losses=ranks[0]["losses"],
                              seconds=statistics.median(ranks[0]["seconds"]),
                              bytes=[r["bytes"] for r in ranks], sent=[r["sent"] for r in ranks],
                              calls=[r["calls"] for r in ranks], ranks=ranks)
    return out
