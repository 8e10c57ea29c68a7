"""Bucketed data parallelism: a few large all-reduces instead of one per parameter.

Copy the gradients into a few flat buffers of about ``bucket_mb`` MiB each
(:func:`plan_buckets`, :func:`flatten_gradients`) and all-reduce each buffer once: fewer,
larger messages, each paying the latency once (:func:`bucketed_average`). Still after
backward, so nothing overlaps yet: compute, then communicate (:mod:`.overlap` does both at once).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

MiB = 2**20
"""Bytes in a mebibyte. ``bucket_mb`` counts these, as torch's ``bucket_cap_mb`` does (its
default "25 MB" is 25 * 2**20 bytes), the name notwithstanding."""
MB = MiB   # the name torch's argument suggests; kept so that older notebooks still run


def plan_buckets(params, bucket_mb: float) -> list[list[torch.nn.Parameter]]:
    """Group parameters into buckets of about ``bucket_mb`` MiB, the way torch's DDP does.

    Parameters are taken in *reverse* order of definition, because backward computes the
    gradients of the last layers first: the first bucket is then the first to be complete.
    A bucket is closed as soon as it holds at least ``bucket_mb`` MiB (so a parameter
    larger than the cap closes its bucket alone), or when the next parameter has another
    dtype (one flat buffer holds one dtype). What is left at the end, the first layers,
    makes a small last bucket: small is what the last bucket should be, because its
    all-reduce is the one nothing can hide, launched when backward is over. Parameters that
    do not require gradients (frozen) are left out.
    """
    cap = bucket_mb * MiB
    buckets: list[list[torch.nn.Parameter]] = []
    size, closed = 0.0, True
    for param in reversed([p for p in params if p.requires_grad]):
        if closed or buckets[-1][0].dtype != param.dtype:
            buckets.append([])
            size = 0.0
        buckets[-1].append(param)
        size += param.numel() * param.element_size()
        closed = size >= cap
    return buckets


def flatten_gradients(bucket, out: torch.Tensor | None = None) -> torch.Tensor:
    """One flat tensor with the bucket's gradients end to end (zeros where a gradient is None).

    ``out`` (optional) is a flat buffer of the right size to write into instead of a new one:
    reusing a buffer from step to step avoids paying for fresh memory (see
    :class:`~distlab.data_parallel.overlap.OverlappedDDP`).
    """
    pieces = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket]
    return torch.cat(pieces) if out is None else torch.cat(pieces, out=out)


def bucket_buffer(bucket) -> torch.Tensor:
    """An empty flat buffer that holds the bucket's gradients end to end."""
    first = bucket[0]
    return torch.empty(sum(p.numel() for p in bucket), dtype=first.dtype, device=first.device)


def unflatten_into_gradients(flat: torch.Tensor, bucket, keep_none: set | None = None, divide_by: int = 1) -> None:
    """Copy consecutive slices of ``flat`` back into each parameter's ``.grad`` (the inverse of
    :func:`flatten_gradients`), divided by ``divide_by`` on the way: dividing while copying
    costs nothing extra, where dividing the flat buffer first is one more pass over it.
    Parameters in ``keep_none`` (by ``id``) keep ``grad = None``."""
    offset = 0
    for param in bucket:
        piece = flat[offset: offset + param.numel()].view_as(param)
        offset += param.numel()
        if keep_none and id(param) in keep_none:
            param.grad = None
        elif param.grad is None:
            param.grad = piece / divide_by
        else:
            torch.div(piece, divide_by, out=param.grad)


def bucketed_average(model: torch.nn.Module, bucket_mb: float = 25.0, buckets=None, tracer=None) -> int:
    """Average gradients over ranks with one ``all_reduce`` per bucket; returns the bucket count.

    Runs after backward, so nothing overlaps yet: compute, then communicate. ``tracer``
    (optional) gets one "comm" event per bucket.
    """
    world = dist.get_world_size()
    buckets = buckets if buckets is not None else plan_buckets(model.parameters(), bucket_mb)
    for index, bucket in enumerate(buckets):
        unused = {id(p) for p in bucket if p.grad is None}
        flat = flatten_gradients(bucket)
        start = time.perf_counter()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if tracer is not None:
            tracer.add(f"all-reduce bucket {index}", start, time.perf_counter(), lane="comm", kind="comm")
        flat /= world
        unflatten_into_gradients(flat, bucket, keep_none=unused)
    return len(buckets)
