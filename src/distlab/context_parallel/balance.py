"""Causal load balance: give rank ``r`` chunks ``r`` and ``2N-1-r``, so every rank has the same work.

Under a causal mask the token at position ``p`` attends to ``p + 1`` keys: late tokens cost
more than early ones. Cut the sequence in ``N`` consecutive runs (:func:`~.layout.contiguous`)
and the last rank's queries see almost the whole sequence while the first rank's see only
their own run: the last rank does about ``2N - 1`` times the first rank's work, and in a ring
every step waits for the slowest rank.

The fix (used by Llama 3's context parallelism, Dubey et al., 2024, and by Megatron-LM and
torch's ``context_parallel`` as "load balancing"): cut the sequence into ``2N`` chunks and give
rank ``r`` one early chunk and the matching late one, ``r`` and ``2N-1-r`` (:func:`balanced`).
Chunk ``i`` of ``c`` tokens needs ``c^2 i + c(c+1)/2`` query-key pairs; ``i`` and ``2N-1-i``
together need ``c^2 (2N-1) + c(c+1)``, the same for every ``r``. Nothing else changes: the
ring passes the same blocks, and positions (not shard order) decide the mask.

Two counts of work per rank, for any layout:

* :func:`causal_score_pairs`: unmasked (query, key) token pairs, the exact number of scores
  a rank must compute (and of multiply-adds per head dimension);
* :func:`causal_chunk_pairs`: (query chunk, key chunk) pairs with at least one unmasked pair,
  the blocks a ring computes (:func:`distlab.context_parallel.ring.ring_attention` skips the
  others). With ``2N`` chunks, contiguous gives rank ``r`` ``4r + 3`` of them, balanced gives
  every rank ``2N + 1``: the slowest rank's work drops from ``4N - 1`` to ``2N + 1`` blocks.
"""

from __future__ import annotations

from distlab.context_parallel.layout import Layout, check_length, chunk_ranges


def balanced(seq: int, n: int) -> Layout:
    """Rank ``r`` holds chunks ``r`` and ``2n-1-r`` of ``2n``: one early, one late (Llama 3's layout)."""
    check_length(seq, n)
    ranges = chunk_ranges(seq, 2 * n)
    return Layout(seq, tuple((ranges[r], ranges[2 * n - 1 - r]) for r in range(n)))


def causal_score_pairs(layout: Layout) -> list[int]:
    """Per rank: how many (query, key) pairs a causal mask leaves, ``sum of (p + 1)`` over its positions."""
    return [sum((stop * (stop + 1) - start * (start + 1)) // 2 for start, stop in chunks)
            for chunks in layout.chunks]


def causal_chunk_pairs(layout: Layout) -> list[int]:
    """Per rank: (its query chunk, any key chunk) pairs in which some query sees some key."""
    every_chunk = [chunk for chunks in layout.chunks for chunk in chunks]
    return [sum(1 for q_start, q_stop in chunks for k_start, _ in every_chunk if k_start <= q_stop - 1)
            for chunks in layout.chunks]
