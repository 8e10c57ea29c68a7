"""The α-β cost model: what an all-reduce should cost, to compare with what it does cost.

Sending ``m`` bytes costs ``α + m·β``: ``α`` is the latency of one message (start-up, the
network's round trip), ``β`` the seconds per byte (one over the bandwidth). An algorithm is a
number of messages in a row (latency terms) and a number of bytes each rank sends (bandwidth
terms): :data:`RING_STEPS` and :data:`BUS_FACTOR` for the ring, :func:`predicted_time` for the
three all-reduces of :mod:`.all_reduce`. :func:`fit_alpha_beta` finds ``α`` and ``β`` from
measured times, and :func:`bus_bandwidth` turns a time into NCCL's "bus bandwidth".
"""

from __future__ import annotations

import math

RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
}
"""Messages in a row (latency terms) of each op's ring algorithm on n ranks."""

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
"""Bytes each rank sends per byte of the (full) tensor, in the ring algorithm. It is also
the factor from algorithm bandwidth to bus bandwidth in NCCL's performance tests."""


def ring_time(op: str, n: int, nbytes: float, alpha: float, beta: float) -> float:
    """α-β time of ``op`` done with a ring: ``steps·α + factor·nbytes·β``.

    ``nbytes`` is the size of the full tensor (the all-reduce's tensor, the all-gather's
    output, the reduce-scatter's input).
    """
    return RING_STEPS[op](n) * alpha + BUS_FACTOR[op](n) * nbytes * beta


def predicted_time(algorithm: str, n: int, nbytes: float, alpha: float, beta: float) -> float:
    """Seconds an all-reduce of ``nbytes`` on ``n`` ranks takes under the α-β model.

    * ring: ``2(n-1)`` steps, each sending ``nbytes/n``: ``2(n-1)·α + 2(n-1)/n·nbytes·β``
    * tree: ``2·ceil(log2 n)`` rounds, each sending everything: ``2·ceil(log2 n)·(α + nbytes·β)``
    * naive: rank 0 receives ``n-1`` tensors then sends ``n-1``: ``2(n-1)·(α + nbytes·β)``
    """
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return ring_time("all_reduce", n, nbytes, alpha, beta)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) * (alpha + nbytes * beta)
    if algorithm == "naive":
        return 2 * (n - 1) * (alpha + nbytes * beta)
    raise ValueError(f"algorithm must be 'ring', 'tree' or 'naive', got {algorithm!r}")


def bus_bandwidth(op: str, n: int, nbytes: float, seconds: float) -> float:
    """Bytes per second each link carried: ``nbytes/seconds`` (algorithm bandwidth) × the op's factor.

    Bus bandwidth can be compared across ops and rank counts, and with the hardware's link speed.
    """
    return nbytes / seconds * BUS_FACTOR[op](n)


def fit_alpha_beta(op: str, n: int, sizes, times) -> tuple[float, float]:
    """α and β of the ring model of ``op`` that best fit measured (bytes, seconds) pairs.

    Sizes span many orders of magnitude, so we minimise the *relative* error (each equation
    divided by its measured time); plain least squares would fit only the largest messages.
    """
    import numpy as np

    times = np.asarray(times, dtype=float)
    rows = np.array([[RING_STEPS[op](n), BUS_FACTOR[op](n) * size] for size in sizes], dtype=float)
    (alpha, beta), *_ = np.linalg.lstsq(rows / times[:, None], np.ones_like(times), rcond=None)
    return float(alpha), float(beta)
