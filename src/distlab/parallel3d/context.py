"""The fourth axis of the planner: context parallelism (cp), priced on paper.

Context parallelism (chapter 8, :mod:`distlab.context_parallel`) splits every sequence into
``cp`` shares that stay split *through* attention: each rank holds ``s / cp`` tokens' queries,
keys and values, and ring attention passes the key/value blocks round the ``cp`` ranks. What
that changes in :func:`distlab.parallel3d.planner.estimate`:

* **Activations** per rank shrink by ``cp``: every term of Korthikanti et al.'s table is per
  token (``s b h``), and the attention term ``5 a s^2 b`` becomes ``5 a (s / cp) s b``: a rank's
  queries against every key. So does everything tp and pp send (the activations they carry are
  a rank's ``s / cp`` tokens).
* **Parameters do not**: the ``cp`` ranks hold the same weights and train on different tokens,
  so for the gradients they are more data-parallel ranks. Their gradient reduction and ZeRO's
  sharding run over ``dp * cp`` ranks, as Megatron-LM's and TorchTitan's do.
* **Communication**: ring attention sends, per layer and micro-batch, ``cp - 1`` key/value
  blocks forward and ``2 cp - 1`` backward (the blocks again and their gradient accumulators),
  each ``2 b k (s / cp) d`` elements for ``k`` key/value heads of width ``d`` on the rank
  (:func:`ring_kv_bytes`, the formula of :func:`distlab.context_parallel.ring.ring_bytes`
  restated here because that module needs torch). Full recomputation runs the forward ring twice.
  With tp, a rank carries only its ``k / tp`` key/value heads (at least one: Megatron-LM copies
  a key/value head to every tp rank that needs it when tp exceeds their number).
* **Overlap**: the ring posts each transfer before computing on the block it holds
  (:mod:`distlab.context_parallel.ring`), so only the part of its time that exceeds the
  attention computation it overlaps with is exposed (:func:`attention_flops`: causal, so half
  of every query meeting every key). The planner's compute time, ``6 P T``, leaves attention's
  own FLOPs out (they are a few percent at 4k tokens and more than ``6 P T`` itself at 128k for a
  70B model); they serve here only as the cover for the ring.
* **Placement**: cp is placed just outside tp (Megatron-LM's order ``tp-cp-ep-dp-pp``): its
  groups are ``tp`` ranks apart, and the axes outside tp are ``cp`` times farther apart than in
  the three-axis grid (:func:`span`).

Pure Python, like the planner: no torch.
"""

from __future__ import annotations

from distlab.parallel3d.mesh import Grid


def ring_kv_bytes(cp: int, seq: int, batch: int, kv_heads: int, head_dim: int, element_size: int,
                  backward: bool = False) -> int:
    """Bytes one rank sends in ring attention over ``cp`` ranks, for one layer: forward or backward.

    A block is a rank's keys and values, ``2 * batch * kv_heads * (seq / cp) * head_dim`` elements;
    forward sends ``cp - 1`` of them, backward ``2 cp - 1`` (the blocks again and the ``cp``
    gradient accumulators). The same number as :func:`distlab.context_parallel.ring.ring_bytes`.
    """
    if seq % cp:
        raise ValueError(f"cp={cp} does not divide the sequence length ({seq})")
    block = 2 * batch * kv_heads * (seq // cp) * head_dim * element_size
    return (2 * cp - 1) * block if backward else (cp - 1) * block


def kv_heads_on_rank(kv_heads: int, tp: int) -> int:
    """Key/value heads a tp rank holds: its share, or one copy when tp exceeds their number."""
    return max(1, kv_heads // tp)


def cp_bytes_per_layer(seq: int, batch: int, kv_heads: int, head_dim: int, element_size: int, cp: int,
                       recompute: str = "none") -> int:
    """Ring attention's bytes per rank for one layer and one micro-batch of a training step."""
    if cp == 1:
        return 0
    forward = ring_kv_bytes(cp, seq, batch, kv_heads, head_dim, element_size)
    backward = ring_kv_bytes(cp, seq, batch, kv_heads, head_dim, element_size, backward=True)
    return forward * (2 if recompute == "full" else 1) + backward


def attention_flops(seq: int, batch: int, heads: int, head_dim: int, cp: int) -> float:
    """FLOPs of causal attention (scores and weighted values) for one layer, micro-batch and rank, forward + backward.

    Forward: two matrix products of ``(s / cp) x s x d`` per head, 2 FLOPs per multiply-add,
    halved by the causal mask; backward twice the forward.
    """
    return 3 * 2 * 2 * batch * heads * (seq / cp) * seq * head_dim / 2


def span(grid: Grid, axis: str, cp: int = 1) -> int:
    """How many consecutive ranks one group along ``axis`` covers, with cp placed just outside tp.

    ``axis`` is one of the grid's axes or ``"cp"``. Without cp (``cp = 1``) this is
    ``grid.stride(axis) * grid.size(axis)``; axes outside tp are ``cp`` times farther apart.
    """
    inside_tp = grid.stride("tp") * grid.tp
    if axis == "cp":
        return inside_tp * cp
    outside = grid.order.index(axis) < grid.order.index("tp")
    return grid.stride(axis) * (cp if outside else 1) * grid.size(axis)
