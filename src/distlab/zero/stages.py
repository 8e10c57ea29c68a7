"""ZeRO from scratch: stop every rank from holding a full copy of everything.

Data parallelism replicates the model states (parameters, gradients, Adam's two moments) on
all ``N`` ranks: 16 bytes per parameter each (see :mod:`distlab.zero.theory`). ZeRO
(Rajbhandari et al., 2020) keeps the data parallelism and removes the redundancy in three
stages. Each rank *owns* one ``1/N`` slice of every parameter and is the only one to update it:

1. **ZeRO-1** (:class:`ZeRO1`): the optimizer state is sharded. Gradients are averaged with
   a *reduce-scatter* (each rank receives the average of its own slice only), each rank runs
   AdamW on its slice, and an *all-gather* hands the updated slices to everyone. A
   reduce-scatter plus an all-gather is exactly what a ring all-reduce sends (chapter 2), so
   this costs DDP's traffic and saves 3/4 of Adam's memory at large ``N``.
2. **ZeRO-2** (:class:`ZeRO2`): the gradients too. The reduce-scatter of a layer's gradients
   is issued during backward, as soon as they are complete, and the full gradients are
   dropped at once: each rank keeps only its gradient slice. Same traffic again.
3. **ZeRO-3** (:class:`ZeRO3`): the parameters too. A rank holds only its slice of the
   weights; just before a layer runs forward, its full weights are all-gathered, and freed
   again after; the same happens before the layer's backward. Per step that is two
   all-gathers and one reduce-scatter: 1.5x DDP's traffic, for 1/N of all model states.

The unit of sharding is a *unit*: a group of parameters flattened into one buffer, by default
one per layer (:func:`default_units`: each child of the model, each block of a ModuleList).
A unit's flat buffer is padded with zeros to a multiple of ``N`` so that it splits into ``N``
equal slices (:class:`FlatUnit`): any parameter count works. PyTorch's FSDP works the same
way (its units are the modules you call ``fully_shard`` on).

Every class has the same interface as :class:`Replicated` (plain DDP with the same optimizer,
for comparison)::

    sharded = ZeRO2(model, torch.optim.AdamW, lr=1e-3)   # on every rank; broadcasts rank 0's weights
    loss = loss_fn(model, my_shard_of_the_batch)         # the model is used as is
    loss.backward()
    sharded.step()                                       # reduce, update my slice, gather
    sharded.zero_grad()

The collectives are ``dist.reduce_scatter_single`` and ``dist.all_gather_single``: torch 2.13's
names for ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (which still work, with a
deprecation warning). Both work on gloo (CPU) and NCCL. Gradients are averaged with
``ReduceOp.AVG``, which gloo and NCCL both support.

Kept out, to stay readable: mixed precision, offloading, prefetching the next unit's
all-gather while the current one computes (what makes ZeRO-3 fast in practice), parameters
shared by two units (tied weights; FSDP puts both users in one unit), and frozen parameters
in ZeRO-3 (they stay replicated in every stage here). The graph must be the same on every
rank, as for DDP: the collectives of each unit are issued in the order its gradients
complete, which must agree across ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.data_parallel.buckets import bucketed_average
from distlab.data_parallel.naive import broadcast_parameters
from distlab.tools import memory
from distlab.zero.flat import FlatUnit, all_gather_parameters, make_units, reduce_scatter_gradients

# -- stage 0, for comparison --------------------------------------------------------------------

class Replicated:
    """Plain data parallelism (DDP) with the same interface: full states everywhere, one all-reduce.

    Gradients are averaged with :func:`distlab.data_parallel.buckets.bucketed_average` (one bucket) after
    backward; the optimizer steps all parameters on every rank.
    """

    stage = 0

    def __init__(self, model: nn.Module, optimizer_class=torch.optim.AdamW, units=None, **options):
        self.model = model
        broadcast_parameters(model)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer_class(self.trainable, **options)
        self.reduced = False

    def reduce_gradients(self) -> None:
        """Average the gradients over ranks (here: all of them, everywhere)."""
        bucketed_average(self.model, bucket_mb=float("inf"))
        self.reduced = True

    def step(self) -> None:
        if not self.reduced:
            self.reduce_gradients()
        self.optimizer.step()
        self.reduced = False

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` (a copy) of every parameter."""
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def averaged_gradients(self) -> dict[str, torch.Tensor]:
        """``{name: averaged gradient}`` after :meth:`reduce_gradients`."""
        return {name: p.grad.detach().clone() for name, p in self.model.named_parameters() if p.grad is not None}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer state this rank holds now."""
        return memory.model_state_bytes(self.model, self.optimizer)


# -- stage 1 ------------------------------------------------------------------------------------

class ZeRO1(Replicated):
    """Optimizer state sharded: each rank keeps Adam's moments for its slice of every unit only.

    Per unit, the model's parameters are views into one flat buffer ``full``, and this rank's
    ``shard`` is a view into its own slice of that buffer: the optimizer updates the shard in
    place, and the all-gather then writes every rank's updated slice into ``full``, hence into
    the model. The full gradients stay in ``.grad`` (ZeRO-1 does not shard them); the
    averaged gradient slice exists only during the update.
    """

    stage = 1

    def __init__(self, model: nn.Module, optimizer_class=torch.optim.AdamW, units=None, **options):
        self.model = model
        broadcast_parameters(model)            # everyone starts from rank 0's weights
        self.units = make_units(model, units)
        self.full, self.shards = [], []
        for unit in self.units:
            full = unit.flatten([p.detach() for p in unit.params])
            unit.point_parameters_at(full)
            self.full.append(full)
            self.shards.append(self.make_shard(unit, full))
        self.optimizer = optimizer_class(self.shards, **options)  # sees only this rank's slices
        self.reduced = False

    def make_shard(self, unit: FlatUnit, full: torch.Tensor) -> nn.Parameter:
        """This rank's slice as a parameter the optimizer can update: a view into ``full``."""
        return nn.Parameter(full[unit.mine()])

    def reduce_gradients(self) -> None:
        """Average the gradients over ranks, keeping only this rank's slice of each unit."""
        for unit, shard in zip(self.units, self.shards):
            shard.grad = reduce_scatter_gradients(unit)
        self.reduced = True

    def step(self) -> None:
        if not self.reduced:
            self.reduce_gradients()
        self.optimizer.step()                      # AdamW on 1/N of the elements
        self.gather_parameters()
        self.after_step()
        self.reduced = False

    def gather_parameters(self) -> None:
        """Every rank's updated slices to every rank: the model is whole again."""
        for unit, shard, full in zip(self.units, self.shards, self.full):
            all_gather_parameters(unit, shard, full)

    def after_step(self) -> None:
        for shard in self.shards:                  # stage 1: the averaged slice was only for the update
            shard.grad = None

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)
        for shard in self.shards:
            shard.grad = None

    def averaged_gradients(self) -> dict[str, torch.Tensor]:
        """``{name: averaged gradient}``, assembled from every rank's slice (an all-gather per unit).

        For checking only: it costs communication and builds what ZeRO avoids holding.
        """
        names = {id(p): name for name, p in self.model.named_parameters()}
        out = {}
        for unit, shard in zip(self.units, self.shards):
            if shard.grad is None:
                continue
            flat = shard.grad.new_empty(unit.padded)
            dist.all_gather_single(flat, shard.grad.detach())
            for p, grad in zip(unit.params, unit.unflatten(flat)):
                out[names[id(p)]] = grad.clone()
        return out

    def state_bytes(self) -> dict[str, int]:
        return memory.model_state_bytes(self.model, self.optimizer, parameters=self.shards,
                                        gradients=[s.grad for s in self.shards])


