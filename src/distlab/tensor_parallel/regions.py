"""The communication of tensor parallelism: six autograd functions, in conjugate pairs.

What one does forward, its partner does backward (the table is in the package's docstring,
:mod:`distlab.tensor_parallel`). Each is one line: a :class:`ConjugatePair` node with a
forward and a backward made of the plain collectives below. Layers (:mod:`.layers`) call only
these six functions, never a collective directly, so every byte tensor parallelism sends
passes through this module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.tools.groups import world


def divide(size: int, parts: int, what: str) -> int:
    """``size // parts``, or a ``ValueError`` naming both when ``parts`` does not divide ``size``."""
    if size % parts:
        raise ValueError(f"{what} ({size}) does not split evenly over {parts} tensor-parallel ranks; "
                         f"pick a size that is a multiple of {parts}")
    return size // parts


# -- the collectives, without autograd ----------------------------------------------------------

def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of ``x`` over the ranks (on a copy: autograd may still need ``x``)."""
    x = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


def split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """My rank's equal slice of ``x`` along ``dim``. No communication."""
    n, rank = world(group)
    divide(x.shape[dim], n, f"dimension {dim} of a tensor of shape {tuple(x.shape)}")
    return x.chunk(n, dim=dim)[rank].contiguous()


def all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's ``x``, concatenated along ``dim`` in rank order."""
    n, _ = world(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum of ``x`` over the ranks, of which I receive only my slice along ``dim``."""
    n, _ = world(group)
    divide(x.shape[dim], n, f"dimension {dim} of a tensor of shape {tuple(x.shape)}")
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=group)
    return mine


# -- the conjugate pairs ----------------------------------------------------------------------------
# The rule that finds the backward: if forward hands the same value to every rank (identity on
# a replicated input), each rank's gradient is only a part of the true one, so backward must
# sum them (all-reduce); if forward sums, backward hands the same gradient to every part
# (identity). One autograd node holds any such pair; each region below is then one line.

class ConjugatePair(torch.autograd.Function):
    """An autograd node that runs ``forward(x)`` forward and ``backward(gradient)`` backward."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.backward_of = backward
        return forward(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_of(grad), None, None


SEQUENCE_DIM = 1   # activations are (batch, seq, features), as in distlab.models


def copy_to_parallel_region(x, group=None):
    """Megatron's ``f``: enter a region with a replicated ``x``: identity forward, all-reduce backward."""
    return ConjugatePair.apply(x, lambda t: t.view_as(t), lambda g: all_reduce(g, group))


def reduce_from_parallel_region(x, group=None):
    """Megatron's ``g``: leave a region by summing partial results: all-reduce forward, identity backward."""
    return ConjugatePair.apply(x, lambda t: all_reduce(t, group), lambda g: g)


def scatter_to_parallel_region(x, group=None):
    """Keep my slice of the last dimension: no communication forward, all-gather backward."""
    return ConjugatePair.apply(x, lambda t: split(t, -1, group), lambda g: all_gather(g, -1, group))


def gather_from_parallel_region(x, group=None):
    """Concatenate every rank's slice of the last dimension: all-gather forward, slice backward."""
    return ConjugatePair.apply(x, lambda t: all_gather(t, -1, group), lambda g: split(g, -1, group))


def gather_from_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Sequence parallel: sequence shards to the full sequence: all-gather forward, reduce-scatter backward."""
    return ConjugatePair.apply(x, lambda t: all_gather(t, dim, group), lambda g: reduce_scatter(g, dim, group))


def reduce_scatter_to_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Sequence parallel: partial sums to summed sequence shards: reduce-scatter forward, all-gather backward."""
    return ConjugatePair.apply(x, lambda t: reduce_scatter(t, dim, group), lambda g: all_gather(g, dim, group))
