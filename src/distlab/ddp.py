"""Distributed data parallelism (DDP) from scratch, in three steps of increasing speed.

Every rank holds a full copy of the model and trains on its own shard of the batch. If the
copies start equal and every rank applies the *average* of all ranks' gradients, the copies
stay equal, and each step is exactly the step a single process would take on the whole batch
(the mean loss over a batch is the mean of the shards' mean losses when the shards are equal
in size, and the gradient of a mean is the mean of the gradients).

1. **Naive** (:func:`broadcast_parameters`, :func:`average_gradients`): after ``backward``,
   one ``all_reduce`` per parameter. Correct, but a model with hundreds of parameter tensors
   pays the fixed cost (latency) of a collective hundreds of times per step.
2. **Bucketed** (:func:`plan_buckets`, :func:`bucketed_average`): copy the gradients into a few
   flat buffers of about ``bucket_mb`` megabytes each and all-reduce each buffer once: fewer,
   larger messages.
3. **Overlapped** (:class:`OverlappedDDP`): a gradient hook on every parameter notices when
   its gradient is final; as soon as every gradient of a bucket is final, the bucket's
   all-reduce is launched *asynchronously* while backward goes on computing the gradients of
   the earlier layers. Before the optimizer step, :meth:`OverlappedDDP.finish` waits for the
   outstanding all-reduces and copies the averages back.

Gradient accumulation: with ``k`` micro-batches per step there is no need to communicate
after each of them; summing the local gradients and averaging once gives the same result.
:meth:`OverlappedDDP.no_sync` skips the communication. Like torch's DDP, this class decides
*in forward* whether the following backward communicates, so the ``no_sync`` block has to
wrap the forward pass, not just ``backward`` (:data:`SYNC_DECIDED_IN_FORWARD` explains why and
chapter 3 shows the bug that results otherwise).

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

MB = 2**20


# -- 1. naive ---------------------------------------------------------------------------------------

def broadcast_parameters(model: torch.nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to rank ``src``'s (one broadcast each).

    Without this, ranks that initialised their weights with different random seeds would
    train different models, and averaging their gradients would mean nothing.
    """
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=src)


def average_gradients(model: torch.nn.Module) -> None:
    """Replace every gradient by its average over all ranks: one ``all_reduce`` per parameter."""
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world


def naive_step(model, optimizer, batch, loss_fn) -> float:
    """One naive DDP training step on this rank's shard ``batch``; returns the local loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    average_gradients(model)
    optimizer.step()
    return loss.item()


# -- 2. bucketed ------------------------------------------------------------------------------------

def plan_buckets(params, bucket_mb: float) -> list[list[torch.nn.Parameter]]:
    """Group parameters into buckets of at most ``bucket_mb`` megabytes.

    Parameters are taken in *reverse* order of definition, because backward computes the
    gradients of the last layers first: the first bucket is then the first to be complete.
    A bucket is closed when the next parameter would overflow it, or has another dtype (one
    flat buffer holds one dtype). A parameter larger than the cap gets a bucket of its own.
    Parameters that do not require gradients (frozen) are left out.
    """
    cap = bucket_mb * MB
    buckets: list[list[torch.nn.Parameter]] = []
    size = 0.0
    for param in reversed([p for p in params if p.requires_grad]):
        nbytes = param.numel() * param.element_size()
        current = buckets[-1] if buckets else None
        if current is None or size + nbytes > cap or current[0].dtype != param.dtype:
            buckets.append([param])
            size = nbytes
        else:
            current.append(param)
            size += nbytes
    return buckets


def flatten_gradients(bucket) -> torch.Tensor:
    """One flat tensor with the bucket's gradients end to end (zeros where a gradient is None)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])


def unflatten_into_gradients(flat: torch.Tensor, bucket, keep_none: set | None = None) -> None:
    """Copy consecutive slices of ``flat`` back into each parameter's ``.grad`` (the inverse of
    :func:`flatten_gradients`). Parameters in ``keep_none`` (by ``id``) keep ``grad = None``."""
    offset = 0
    for param in bucket:
        piece = flat[offset: offset + param.numel()].view_as(param)
        offset += param.numel()
        if keep_none and id(param) in keep_none:
            param.grad = None
        elif param.grad is None:
            param.grad = piece.clone()
        else:
            param.grad.copy_(piece)


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


# -- 3. overlapped ----------------------------------------------------------------------------------

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

    ``tracer`` (a :class:`distlab.trace.Tracer`, optional) receives one event per bucket
    all-reduce, from launch to completion, for the timeline figure.
    """

    def __init__(self, model: torch.nn.Module, bucket_mb: float = 25.0, tracer=None, broadcast: bool = True):
        super().__init__()
        self.module = model
        self.tracer = tracer
        self.world = dist.get_world_size()
        if broadcast:
            broadcast_parameters(model)
        self.buckets = plan_buckets(model.parameters(), bucket_mb)
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
        flat = flatten_gradients(bucket)
        flat /= self.world  # divide first: then the sum is already the average
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
            unflatten_into_gradients(flat, bucket, keep_none=no_gradient)
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


def loss_fn(model, batch) -> torch.Tensor:
    """:func:`distlab.models.loss_fn` for a model inside a wrapper (this module's or torch's DDP,
    both keep the model in ``.module``): the forward pass goes through the wrapper."""
    from distlab import models

    inner = getattr(model, "module", model)
    if isinstance(inner, models.TinyGPT) and inner is not model:
        inputs, targets = batch
        logits = model(inputs)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return models.loss_fn(model, batch)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """``{name: copy of the gradient}`` of every parameter (``None`` where there is none)."""
    return {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}