# -- stage 2 ------------------------------------------------------------------------------------

class ZeRO2(ZeRO1):
    """ZeRO-1, and gradients sharded: each unit's gradients are reduce-scattered during backward,
    as soon as the last of them is computed, and the full gradients are dropped right away.

    A hook on every parameter (``register_post_accumulate_grad_hook``, called once its
    ``.grad`` is complete) counts the unit's finished gradients. The full gradients of at most
    one unit exist at a time (the one backward is in), besides this rank's slices.
    """

    stage = 2

    def __init__(self, model: nn.Module, optimizer_class=torch.optim.AdamW, units=None, **options):
        super().__init__(model, optimizer_class, units, **options)
        self.unit_of = {id(p): i for i, unit in enumerate(self.units) for p in unit.params}
        self.ready = [0] * len(self.units)         # finished gradients per unit, this backward
        self.done = [False] * len(self.units)      # unit reduced this step?
        for unit in self.units:
            for p in unit.params:
                p.register_post_accumulate_grad_hook(self.on_gradient_ready)

    def on_gradient_ready(self, param: nn.Parameter) -> None:
        index = self.unit_of[id(param)]
        self.ready[index] += 1
        if self.ready[index] == len(self.units[index].params):
            self.reduce_unit(index)

    def reduce_unit(self, index: int) -> None:
        """Reduce-scatter unit ``index``'s gradients into this rank's slice, then drop them."""
        unit, shard = self.units[index], self.shards[index]
        mine = reduce_scatter_gradients(unit)
        shard.grad = mine if shard.grad is None else shard.grad + mine   # accumulation over backwards
        for p in unit.params:
            p.grad = None
        self.ready[index] = 0
        self.done[index] = True

    def reduce_gradients(self) -> None:
        """Units whose gradients did not all arrive in backward (unused parameters) are reduced now."""
        for index in range(len(self.units)):
            if not self.done[index]:
                self.reduce_unit(index)
        self.reduced = True

    def after_step(self) -> None:
        self.done = [False] * len(self.units)      # stage 2: the gradient slices stay until zero_grad

    def zero_grad(self) -> None:
        super().zero_grad()
        self.ready = [0] * len(self.units)
        self.done = [False] * len(self.units)


