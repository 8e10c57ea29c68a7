"""Choosing a layout: every layout priced, and the usual decision procedure, step by step.

Does it fit with plain data parallelism? If not, shard the model states (ZeRO / FSDP); still too
big or too slow? Split the matrices (TP) inside a node; still too big? Split the layers (PP)
across nodes; and if the activations of long sequences still do not fit, split the sequence
through attention (context parallelism, CP). :func:`recommend` walks these steps with :func:`~.planner.estimate` and records
why it went on at each, so the reasoning can be read, not only the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.parallel3d.mesh import Grid, grid_for
from distlab.parallel3d.planner import Cluster, Estimate, GiB, Model, Training, estimate
from distlab.zero.theory import SHARDED


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def rank_layouts(model: Model, cluster: Cluster, training: Training, zero_stages=(0, 1, 2, 3),
                 cps=(1,)) -> list[Estimate]:
    """Every layout that can run, for each ZeRO stage and context-parallel size in ``cps``: those that
    fit first, fastest first.

    Layouts that cannot run (tp not dividing the heads, pp not dividing the layers, cp not
    dividing the GPUs or the sequence, a batch that does not split) are left out.
    """
    out = []
    for cp in (c for c in cps if cluster.gpus % c == 0):
        gpus = cluster.gpus // cp
        for tp in divisors(gpus):
            for pp in divisors(gpus // tp):
                grid = grid_for(gpus, pp=pp, tp=tp)
                for zero in zero_stages:
                    try:
                        out.append(estimate(model, cluster, training, grid, zero, cp))
                    except ValueError:
                        continue
    return sorted(out, key=lambda e: (not e.fits, e.step_seconds, e.zero))


@dataclass
class Recommendation:
    """The layout :func:`recommend` settled on (``None`` if nothing fits) and why, step by step."""

    choice: Estimate | None
    steps: list[str]

    def __str__(self) -> str:
        return "\n".join(self.steps)


def recommend(model: Model, cluster: Cluster, training: Training, slow: float = 0.2) -> Recommendation:
    """The usual procedure (the Ultra-Scale Playbook's; Narayanan et al., 2021, takeaways 1 and 2):

    1. **data parallelism** over all GPUs, with the lowest ZeRO stage that fits;
    2. if nothing fits, or it is too slow (more than ``slow`` of the step is not useful
       compute: waiting for communication, or idle in a pipeline bubble), add **tensor
       parallelism inside a node** (tp = 2, 4, ... up to the GPUs of a node);
    3. if the largest such tp still does not fit (or is too slow), add **pipeline parallelism
       across nodes** (pp = 2, 4, ...), each time with the lowest ZeRO stage that fits;
    4. if nothing fits yet, add **context parallelism** next to that tp (cp = 2, 4, ...), without
       a pipeline: a 1F1B pipeline's first stage holds as many layers' activations as the whole
       model, so only splitting the sequence shrinks them.

    Each step stops at the first layout that fits and is not too slow, and otherwise keeps
    the fastest it saw. The reasons are recorded in ``steps``, to be read, not only the answer.
    """
    N, G = cluster.gpus, cluster.gpus_per_node
    steps = [f"{N} GPUs ({G} per node, {cluster.memory / GiB:.0f} GiB each); model of {model.params / 1e9:.2f}B "
             f"parameters; {training.global_batch} sequences of {model.seq} per step"]

    def lowest_fitting(grid: Grid, cp: int) -> Estimate | None:
        for zero in SHARDED:
            e = estimate(model, cluster, training, grid, zero, cp)
            if e.fits:
                return e
        steps.append(f"  {_name(grid, cp)}: even with ZeRO-3, {e.memory['total'] / GiB:.1f} GiB/GPU does not fit")
        return None

    def try_layouts(grids, why: str, cp: int | list[int] = 1) -> Estimate | None:
        steps.append(why)
        found = None
        for grid, c in zip(grids, cp if isinstance(cp, list) else [cp] * len(grids)):
            try:
                e = lowest_fitting(grid, c)
            except ValueError as problem:
                steps.append(f"  {_name(grid, c)}: cannot run ({problem})")
                continue
            if e is None:
                continue
            found = _better(found, e, slow)
            steps.append(f"  {e.describe()}: {'too slow' if _too_slow(e, slow) else 'good'}")
            if not _too_slow(e, slow):
                break
        return found

    powers = [2 ** i for i in range(1, int(math.log2(max(1, G))) + 1)]
    best = try_layouts([grid_for(N)], "1. Data parallelism on every GPU, lowest ZeRO stage that fits:")
    if best is None or _too_slow(best, slow):
        tps = [t for t in powers if N % t == 0 and model.heads % t == 0]
        found = try_layouts([grid_for(N, tp=t) for t in tps],
                            "2. Tensor parallelism inside a node (tp <= GPUs per node):")
        best = _better(best, found, slow)
        if (best is None or _too_slow(best, slow)) and tps:
            tp = tps[-1]
            pps = [p for p in divisors(N // tp) if p > 1 and model.layers % p == 0]
            found = try_layouts([grid_for(N, tp=tp, pp=p) for p in pps],
                                f"3. Pipeline parallelism across nodes, with tp={tp}:")
            best = _better(best, found, slow)
    if best is None:
        tp = tps[-1] if tps else 1
        cps = [2 ** i for i in range(1, int(math.log2(N // tp)) + 1)
               if (N // tp) % 2 ** i == 0 and model.seq % 2 ** i == 0]
        best = try_layouts([grid_for(N // c, tp=tp) for c in cps],
                           f"4. Context parallelism next to tp={tp}, no pipeline:", cps)
    steps.append(f"Choice: {best.describe()}" if best else "Choice: none fits; use recomputation, a smaller "
                 "micro-batch or more GPUs")
    return Recommendation(best, steps)


def _name(grid: Grid, cp: int) -> str:
    return f"dp={grid.dp} pp={grid.pp} tp={grid.tp}" + (f" cp={cp}" if cp > 1 else "")


def _too_slow(e: Estimate, slow: float) -> bool:
    return e.efficiency < 1 - slow


def _better(a: Estimate | None, b: Estimate | None, slow: float) -> Estimate | None:
    """Of two candidates, one fast enough if there is one, then the faster."""
    candidates = [e for e in (a, b) if e is not None]
    if not candidates:
        return None
    return min(candidates, key=lambda e: (_too_slow(e, slow), e.step_seconds))
