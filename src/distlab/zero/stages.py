"""The four stages side by side, built from this package's pieces: what the book and the benchmark compare.

=======================  ============================  =================================================
stage                    the module to call            the optimizer
=======================  ============================  =================================================
0 (DDP)                  ``OverlappedDDP(model)``      ``AdamW(model.parameters())``: full states
1                        ``model``                     ``ShardedOptimizer(..., average_gradients=True)``
1, ``beside_ddp=True``   ``OverlappedDDP(model)``      ``ShardedOptimizer(ddp.parameters())``
2                        ``model``                     ``ShardedOptimizer(..., shard_gradients=True)``
3                        ``FullyShardedModel(model)``  ``AdamW(sharded.parameters())``: slices only
=======================  ============================  =================================================

Stages 1 and 2 shard the *optimizer* (torch's ``ZeroRedundancyOptimizer`` has this shape; it
is used beside DDP, which ``beside_ddp=True`` reproduces, at 1.5 times DDP's traffic), stage 3
the *model* (torch's FSDP2 ``fully_shard`` has this shape). Every stage is then trained by the
same loop (:func:`train_step`)::

    module, optimizer = build(stage, model, lr=1e-3)
    loss = train_step(module, optimizer, my_shard_of_the_batch, loss_fn)

and :func:`held_bytes` counts the model states a rank holds under any of them,
:func:`full_parameters` gathers the weights back.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from distlab.data_parallel.naive import broadcast_parameters
from distlab.data_parallel.overlap import OverlappedDDP
from distlab.tools import memory
from distlab.zero.fully_shard import FullyShardedModel
from distlab.zero.optimizer import ShardedOptimizer


def build(stage: int, model: nn.Module, optimizer_class=torch.optim.AdamW, bucket_mb: float = 25.0,
          beside_ddp: bool = False, **options) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``(the module to call, the optimizer)`` for ZeRO ``stage`` (0 = DDP) around ``model``.

    Every stage starts from rank 0's weights (one broadcast), as DDP does. ``bucket_mb`` sizes
    DDP's buckets and the sharded optimizer's; ``options`` go to ``optimizer_class``.
    ``beside_ddp=True`` (stage 1 only): the sharded optimizer next to DDP, which averages the
    gradients, as torch's ``ZeroRedundancyOptimizer`` is used.
    """
    if beside_ddp and stage != 1:
        raise ValueError("beside_ddp is ZeRO-1 (a sharded optimizer next to DDP): stage must be 1")
    broadcast_parameters(model)
    if stage == 0 or beside_ddp:
        ddp = OverlappedDDP(model, bucket_mb=bucket_mb, broadcast=False)
        optimizer = optimizer_class(ddp.parameters(), **options) if stage == 0 else \
            ShardedOptimizer(ddp.parameters(), optimizer_class, bucket_mb=bucket_mb, **options)
        optimizer.register_step_pre_hook(lambda *_: ddp.finish())   # wait for DDP's all-reduces first
        return ddp, optimizer
    if stage in (1, 2):
        return model, ShardedOptimizer(model.parameters(), optimizer_class, average_gradients=stage == 1,
                                       shard_gradients=stage == 2, bucket_mb=bucket_mb, **options)
    if stage == 3:
        sharded = FullyShardedModel(model)
        return sharded, optimizer_class(sharded.parameters(), **options)
    raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")


def train_step(module: nn.Module, optimizer, batch, loss_fn) -> float:
    """One step on this rank's ``batch``: zero the gradients, forward, backward, update. Returns the loss."""
    optimizer.zero_grad()
    loss = loss_fn(module, batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def full_parameters(module: nn.Module, model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: full tensor}``: the model's weights under any stage (ZeRO-3 all-gathers them: a collective)."""
    if isinstance(module, FullyShardedModel):
        return module.full_parameters()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def held_bytes(module: nn.Module, optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds now, under any stage.

    The module's parameters and their gradients, the optimizer's state, and, for the sharded
    optimizer, its slices (views into the model's buffers, so they count once) and their
    gradients (in ZeRO-2 the only gradients left).
    """
    slices = getattr(optimizer, "shards", [])
    return memory.model_state_bytes(module, optimizer, parameters=slices, gradients=[s.grad for s in slices])
