"""Overlapped data parallelism: bucket all-reduces launched from gradient hooks while backward runs.

A gradient hook on every parameter notices when its gradient is final; as soon as every
gradient of a bucket is final, the bucket's all-reduce is launched *asynchronously* while
backward goes on computing the gradients of the earlier layers (:class:`OverlappedDDP`).
Before the optimizer step, :meth:`OverlappedDDP.finish` waits for the outstanding all-reduces
and copies the averages back.

Gradient accumulation: with ``k`` micro-batches per step there is no need to communicate
after each of them; summing the local gradients and averaging once gives the same result.
:meth:`OverlappedDDP.no_sync` skips the communication. Like torch's DDP, this class decides
*in forward* whether the following backward communicates, so the ``no_sync`` block has to
wrap the forward pass, not just ``backward`` (:data:`SYNC_DECIDED_IN_FORWARD` explains why and
:func:`accumulation_step` shows the bug that results otherwise).

Assumptions, the same as torch DDP's defaults: every rank has the same parameters in the
same order, and the same parameters receive gradients on every rank (the graph does not
depend on the data). A parameter that gets no gradient on any rank keeps ``grad = None``.
Nothing here is specific to CPUs: the same code runs with NCCL on GPUs.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from distlab.data_parallel.buckets import bucket_buffer, flatten_gradients, plan_buckets, unflatten_into_gradients
from distlab.data_parallel.naive import broadcast_parameters

SYNC_DECIDED_IN_FORWARD = """\
Why the sync decision is taken in forward: a hook fires during backward, when it is too late
to ask the caller anything, so the wrapper has to know *before* backward starts whether this
backward should communicate. Forward is the last moment it sees. torch's DDP does the same
(its forward prepares the reducer for the coming backward), which is why its documentation
asks for forward *and* backward inside `no_sync()`."""


class OverlappedDDP(torch.nn.Module):
    """Wrap a model: bucketed gradient all-reduces launched from gradient hooks during backward.

    Usage on every rank::

        ddp = OverlappedDDP(model, bucket_mb=1)      # broadcasts rank 0's weights
        loss = loss_fn(ddp, batch)                   # forward through the wrapper
        loss.backward()                              # all-reduces start in here
        ddp.finish()                                 # wait, copy averages into .grad
        optimizer.step()

    ``tracer`` (a :class:`distlab.tools.trace.Tracer`, optional) receives one event per bucket
    all-reduce, from launch to completion, for the timeline figure.

    Each bucket has one flat buffer, allocated here and reused every step, as torch's DDP
    keeps its buckets: a new buffer per bucket per step asks the operating system for fresh
    pages each time, and on a CPU that alone made a step several percent slower than torch's.
    ``reuse_buffers=False`` brings that cost back, and ``buckets`` (lists of the model's
    parameters, in launch order) replaces :func:`plan_buckets`' plan: chapter 3 uses both to
    time this class as it was first written.
    """

    def __init__(self, model: torch.nn.Module, bucket_mb: float = 25.0, tracer=None, broadcast: bool = True,
                 reuse_buffers: bool = True, buckets: list | None = None):
        super().__init__()
        self.module = model
        self.tracer = tracer
        self.world = dist.get_world_size()
        if broadcast:
            broadcast_parameters(model)
        self.buckets = buckets if buckets is not None else plan_buckets(model.parameters(), bucket_mb)
        self._buffers = [bucket_buffer(bucket) if reuse_buffers else None for bucket in self.buckets]
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.require_sync = True        # changed by no_sync()
        self._sync_this_backward = True  # fixed in forward, read by the hooks
        self._unused: set[int] = set()   # params that got no gradient in the first synced step
        self._first_step = True
        self._reset()
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._on_gradient_ready)

    # what forward arms and backward fills in
    def _reset(self) -> None:
        # ids of params whose gradient is final; parameters known to get no gradient count as final
        self._ready = [{id(p) for p in bucket if id(p) in self._unused} for bucket in self.buckets]
        self._pending = {}                             # bucket index -> (work, flat buffer)
        self._next = 0                                 # the next bucket to launch

    def forward(self, *args, **kwargs):
        self._reset()
        self._sync_this_backward = self.require_sync  # the decision for the coming backward
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward passes whose *forward* ran inside this block only accumulate local gradients."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _on_gradient_ready(self, param: torch.nn.Parameter) -> None:
        """Called by autograd once ``param.grad`` holds this backward's complete gradient."""
        if not self._sync_this_backward:
            return
        index = self._bucket_of[id(param)]
        self._ready[index].add(id(param))
        # Launch in bucket order, never out of it: collectives must be issued in the same order
        # on every rank, or they pair up wrongly (torch DDP keeps the same rule).
        while self._next < len(self.buckets) and len(self._ready[self._next]) == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, index: int) -> None:
        """Start the asynchronous all-reduce of bucket ``index`` and return at once."""
        bucket = self.buckets[index]
        no_gradient = {id(p) for p in bucket if p.grad is None}
        flat = flatten_gradients(bucket, out=self._buffers[index])
        start = time.perf_counter()
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        if self.tracer is not None:
            self.tracer.async_event(work, f"all-reduce bucket {index}", start, lane="comm", kind="comm")
        self._pending[index] = (work, flat, no_gradient)

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and write the averaged gradients into ``.grad``.

        A parameter that got no gradient keeps ``grad = None``. Its bucket never filled up in
        backward, so in the first step it is launched only here, late. From then on the
        parameter is known to be unused and counts as ready from the start (torch DDP's
        ``static_graph=True`` learns the same thing from its first iteration).
        """
        if not self._sync_this_backward:
            return
        if self._first_step:
            self._unused = {id(p) for i, bucket in enumerate(self.buckets) for p in bucket
                            if id(p) not in self._ready[i]}
            self._first_step = False
        for index in range(self._next, len(self.buckets)):
            self._launch(index)
        self._next = len(self.buckets)
        for index, bucket in enumerate(self.buckets):
            work, flat, no_gradient = self._pending[index]
            work.wait()
            unflatten_into_gradients(flat, bucket, keep_none=no_gradient, divide_by=self.world)  # sum -> average
        self._pending = {}


def accumulation_step(ddp: OverlappedDDP, optimizer, micro_batches, loss_fn, sync_forward: bool = True) -> float:
    """One optimizer step over several micro-batches, communicating only on the last one.

    Each micro-batch's loss is divided by their number, so the accumulated gradient is the
    gradient of the mean loss over all of them. ``sync_forward=False`` reproduces the classic
    bug: ``no_sync()`` wraps only ``backward``, the forward already decided to communicate, and
    every micro-step all-reduces. Returns the mean loss.
    """
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    k = len(micro_batches)
    for i, micro in enumerate(micro_batches):
        last = i == k - 1
        if last:
            loss = loss_fn(ddp, micro) / k
            loss.backward()
        elif sync_forward:
            with ddp.no_sync():                        # right: forward and backward inside
                loss = loss_fn(ddp, micro) / k
                loss.backward()
        else:
            loss = loss_fn(ddp, micro) / k             # wrong: forward outside no_sync
            with ddp.no_sync():
                loss.backward()
        total += loss.item()
        if not last and ddp._sync_this_backward:
            ddp.finish()  # the bug: this micro-step did communicate; collect its averages
    ddp.finish()
    optimizer.step()
    return total
