"""ZeRO-3 as a module wrapper: a rank holds a slice of the weights, and a layer's full weights
exist only while that layer computes.

The shape of torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): the *model* is what is
sharded, and an ordinary optimizer built outside steps it::

    sharded = FullyShardedModel(model)                    # on every rank, the same initial weights
    optimizer = torch.optim.AdamW(sharded.parameters())   # sees only this rank's fp32 slices
    loss_fn(sharded, batch).backward()                    # gathers, frees, reduce-scatters in here
    optimizer.step()                                      # updates the slices: no communication
    optimizer.zero_grad()

The model is cut into units, one per layer (:func:`~distlab.zero.flat.default_units`), and
each unit into ``N`` slices (:class:`~distlab.zero.flat.FlatUnit`). ``parameters()`` yields
only this rank's slice of each unit, an fp32 ``nn.Parameter``: that is all the optimizer sees,
so the optimizer state is sharded too, without the optimizer knowing. The model's own
parameters stay where they are (its code is untouched), but become views into the unit's
*gathered buffer*, whose memory is released (its storage resized to 0 bytes) except while the
unit computes. Hooks on each unit:

* before forward: all-gather the full weights into the buffer (:meth:`FullyShardedModel.gather`);
* after forward: release them (:meth:`FullyShardedModel.release`), and put a hook on the
  unit's output, which autograd calls when the gradient of that output is ready, that is,
  just before the unit's backward: all-gather again;
* when the unit's last parameter gradient is complete: reduce-scatter the gradients, add
  this rank's averaged slice to its shard's ``.grad``, drop the full gradients, release.

Per step that is two all-gathers and one reduce-scatter: ``3 (N-1)/N S`` bytes per rank, 1.5
times DDP's traffic, for ``1/N`` of all model states plus the full weights of one unit at a
time (at most two, at a unit boundary in backward; ``peak_gathered_bytes`` records it).

``compute_dtype=torch.bfloat16`` is mixed precision as FSDP2 does it with
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: the gathered
buffers (and so the all-gathers) are bf16, forward and backward compute in bf16 (floating-point
inputs of a unit are cast to it), the gradients are averaged in fp32, and the slices the
optimizer updates stay fp32 master weights.

Kept out, to stay readable: prefetching the next unit's all-gather while the current one
computes (what makes ZeRO-3 fast on GPUs), parameters shared by two units (tied weights; put
both users in one unit), a unit whose parameters do not all get a gradient in a backward
(FSDP2 finishes such units in a callback at the end of backward), ``state_dict`` (use
:meth:`FullyShardedModel.full_parameters`), and broadcasting: as with FSDP2 every rank must
start from the same weights (the same seed, or :func:`distlab.data_parallel.naive.broadcast_parameters`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.zero.flat import FlatUnit, WhenGradientsReady, all_gather_parameters, default_units, reduce_scatter_into


class FullyShardedModel(nn.Module):
    """``model`` with each unit's weights sharded over the ranks and gathered only while it computes.

    Args:
        model: the model, with the same weights on every rank.
        compute_dtype: the dtype forward and backward run in (``torch.bfloat16``), or ``None``
            for the parameters' own (fp32).
        units: the modules that are gathered as one; default one per layer.

    ``peak_gathered_bytes`` is the most full-weight bytes held at once so far (set it to 0 to
    measure anew); :meth:`full_parameters` and :meth:`full_gradients` put whole tensors back
    together under the model's own names.
    """

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype | None = None, units=None):
        super().__init__()
        self.module = model
        self.compute_dtype = compute_dtype
        rank, world = dist.get_rank(), dist.get_world_size()
        modules = units if units is not None else default_units(model)
        self.units = [FlatUnit(module.parameters(), rank, world) for module in modules]
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.shards = nn.ParameterList()   # this rank's fp32 slice of each unit: the only parameters
        self.full = []                     # each unit's full weights, in compute dtype, freed between uses
        for index, (module, unit) in enumerate(zip(modules, self.units)):
            flat = unit.flatten([p.detach() for p in unit.params])
            self.shards.append(nn.Parameter(flat[unit.mine()].clone()))   # a copy: it outlives `flat`
            buffer = flat.to(compute_dtype or flat.dtype)
            unit.point_parameters_at(buffer)                                # the model computes with these
            self.full.append(buffer)
            module.register_forward_pre_hook(lambda module, args, i=index: self.before_forward(i, args))
            module.register_forward_hook(lambda module, args, output, i=index: self.after_forward(i, output))
        self.gathered = [True] * len(self.units)
        self.gathered_bytes = sum(buffer.untyped_storage().nbytes() for buffer in self.full)
        for index in range(len(self.units)):
            self.release(index)                                             # from now on: 1/N of everything
        self.peak_gathered_bytes = 0
        self.hooks = WhenGradientsReady(self.units, self.reduce_unit)      # ZeRO-2's hooks, once more

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """Only this rank's fp32 slices, ``shards.0``, ``shards.1``... (one per unit): what an optimizer steps.

        The model's own parameters are views into buffers that exist only while their unit
        computes; an optimizer must never see them. (``parameters()`` calls this.)
        """
        return self.shards.named_parameters(prefix=f"{prefix}.shards" if prefix else "shards",
                                            remove_duplicate=remove_duplicate)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- the full weights of a unit come and go ------------------------------------------------

    def gather(self, index: int) -> None:
        """Give unit ``index``'s buffer its memory back and all-gather the full weights into it."""
        if self.gathered[index]:
            return
        buffer = self.full[index]
        buffer.untyped_storage().resize_(buffer.numel() * buffer.element_size())
        all_gather_parameters(self.shards[index], buffer)
        self.gathered[index] = True
        self.gathered_bytes += buffer.untyped_storage().nbytes()
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def release(self, index: int) -> None:
        """Free unit ``index``'s full weights; its parameters keep their shapes but hold no memory."""
        if not self.gathered[index]:
            return
        storage = self.full[index].untyped_storage()
        self.gathered_bytes -= storage.nbytes()
        storage.resize_(0)
        self.gathered[index] = False

    def before_forward(self, index: int, args: tuple):
        """The unit is about to run: gather its weights (and cast floating inputs to the compute dtype)."""
        self.gather(index)
        if self.compute_dtype is None:
            return None
        return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def after_forward(self, index: int, output) -> None:
        """The unit has run: free its weights until backward reaches it, which a hook on its output notices."""
        self.release(index)
        for out in (output if isinstance(output, (tuple, list)) else [output]):
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad, i=index: self.gather(i))   # backward reaches this unit

    def reduce_unit(self, index: int) -> None:
        """From a gradient hook: the unit's gradients are complete. Reduce-scatter them, free the weights."""
        reduce_scatter_into(self.units[index], self.shards[index])
        self.release(index)

    # -- whole tensors, for checking and checkpoints (collectives: call them on every rank) ------

    def _gather_slices(self, slices) -> dict[str, torch.Tensor]:
        """``{name: whole tensor}`` from this rank's slice of each unit (``None``: the unit is left out)."""
        out = {}
        for unit, mine in zip(self.units, slices):
            if mine is None:
                continue
            flat = mine.new_empty(unit.padded)
            dist.all_gather_single(flat, mine.detach())
            out.update({self.names[id(p)]: whole.clone() for p, whole in zip(unit.params, unit.unflatten(flat))})
        return out

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{the model's parameter name: full fp32 tensor}``, all-gathered from the slices."""
        return self._gather_slices(list(self.shards))

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """``{the model's parameter name: full averaged gradient}``, all-gathered from the slices' ``.grad``."""
        return self._gather_slices([shard.grad for shard in self.shards])
