"""Which tokens each rank holds: a layout of the sequence over the ranks, and sharding by it.

Context parallelism splits the *sequence*: every one of ``N`` ranks holds the queries, keys
and values of some of the tokens (and, in a model, every activation of those tokens), never
the whole sequence. A :class:`Layout` says which: the sequence is cut into ``2N`` chunks of
consecutive tokens (sizes as ``torch.tensor_split`` makes them: they differ by at most one
token when ``2N`` does not divide the length), and each rank holds two of them.

* :func:`contiguous`: rank ``r`` holds chunks ``2r`` and ``2r+1``, one run of tokens;
* :func:`distlab.context_parallel.balance.balanced`: rank ``r`` holds chunks ``r`` and
  ``2N-1-r``, which evens out causal attention's work (see that module).

Both cut the sequence at the same places, so a ring over either computes the same blocks of
work and only their owners differ: that is what makes their work counts comparable.

Positions are what attention needs to know about a token beyond its vectors: whether a key
comes before a query (causal masking) depends on where both sit in the *whole* sequence, not
on where they sit in a rank's shard. :meth:`Layout.positions` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Range = tuple[int, int]          # (start, stop) of consecutive token positions


@dataclass(frozen=True)
class Layout:
    """``chunks[r]``: the ``(start, stop)`` ranges rank ``r`` holds, in the order it stores them."""

    seq: int
    chunks: tuple[tuple[Range, ...], ...]

    @property
    def ranks(self) -> int:
        return len(self.chunks)

    def tokens(self, rank: int) -> int:
        """How many tokens rank ``rank`` holds."""
        return sum(stop - start for start, stop in self.chunks[rank])

    def positions(self, rank: int) -> torch.Tensor:
        """The positions in the whole sequence of rank ``rank``'s tokens, in its storage order."""
        return torch.cat([torch.arange(start, stop) for start, stop in self.chunks[rank]])

    def local_chunks(self, rank: int) -> list[tuple[slice, Range]]:
        """Each chunk of rank ``rank`` as ``(slice of its shard, (start, stop) in the sequence)``."""
        found, offset = [], 0
        for start, stop in self.chunks[rank]:
            found.append((slice(offset, offset + stop - start), (start, stop)))
            offset += stop - start
        return found


def chunk_ranges(seq: int, parts: int) -> list[Range]:
    """``seq`` positions cut into ``parts`` runs whose lengths differ by at most one (longer first)."""
    small, extra = divmod(seq, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + small + (i < extra)
        ranges.append((start, stop))
        start = stop
    return ranges


def check_length(seq: int, n: int) -> None:
    """Every layout cuts the sequence into ``2n`` chunks: a shorter sequence leaves some empty."""
    if seq < 2 * n:
        raise ValueError(f"a sequence of {seq} tokens cannot be cut into 2 x {n} = {2 * n} chunks for "
                         f"{n} context-parallel ranks; use at least {2 * n} tokens")


def contiguous(seq: int, n: int) -> Layout:
    """Rank ``r`` holds chunks ``2r`` and ``2r+1`` of ``2n``: the ``r``-th run of about ``seq/n`` tokens."""
    check_length(seq, n)
    ranges = chunk_ranges(seq, 2 * n)
    return Layout(seq, tuple((ranges[2 * r], ranges[2 * r + 1]) for r in range(n)))


def shard(x: torch.Tensor, layout: Layout, rank: int, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s tokens of the full tensor ``x`` (the sequence along ``dim``), in its storage order."""
    if x.shape[dim] != layout.seq:
        raise ValueError(f"the tensor has {x.shape[dim]} tokens along dimension {dim}, the layout {layout.seq}")
    return x.index_select(dim, layout.positions(rank).to(x.device)).contiguous()


def unshard(shards: list[torch.Tensor], layout: Layout, dim: int = -2) -> torch.Tensor:
    """The full tensor, in sequence order, from every rank's shard (``shards[r]`` from rank ``r``)."""
    stacked = torch.cat(list(shards), dim=dim)
    order = torch.cat([layout.positions(r) for r in range(layout.ranks)])
    return stacked.index_select(dim, torch.argsort(order).to(stacked.device))