# -- stage 3 ------------------------------------------------------------------------------------

class ZeRO3(ZeRO2):
    """ZeRO-2, and parameters sharded: a unit's full weights exist only while it computes.

    Each unit's ``full`` buffer has its memory released (its storage resized to 0 bytes) except
    while the unit runs. The model's parameters stay views into it, so the model code is
    untouched. Hooks on each unit:

    * before forward: all-gather the full weights (:meth:`gather`);
    * after forward: release them (:meth:`release`), and put a hook on the unit's output,
      which autograd calls when the gradient of that output is ready, that is, just before
      the unit's backward: all-gather again;
    * when the unit's last parameter gradient is complete (the stage-2 hook): reduce-scatter
      the gradients into this rank's slice, drop them, and release the weights.

    ``peak_gathered_bytes`` records the most full-weight bytes held at once since the last
    :meth:`reset_peak`: with the per-unit hooks that is the largest unit (two, briefly, at a
    unit boundary in backward, where the next unit's gather runs before the previous release).
    """

    stage = 3

    def __init__(self, model: nn.Module, optimizer_class=torch.optim.AdamW, units=None, **options):
        super().__init__(model, optimizer_class, units, **options)
        self.gathered = [True] * len(self.units)      # every unit starts whole; released below
        self.gathered_bytes = sum(full.untyped_storage().nbytes() for full in self.full)
        for index, unit in enumerate(self.units):
            self.release(index)
            unit.module.register_forward_pre_hook(lambda module, args, i=index: self.gather(i))
            unit.module.register_forward_hook(lambda module, args, output, i=index: self.after_forward(i, output))
        self.reset_peak()

    def make_shard(self, unit: FlatUnit, full: torch.Tensor) -> nn.Parameter:
        """A copy of this rank's slice: ``full`` is about to be released."""
        return nn.Parameter(full[unit.mine()].clone())

    def gather(self, index: int) -> None:
        """Give unit ``index``'s buffer its memory back and all-gather the full weights into it."""
        if self.gathered[index]:
            return
        unit, full = self.units[index], self.full[index]
        full.untyped_storage().resize_(unit.padded * full.element_size())
        all_gather_parameters(unit, self.shards[index], full)
        self.gathered[index] = True
        self.gathered_bytes += unit.padded * full.element_size()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def release(self, index: int) -> None:
        """Free unit ``index``'s full weights; the parameters keep their shapes but hold no memory."""
        if not self.gathered[index]:
            return
        full = self.full[index]
        full.untyped_storage().resize_(0)
        self.gathered[index] = False
        self.gathered_bytes -= self.units[index].padded * full.element_size()

    def after_forward(self, index: int, output) -> None:
        self.release(index)
        outputs = output if isinstance(output, (tuple, list)) else [output]
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad, i=index: self.gather(i))   # backward reaches this unit

    def reduce_unit(self, index: int) -> None:
        super().reduce_unit(index)
        self.release(index)

    def reset_peak(self) -> None:
        self.peak_gathered_bytes = self.gathered_bytes

    def gather_parameters(self) -> None:
        """Nothing to do after the update: each unit is gathered when it is next used."""

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}``, gathered unit by unit (communication; for checking)."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        out = {name: p.detach().clone() for name, p in self.model.named_parameters() if not p.requires_grad}
        for index, unit in enumerate(self.units):
            was_gathered = self.gathered[index]
            self.gather(index)
            out.update({names[id(p)]: p.detach().clone() for p in unit.params})
            if not was_gathered:
                self.release(index)
        return {name: out[name] for name, _ in self.model.named_parameters()}


STAGES = {0: Replicated, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}


def make(stage: int, model: nn.Module, optimizer_class=torch.optim.AdamW, units=None, **options):
    """The data-parallel wrapper for ZeRO ``stage`` (0 = plain DDP) around ``model``."""
    return STAGES[stage](model, optimizer_class, units, **options)


def train_step(sharded, batch, loss_fn) -> float:
    """One step on this rank's ``batch``: zero the gradients, forward, backward, update. Returns the loss."""
    sharded.zero_grad()
    loss = loss_fn(sharded.model, batch)
    loss.backward()
    sharded.step()
    return loss.item()
