"""ZeRO-3 in torch's FSDP2 form: ``fully_shard`` per block and on the root, each parameter cut by rows.

Code written for ``torch.distributed.fsdp`` runs on this one by changing its import only::

    from distlab.zero.fsdp2 import MixedPrecisionPolicy, fully_shard   # was: from torch.distributed.fsdp import ...

    for block in model.blocks:
        fully_shard(block)                         # one group: all-gathered and reduce-scattered together
    fully_shard(model)                             # the root: the embeddings, the final norm, the head
    optimizer = torch.optim.AdamW(model.parameters())   # the model's own parameters, now its shards
    loss_fn(model, batch).backward()               # the .grad of each is its averaged shard
    optimizer.step()
    full = {name: p.full_tensor() for name, p in model.state_dict().items()}   # a collective

After ``fully_shard`` a module's parameters are this rank's rows of each weight
(:mod:`.row_shards`), as ``Shard(0)`` :class:`~torch.distributed.tensor.DTensor` on a 1-D
mesh of the ranks. DTensor rather than a plain tensor of the same rows, because a plain
tensor of 3 rows cannot say that it is rows 3 to 5 of a ``(9, 4)`` weight: the DTensor
carries the full shape and the placement, so ``p.full_tensor()`` gathers it, ``p.shape`` is
the model's, and torch's own code (``clip_grad_norm_``, ``state_dict``, distributed
checkpoints) treats it as a sharded parameter, which is what code written for FSDP2 expects.
Each ``fully_shard(module)`` makes one group of the parameters under ``module`` that no
earlier call took (call it bottom-up), and hooks on ``module``:

* **before forward**: all-gather the group (one collective) and put the full parameters in
  the module's place; with a :class:`MixedPrecisionPolicy`, in ``param_dtype``, and cast the
  module's floating-point inputs to it;
* **after forward**: put the shards back and free the full rows, unless
  ``reshard_after_forward`` is false (the default, ``None``, is false for the root, which
  backward needs at once, and true for every other group); hook the outputs: their gradient
  is the sign that backward reaches this group, which all-gathers it again;
* **when the group's last gradient is ready** (:class:`~distlab.zero.flat.WhenGradientsReady`,
  ZeRO-2's hooks): reduce-scatter the gradients (in ``reduce_dtype``) onto the shards' ``.grad``
  and free the full rows. A callback at the end of backward does it for groups some of whose
  parameters got no gradient.

**Prefetch**: in backward, the group that backward reaches next is the one whose forward ran
just before: when group ``i``'s backward starts, group ``i - 1``'s all-gather is started
with ``async_op=True`` (gloo runs it on its own thread, NCCL on its own stream), so it moves
while group ``i`` computes. In forward, :meth:`FSDPModule.set_modules_to_forward_prefetch`
asks for the same (torch overlaps the forward with CUDA streams instead, which a CPU has not).

Kept out: ``reshard_after_forward`` as a smaller world size, 2-D meshes (HSDP), CPU offload,
``set_requires_gradient_sync`` and the other tuning methods. As with torch, every rank must
build the same initial weights; the parameters stay on the device they are on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.zero import row_shards
from distlab.zero.flat import WhenGradientsReady


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """torch's ``MixedPrecisionPolicy``: compute in ``param_dtype``, average gradients in ``reduce_dtype``.

    The shards (the optimizer's master weights) keep their own dtype. ``None`` means "the
    parameters' own"; ``output_dtype`` casts the module's floating-point outputs.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


def _cast(value, dtype):
    """Floating-point tensors in ``value`` (nested in tuples, lists, dicts) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _tensors(value):
    """The tensors in ``value`` (nested in tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


class Iteration:
    """What the groups under one root share: the order forward ran in, and the end-of-backward callback."""

    def __init__(self):
        self.groups: list[ParamGroup] = []
        self.forward_order: list[ParamGroup] = []
        self.callback_queued = False

    def end_of_backward(self) -> None:
        """Reduce what the gradient hooks did not (groups with an unused parameter), free everything."""
        for group in reversed(self.groups):
            if group.unsharded or group.pending is not None:
                group.reduce_gradients()
            if group.hooks is not None:
                group.hooks.clear()
            group.in_backward = False
        self.forward_order.clear()
        self.callback_queued = False


class ParamGroup:
    """The parameters one ``fully_shard`` call took: gathered, freed and reduced together."""

    def __init__(self, module: nn.Module, mesh, reshard_after_forward, mp_policy: MixedPrecisionPolicy):
        self.module, self.mp_policy = module, mp_policy
        self.reshard_after_forward = reshard_after_forward      # None: decided at the first forward
        self.shards, self.owners = [], []                       # owners[i]: where shards[i] lives in the model
        for owner, name, param in _unmanaged_parameters(module):
            self.shards.append(row_shards.RowShard(param, mesh, mp_policy.param_dtype))
            self.owners.append((owner, name))
        self.unsharded, self.pending, self.in_backward = False, None, False
        self.iteration, self.is_root = None, False              # set at the first forward (the root's)
        self.forward_prefetch, self.backward_prefetch = [], None
        self._place(sharded=True)
        self.hooks = None                                       # WhenGradientsReady, once the full rows exist

    def _place(self, sharded: bool) -> None:
        for (owner, name), shard in zip(self.owners, self.shards):
            setattr(owner, name, shard.sharded if sharded else shard.unsharded)

    # -- gather and free ---------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        """Start the all-gather (or do nothing if the full parameters are there or on their way)."""
        if self.unsharded or self.pending is not None or not self.shards:
            return
        self.pending = row_shards.all_gather(self.shards, async_op=async_op)
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self) -> None:
        """Finish the all-gather, copy out, and let the module compute with the full parameters."""
        if self.pending is None:
            return
        work, receive = self.pending
        if work is not None:
            work.wait()
        row_shards.copy_out(self.shards, receive)
        self.pending, self.unsharded = None, True
        if self.hooks is None:
            trainable = [s.unsharded for s in self.shards if s.requires_grad]
            self.hooks = WhenGradientsReady([_Unit(trainable)], lambda _: self.reduce_gradients())
        self._place(sharded=False)

    def reshard(self) -> None:
        """Put the shards back in the module and free the full rows."""
        self.wait_for_unshard()
        if self.unsharded:
            self._place(sharded=True)
            for shard in self.shards:
                shard.free()
            self.unsharded = False

    def reduce_gradients(self) -> None:
        """The group's gradients are complete: reduce-scatter them onto the shards, free the full rows."""
        row_shards.reduce_scatter(self.shards, self.mp_policy.reduce_dtype)
        self.reshard()

    # -- the hooks -----------------------------------------------------------------------------

    def pre_forward(self, module, args, kwargs):
        if self.iteration is None:
            _become_root(self)
        if self.is_root:
            self.iteration.forward_order.clear()
        self.unshard()
        self.wait_for_unshard()
        for target in self.forward_prefetch:
            target.unshard(async_op=True)
        dtype = self.mp_policy.param_dtype
        if dtype is not None and self.mp_policy.cast_forward_inputs:
            return _cast(args, dtype), _cast(kwargs, dtype)
        return args, kwargs

    def post_forward(self, module, args, output):
        if self.reshard_after_forward:
            self.reshard()
        self.iteration.forward_order.append(self)
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(self.pre_backward)
        if self.mp_policy.output_dtype is not None:
            return _cast(output, self.mp_policy.output_dtype)
        return output

    def pre_backward(self, grad):
        """Backward reaches this group (the gradient of one of its outputs is ready): gather, prefetch."""
        if not self.iteration.callback_queued:
            self.iteration.callback_queued = True     # autograd calls it once this backward is over
            torch.autograd.Variable._execution_engine.queue_callback(self.iteration.end_of_backward)
        if self.in_backward:
            return grad
        self.in_backward = True
        self.unshard()
        self.wait_for_unshard()
        if self.backward_prefetch is not None:
            targets = self.backward_prefetch
        else:                                    # by default: the group whose forward ran just before
            order = self.iteration.forward_order
            index = len(order) - 1 - order[::-1].index(self) if self in order else 0
            targets = order[index - 1: index] if index > 0 else []
        for target in targets:
            target.unshard(async_op=True)
        return grad


class _Unit:
    """What :class:`~distlab.zero.flat.WhenGradientsReady` counts: a list of parameters."""

    def __init__(self, params):
        self.params = params


def _unmanaged_parameters(module: nn.Module):
    """``(owner, name, parameter)`` under ``module``, skipping subtrees already given to ``fully_shard``."""
    found, seen = [], set()

    def visit(m):
        for name, p in m._parameters.items():
            if p is not None:
                if id(p) in seen:
                    raise ValueError(f"parameter {name!r} is shared (tied weights): not supported here")
                seen.add(id(p))
                found.append((m, name, p))
        for child in m.children():
            if not isinstance(child, FSDPModule):
                visit(child)

    visit(module)
    return found


def _become_root(group: ParamGroup) -> None:
    """The first group to run forward is the root: it and the groups below it share an :class:`Iteration`."""
    iteration = Iteration()
    for module in group.module.modules():
        if isinstance(module, FSDPModule):
            below = module._fsdp_group
            below.iteration, below.is_root = iteration, below is group
            iteration.groups.append(below)
            if below.reshard_after_forward is None:                # torch's default
                below.reshard_after_forward = below is not group


class FSDPModule:
    """What a module becomes under ``fully_shard`` (its class is made a subclass of this and its own)."""

    def unshard(self, async_op: bool = False):
        """All-gather the group's full parameters now (``async_op``: return a handle to ``wait()`` on)."""
        group = self._fsdp_group
        group.unshard(async_op=async_op)
        return _Handle(group) if async_op else None

    def reshard(self) -> None:
        """Free the group's full parameters: the module holds its shards again."""
        self._fsdp_group.reshard()

    def set_reshard_after_forward(self, reshard_after_forward: bool) -> None:
        self._fsdp_group.reshard_after_forward = reshard_after_forward

    def set_modules_to_forward_prefetch(self, modules) -> None:
        """Start these modules' all-gathers when this module's forward starts."""
        self._fsdp_group.forward_prefetch = [m._fsdp_group for m in modules]

    def set_modules_to_backward_prefetch(self, modules) -> None:
        """Start these modules' all-gathers when this module's backward starts (instead of the default)."""
        self._fsdp_group.backward_prefetch = [m._fsdp_group for m in modules]


class _Handle:
    def __init__(self, group):
        self.group = group

    def wait(self) -> None:
        self.group.wait_for_unshard()


_FSDP_CLASSES: dict[type, type] = {}
FULL_PRECISION = MixedPrecisionPolicy()


def fully_shard(module: nn.Module, *, mesh=None, reshard_after_forward: bool | None = None,
                mp_policy: MixedPrecisionPolicy = FULL_PRECISION) -> nn.Module:
    """Shard ``module``'s parameters (those no earlier call took) by rows over the ranks of ``mesh``.

    Args:
        module: the module; its parameters the same on every rank.
        mesh: a 1-D :class:`~torch.distributed.device_mesh.DeviceMesh`; default all ranks,
            on ``cuda`` under NCCL, else ``cpu``.
        reshard_after_forward: free the full parameters after forward (``True``: ZeRO-3) or
            keep them until backward (``False``: ZeRO-2's memory, one all-gather fewer).
            ``None``: false for the root (the first module to run forward), true for the rest.
        mp_policy: the dtypes of compute and of the gradient reduction.

    Returns ``module`` itself, now also an :class:`FSDPModule`.
    """
    if not isinstance(reshard_after_forward, (bool, type(None))):
        raise NotImplementedError("reshard_after_forward as a world size (an int) is not supported here")
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        mesh = init_device_mesh(device, (dist.get_world_size(),))
    group = ParamGroup(module, mesh, reshard_after_forward, mp_policy)
    cls = module.__class__
    if cls not in _FSDP_CLASSES:
        _FSDP_CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    module.__class__ = _FSDP_CLASSES[cls]
    module._fsdp_group = group
    module.register_forward_pre_hook(group.pre_forward, with_kwargs=True, prepend=True)
    module.register_forward_hook(group.post_forward)
    module.register_state_dict_pre_hook(lambda *_: group.reshard())    # a state dict holds the shards
    return module
