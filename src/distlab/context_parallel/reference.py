"""The chapter's exercise, answered with the package's own pieces: what its graded tasks are checked against.

Chapter 8's exercise asks for two functions, written from scratch in the notebook (this
package is switched off while they run):

1. **The merge of many partial results** (:func:`merge_partials`). Attention of the same
   queries over several disjoint blocks of keys gives one pair ``(out, lse)`` per block; the
   attention over all of those keys is their log-sum-exp merge, exact up to rounding. Here it is
   :func:`~distlab.context_parallel.blockwise.merge` applied pair by pair; merging in any
   order gives the same result, since it only regroups one sum.
2. **Causal ring attention on the balanced layout** (:func:`balanced_ring_attention`). Rank
   ``r`` holds chunks ``r`` and ``2N-1-r`` of the sequence cut into ``2N``
   (:func:`~distlab.context_parallel.balance.balanced`); keys and values go round the ring,
   and each query is masked by its position in the whole sequence, never by its place in the
   rank's shard. Here it is :func:`~distlab.context_parallel.ring.ring_attention` on that
   layout, forward only.

The hidden tests compare a student's functions with plain single-process attention
(:func:`~distlab.context_parallel.blockwise.attention`), and ``tests/chapters/test_chapter08.py``
checks these two against the same, so the exercise's reference and the book's agree.
"""

from __future__ import annotations

import torch

from distlab.context_parallel import balance, blockwise, ring


def merge_partials(parts):
    """``(out, lse)`` of attention over the union of the key blocks of ``parts``.

    ``parts``: a non-empty list of ``(out, lse)``, each the attention of the same queries over
    one block of keys (``out``: ``(..., queries, head_dim)``, ``lse``: ``(..., queries)``; a row
    that sees no key of its block has ``lse = -inf`` and weighs nothing).
    """
    out, lse = parts[0]
    for part_out, part_lse in parts[1:]:
        out, lse = blockwise.merge(out, lse, part_out, part_lse)
    return out, lse


def balanced_ring_attention(q, k, v, seq: int, causal: bool = True, group=None) -> torch.Tensor:
    """This rank's rows of attention over a sequence of ``seq`` tokens laid out as
    :func:`~distlab.context_parallel.balance.balanced` gives (rank ``r``: chunk ``r``, then
    chunk ``2N-1-r`` of ``2N``), by ring; forward only.

    ``q``, ``k``, ``v``: ``(batch, heads, this rank's tokens, head_dim)``, in that order.
    """
    n = torch.distributed.get_world_size(group)
    layout = balance.balanced(seq, n)
    with torch.no_grad():
        return ring.ring_attention(q, k, v, causal=causal, layout=layout, group=group)
