"""How many bytes a rank should hold, by precision and ZeRO stage, and send per step: the formulas.

Training with Adam keeps three *model states* per parameter on every rank, whose size is fixed
by the precision:

=====================================  ==========  =========  ===============  =====
precision                              parameters  gradients  optimizer state  total
=====================================  ==========  =========  ===============  =====
fp32                                   4           4          4 + 4 (m, v)     16
mixed (bf16/fp16, fp32 master weights) 2           2          4 + 4 + 4        16
=====================================  ==========  =========  ===============  =====

In mixed precision forward and backward run on 2-byte copies of the weights, but the update
is applied to an fp32 *master* copy (a 2-byte number cannot absorb an update ``1e-4`` times
smaller than itself), so the optimizer holds 12 bytes per parameter: master weights, ``m``
and ``v`` (Rajbhandari et al., *ZeRO*, 2020). Mixed precision saves time and activation memory,
not model-state memory.

With data parallelism (DDP) every rank holds all of it: 16 bytes per parameter, a 7B model
needs 112e9 bytes (104 GiB) per rank before a single activation. ZeRO removes the redundancy across the
``N`` ranks, one kind at a time: stage 1 shards the optimizer state, stage 2 the gradients
too, stage 3 the parameters as well, so each rank keeps ``1/N`` of what is sharded
(:func:`bytes_per_parameter`, :func:`model_state_theory`). :mod:`distlab.tools.memory` counts
what a rank really holds, to compare.

Pure Python, no torch: the layout planner of chapter 7 (:mod:`distlab.parallel3d.planner`)
prices layouts with these same numbers.
"""

from __future__ import annotations

PRECISIONS = {
    "fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
    "mixed": {"parameters": 2, "gradients": 2, "optimizer": 12},
}
"""Bytes per parameter of each model state, with Adam(W) (see the table above)."""

KINDS = tuple(PRECISIONS["fp32"])
"""The model states: ``("parameters", "gradients", "optimizer")``."""

ACTIVATION_BYTES = {"fp32": 4, "mixed": 2}
"""Bytes per activation value: mixed precision computes, and saves, in 16 bits."""

SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"), 3: ("optimizer", "gradients", "parameters")}
"""Which model states each ZeRO stage splits over the ranks (stage 0 is plain DDP)."""

STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def bytes_per_parameter(stage: int, world: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes each rank holds per model parameter, by kind, for a ZeRO ``stage`` on ``world`` ranks.

    >>> bytes_per_parameter(0, 8)             # DDP: everything replicated
    {'parameters': 4, 'gradients': 4, 'optimizer': 8, 'total': 16}
    >>> bytes_per_parameter(3, 8, "mixed")    # ZeRO-3: everything divided by 8
    {'parameters': 0.25, 'gradients': 0.25, 'optimizer': 1.5, 'total': 2.0}
    """
    if stage not in SHARDED:
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    per = {kind: (b / world if kind in SHARDED[stage] else b) for kind, b in PRECISIONS[precision].items()}
    per["total"] = sum(per.values())
    return per


def model_state_theory(num_params: int, world: int, stage: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state per rank (and their total), by the formula."""
    return {kind: num_params * b for kind, b in bytes_per_parameter(stage, world, precision).items()}


def ranks_needed(num_params: float, capacity_bytes: float, stage: int, precision: str = "mixed") -> float:
    """The smallest number of ranks whose model states fit in ``capacity_bytes`` each (``inf`` if none).

    Replicated states do not shrink with more ranks, so stages 0-2 may never fit.
    """
    per = bytes_per_parameter(stage, 1, precision)
    fixed = sum(b for kind, b in per.items() if kind != "total" and kind not in SHARDED[stage]) * num_params
    shrinking = sum(b for kind, b in per.items() if kind != "total" and kind in SHARDED[stage]) * num_params
    if fixed >= capacity_bytes:
        return float("inf")
    if shrinking == 0:
        return 1
    return max(1, -(-shrinking // (capacity_bytes - fixed)))


COLLECTIVES = {
    0: {"all_reduce": 1},
    1: {"reduce_scatter": 1, "all_gather": 1},
    2: {"reduce_scatter": 1, "all_gather": 1},
    3: {"reduce_scatter": 1, "all_gather": 2},
}
"""The collectives of one training step by stage, each over all the parameters once.

ZeRO-1 and 2 reduce-scatter the gradients and all-gather the updated slices; ZeRO-3 all-gathers
the weights twice, for forward and again for backward."""

BESIDE_DDP = {"all_reduce": 1, "all_gather": 1}
"""ZeRO-1 as an optimizer next to an unchanged DDP (torch's ``ZeroRedundancyOptimizer``,
:class:`distlab.zero.optimizer.ShardedOptimizer` by default): DDP's all-reduce, then the
all-gather of the updated slices."""

ROUNDS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
"""What each collective sends per rank, in units of ``(N-1)/N S`` (chapter 2's ring algorithms)."""


def collective_bytes(op: str, numel: int, world: int, element_size: int = 4) -> float:
    """Bytes each rank sends in one ``op`` over ``numel`` elements: ``ROUNDS[op] (N-1)/N S``."""
    return ROUNDS[op] * (world - 1) / world * numel * element_size


def comm_bytes_per_step(stage: int, numel: int, world: int, element_size: int = 4, beside_ddp: bool = False) -> float:
    """Bytes each rank sends per training step, by the standard bandwidth-optimal algorithms.

    ``S = numel * element_size`` bytes of parameters (for ZeRO, padded per unit). DDP: one
    all-reduce, ``2 (N-1)/N S``. ZeRO-1 and 2: a reduce-scatter and an all-gather, ``(N-1)/N S``
    each: the same total. ZeRO-3: an all-gather for forward, another for backward and a
    reduce-scatter, ``3 (N-1)/N S``: 1.5 times DDP. ZeRO-1 ``beside_ddp``: DDP's all-reduce and
    an all-gather, ``3 (N-1)/N S`` too: sharding only the optimizer, and leaving DDP as it is,
    costs half an all-reduce more than reduce-scattering instead.
    """
    if beside_ddp and stage != 1:
        raise ValueError("beside_ddp describes ZeRO-1 (a sharded optimizer next to DDP); stage must be 1")
    collectives = BESIDE_DDP if beside_ddp else COLLECTIVES[stage]
    return sum(count * collective_bytes(op, numel, world, element_size) for op, count in collectives.items())
