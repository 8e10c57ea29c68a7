"""The unit of ZeRO sharding: a group of parameters laid end to end in one flat buffer, cut in N.

Each rank *owns* one ``1/N`` slice of every unit and is the only one to update it. The flat
buffer is padded with zeros to a multiple of ``N`` so that it splits into ``N`` equal slices
(:class:`FlatUnit`): any parameter count works. What a unit is depends on who cuts:

* the sharded optimizer (:mod:`.optimizer`, ZeRO-1 and 2) cuts each param group into
  buckets of a few megabytes (:func:`distlab.data_parallel.buckets.plan_buckets`, as DDP does);
* the fully sharded model (:mod:`.fully_shard`, ZeRO-3) takes one unit per layer
  (:func:`default_units`: each child of the model, each block of a ModuleList), since a
  layer's weights are gathered when the layer runs. PyTorch's FSDP2 works the same way (its
  units are the modules you call ``fully_shard`` on).

The two collectives every ZeRO stage is made of: a *reduce-scatter* of a unit's gradients
(each rank receives the average of its own slice only, :func:`reduce_scatter_gradients`) and
an *all-gather* of the slices back into the full buffer (:func:`all_gather_parameters`). A
reduce-scatter plus an all-gather is exactly what a ring all-reduce sends (chapter 2).

The collectives are ``dist.reduce_scatter_single`` and ``dist.all_gather_single``: torch 2.13's
names for ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (which still work, with a
deprecation warning). Both work on gloo (CPU) and NCCL. Gradients are averaged with
``ReduceOp.AVG``, which gloo and NCCL both support.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn


def default_units(model: nn.Module) -> list[nn.Module]:
    """One unit per layer: each child of ``model``, and each element of a child ``ModuleList``.

    For TinyGPT that is the token embedding, the position embedding, every transformer block,
    the final LayerNorm and the head. Children without trainable parameters are skipped.
    """
    units = []
    for child in model.children():
        for module in (child if isinstance(child, nn.ModuleList) else [child]):
            if any(p.requires_grad for p in module.parameters()):
                units.append(module)
    covered = [id(p) for unit in units for p in unit.parameters() if p.requires_grad]
    if len(covered) != len(set(covered)):
        raise ValueError("a parameter belongs to two units (tied weights?): put both users in one unit")
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in set(covered)]
    if missing:
        raise ValueError(f"parameters outside every unit (directly on the model?): {missing}; pass units= explicitly")
    return units


class FlatUnit:
    """Some trainable parameters laid end to end in one flat buffer, cut into ``world`` slices.

    ``numel`` real elements are padded with zeros to ``padded = world * shard_numel`` so that
    the slices are equal; rank ``r`` owns elements ``[r * shard_numel, (r + 1) * shard_numel)``.
    Parameters that do not require gradients (frozen) are left out.
    """

    def __init__(self, params, rank: int, world: int):
        self.params = [p for p in params if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / world)
        self.padded = self.shard_numel * world
        self.rank, self.world = rank, world

    def mine(self) -> slice:
        """This rank's slice of the flat buffer."""
        return slice(self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel)

    def flatten(self, tensors) -> torch.Tensor:
        """The tensors (one per parameter; ``None`` means zeros) end to end, zero-padded to ``padded``."""
        parts = [(t if t is not None else torch.zeros_like(p)).reshape(-1) for t, p in zip(tensors, self.params)]
        parts.append(parts[0].new_zeros(self.padded - self.numel))
        return torch.cat(parts)

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The inverse of :meth:`flatten`: one tensor per parameter (views into ``flat``)."""
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset: offset + p.numel()].view(p.shape))
            offset += p.numel()
        return out

    def point_parameters_at(self, flat: torch.Tensor) -> None:
        """Make every parameter a view into ``flat``: writing the buffer changes the model's weights.

        ``p.data = view`` keeps the parameter object (the model, its hooks and an optimizer
        still hold it) and changes only the memory behind it.
        """
        for p, view in zip(self.params, self.unflatten(flat)):
            p.data = view


def padded_numel(model: nn.Module, world: int, units=None) -> int:
    """Elements of the per-layer units' flat buffers once padded to a multiple of ``world`` (ZeRO-3)."""
    modules = units if units is not None else default_units(model)
    return sum(FlatUnit(m.parameters(), 0, world).padded for m in modules)


# -- the two collectives -----------------------------------------------------------------------

def reduce_scatter_gradients(unit: FlatUnit) -> torch.Tensor:
    """The average over ranks of this rank's slice of the unit's gradients: one reduce-scatter.

    Every rank contributes its full local gradient; each receives only the average of its own
    slice, in float32 (bf16 gradients are converted first, so the sum does not lose bits).
    The bytes on the wire are half an all-reduce's.
    """
    flat = unit.flatten([p.grad for p in unit.params]).float()
    mine = flat.new_empty(unit.shard_numel)
    dist.reduce_scatter_single(mine, flat, op=dist.ReduceOp.AVG)
    return mine


def all_gather_parameters(shard: torch.Tensor, full: torch.Tensor) -> None:
    """Fill ``full`` (a unit's flat buffer) with every rank's slice: one all-gather.

    The slice is copied first (converted to ``full``'s dtype, e.g. bf16 for compute), since it
    may be a view into ``full`` itself (the sharded optimizer's slices are).
    """
    with torch.no_grad():
        dist.all_gather_single(full, shard.detach().to(full.dtype, copy=True))


def reduce_scatter_into(unit: FlatUnit, shard: torch.Tensor) -> None:
    """Add this rank's averaged gradient slice to ``shard.grad``, then drop the unit's full gradients.

    *Added*: several backwards before one step (gradient accumulation) sum up, as ``.grad``
    does. Used by ZeRO-2 and ZeRO-3 from their gradient hooks, while backward goes on.
    """
    mine = reduce_scatter_gradients(unit)
    shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
    for p in unit.params:
        p.grad = None


class WhenGradientsReady:
    """Call ``callback(index)`` during backward once every parameter of unit ``index`` has its gradient.

    A hook on every parameter (``register_post_accumulate_grad_hook``, which autograd calls
    once the parameter's ``.grad`` is complete for this backward) records it as ready; when
    the unit's last one is, the callback runs. The callback is expected to consume the
    gradients (set them to ``None``): the next backward starts counting afresh.

    The units complete in the order backward reaches them, which must be the same on every
    rank (the same graph everywhere, as for DDP), or the collectives pair up wrongly.
    """

    def __init__(self, units: list[FlatUnit], callback):
        self.units, self.callback = units, callback
        self.unit_of = {id(p): index for index, unit in enumerate(units) for p in unit.params}
        self.ready = [set() for _ in units]
        for unit in units:
            for p in unit.params:
                p.register_post_accumulate_grad_hook(self.on_gradient_ready)

    def on_gradient_ready(self, param: nn.Parameter) -> None:
        index = self.unit_of[id(param)]
        self.ready[index].add(id(param))
        if len(self.ready[index]) == len(self.units[index].params):
            self.ready[index].clear()
            self.callback(index)

    def incomplete(self) -> list[int]:
        """Units some of whose parameters got a gradient but not all (a parameter unused in forward)."""
        return [index for index, ready in enumerate(self.ready) if ready]

    def clear(self) -> None:
        for ready in self.ready:
            ready.clear()
