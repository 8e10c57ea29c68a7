"""The communication of tensor parallelism: six autograd functions, in conjugate pairs.

What one does forward, its partner does backward (the table is in the package's docstring,
:mod:`distlab.tensor_parallel`). Each is one line forward and one line backward around the
plain collectives below; layers (:mod:`.layers`) call only these six functions, never a
collective directly, so every byte tensor parallelism sends passes through this module.
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


# -- the conjugate pairs, as autograd functions ---------------------------------------------------
# Each one is a single line forward and a single line backward. The rule that finds the
# backward: if forward hands the same value to every rank (identity on a replicated input),
# each rank's gradient is only a part of the true one, so backward must sum them (all-reduce);
# if forward sums, backward hands the same gradient to every part (identity).

class _CopyToParallelRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward; all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToParallelRegion(torch.autograd.Function):
    """Keep my slice of the last dimension forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, -1, ctx.group), None


class _GatherFromParallelRegion(torch.autograd.Function):
    """All-gather along the last dimension forward; keep my slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return split(grad, -1, ctx.group), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Sequence parallel: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Sequence parallel: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.dim, ctx.group), None, None


SEQUENCE_DIM = 1   # activations are (batch, seq, features), as in distlab.models


def copy_to_parallel_region(x, group=None):
    """Enter a tensor-parallel region with a replicated ``x``: identity forward, all-reduce backward."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x, group=None):
    """Leave a tensor-parallel region by summing partial results: all-reduce forward, identity backward."""
    return _ReduceFromParallelRegion.apply(x, group)


def scatter_to_parallel_region(x, group=None):
    """Keep my slice of the last dimension: no communication forward, all-gather backward."""
    return _ScatterToParallelRegion.apply(x, group)


def gather_from_parallel_region(x, group=None):
    """Concatenate every rank's slice of the last dimension: all-gather forward, slice backward."""
    return _GatherFromParallelRegion.apply(x, group)


def gather_from_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Sequence shards to the full sequence: all-gather forward, reduce-scatter backward."""
    return _GatherFromSequenceRegion.apply(x, dim, group)


def reduce_scatter_to_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Partial sums to summed sequence shards: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterToSequenceRegion.apply(x, dim, group)
