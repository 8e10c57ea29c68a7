"""The unit of ZeRO sharding: a group of parameters laid end to end in one flat buffer, cut in N.

Each rank *owns* one ``1/N`` slice of every unit and is the only one to update it. A unit is,
by default, one layer (:func:`default_units`: each child of the model, each block of a
ModuleList). Its flat buffer is padded with zeros to a multiple of ``N`` so that it splits
into ``N`` equal slices (:class:`FlatUnit`): any parameter count works. PyTorch's FSDP works
the same way (its units are the modules you call ``fully_shard`` on).

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
    """A unit's trainable parameters laid end to end in one flat buffer, cut into ``world`` slices.

    ``numel`` real elements are padded with zeros to ``padded = world * shard_numel`` so that
    the slices are equal; rank ``r`` owns elements ``[r * shard_numel, (r + 1) * shard_numel)``.
    """

    def __init__(self, module: nn.Module, rank: int, world: int):
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
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

    def point_parameters_at(self, flat: torch.Tensor) -> None:
        """Make every parameter a view into ``flat``: writing the buffer changes the model's weights."""
        offset = 0
        for p in self.params:
            p.data = flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The inverse of :meth:`flatten`: one tensor per parameter (views into ``flat``)."""
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()
        return out


def make_units(model: nn.Module, units=None) -> list[FlatUnit]:
    rank, world = dist.get_rank(), dist.get_world_size()
    return [FlatUnit(module, rank, world) for module in (units if units is not None else default_units(model))]


# -- the two collectives -----------------------------------------------------------------------

def reduce_scatter_gradients(unit: FlatUnit) -> torch.Tensor:
    """The average over ranks of this rank's slice of the unit's gradients: one reduce-scatter.

    Every rank contributes its full local gradient; each receives only the average of its own
    slice. The bytes on the wire are half an all-reduce's.
    """
    flat = unit.flatten([p.grad for p in unit.params])
    mine = flat.new_empty(unit.shard_numel)
    dist.reduce_scatter_single(mine, flat, op=dist.ReduceOp.AVG)
    return mine


def all_gather_parameters(unit: FlatUnit, shard: torch.Tensor, full: torch.Tensor) -> None:
    """Fill ``full`` (the unit's flat buffer) with every rank's slice: one all-gather.

    The slice is copied first, since it may be a view into ``full`` itself (ZeRO-1 and 2).
    """
    with torch.no_grad():
        dist.all_gather_single(full, shard.detach().clone())


def padded_numel(model: nn.Module, world: int, units=None) -> int:
    """Elements of all units' flat buffers once padded to a multiple of ``world``."""
    modules = units if units is not None else default_units(model)
    return sum(math.ceil(sum(p.numel() for p in m.parameters() if p.requires_grad) / world) * world for m in modules)
