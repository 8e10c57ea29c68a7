"""Naive data parallelism: the same weights everywhere, then one all-reduce per gradient.

Every rank holds a full copy of the model and trains on its own shard of the batch. If the
copies start equal (:func:`broadcast_parameters`) and every rank applies the *average* of all
ranks' gradients (:func:`average_gradients`), the copies stay equal, and each step is exactly
the step a single process would take on the whole batch. Correct, but a model with hundreds
of parameter tensors pays the fixed cost (latency) of a collective hundreds of times per step:
:mod:`.buckets` is the fix.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


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
