"""ZeRO-1 and ZeRO-2 as an optimizer: every rank keeps the optimizer state of its ``1/N`` slice only.

The shape of torch's ``torch.distributed.optim.ZeroRedundancyOptimizer``: the model is left as
it is, and the *optimizer* is what is sharded. It is built over ``params`` like any torch
optimizer (param groups included) and wraps an ordinary one, the *inner* optimizer (AdamW by
default), that only ever sees this rank's slices::

    ddp = DistributedDataParallel(model)       # or distlab.data_parallel.overlap.OverlappedDDP
    optimizer = ShardedOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(ddp, batch).backward()             # DDP averages the gradients (an all-reduce)
    optimizer.step()                           # AdamW on my slice, then an all-gather
    optimizer.zero_grad()

How: each param group is cut into buckets of about ``bucket_mb`` MiB
(:func:`~distlab.data_parallel.buckets.plan_buckets`, as DDP does) and each bucket becomes a
:class:`~distlab.zero.flat.FlatUnit`: its parameters laid end to end in one flat buffer,
zero-padded to a multiple of ``N``. The model's parameters become views into these buffers,
and rank ``r``'s slice of each buffer, itself a view, is a parameter of the inner optimizer,
which therefore keeps Adam's ``exp_avg`` and ``exp_avg_sq`` for ``1/N`` of the elements. A
step hands the inner optimizer the averaged gradient of each slice, lets it update the slices
in place (so the model's weights, for this rank's part), and all-gathers every rank's updated
slices into every rank's buffers, so the whole model is up to date everywhere.

Where the averaged gradient slices come from decides the traffic:

* **beside DDP** (the default, and what ``ZeroRedundancyOptimizer`` does): DDP has already
  averaged the full gradients with an all-reduce, ``2 (N-1)/N S`` bytes per rank; the slice is
  cut out of them. With the all-gather, ``(N-1)/N S``, that is 1.5 times DDP's traffic: the
  price of leaving DDP untouched (``ZeroRedundancyOptimizer`` sends the same with broadcasts).
* ``average_gradients=True`` (ZeRO-1 as the paper has it, no DDP): ``step`` reduce-scatters
  the local gradients itself (``ReduceOp.AVG``), so each rank receives only its averaged
  slice, ``(N-1)/N S``; with the all-gather that is exactly DDP's traffic. A ring all-reduce
  *is* a reduce-scatter and an all-gather (chapter 2): ZeRO does the update in between.
* ``shard_gradients=True`` (ZeRO-2, no DDP): the same reduce-scatter, issued *during*
  backward from gradient hooks as soon as a bucket's gradients are complete, and the full
  gradients are dropped at once. Each rank keeps only its gradient slices: full gradients
  exist only for the buckets backward is still filling, never for the whole model. Same
  traffic again.

Kept out, to stay readable: adding param groups after construction, an explicit process
group (all ranks take part), overlapping the all-gather with the next forward, and
``foreach``/fused tricks of our own (the inner optimizer uses its own). A parameter whose
gradient is ``None`` while others in its bucket have one is updated with a zero gradient
(AdamW still decays it); a bucket with no gradient at all is skipped, as torch skips a
parameter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.data_parallel.buckets import plan_buckets
from distlab.zero.flat import (
    FlatUnit,
    WhenGradientsReady,
    all_gather_parameters,
    reduce_scatter_gradients,
    reduce_scatter_into,
)


def hyperparameters(group: dict) -> dict:
    """A param group without its parameters: ``lr``, ``betas``, ``weight_decay``..."""
    return {key: value for key, value in group.items() if key != "params"}


def copy_hyperparameters(source: list[dict], target: list[dict]) -> None:
    """Give each param group of ``target`` the hyperparameters of the matching group of ``source``."""
    for from_group, to_group in zip(source, target):
        to_group.update(hyperparameters(from_group))


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch optimizer that keeps the inner optimizer's state for this rank's slice of ``params`` only.

    Args:
        params: parameters or param groups, as for any torch optimizer (on every rank, the same).
        optimizer_class: the inner optimizer, e.g. ``torch.optim.AdamW`` or ``torch.optim.SGD``.
        average_gradients: reduce-scatter the gradients in ``step`` (ZeRO-1 without DDP).
        shard_gradients: reduce-scatter them during backward and keep only slices (ZeRO-2).
        bucket_mb: size of the flat buffers each param group is cut into.
        **options: the inner optimizer's hyperparameters (``lr=1e-3``, ``weight_decay=0.1``...).

    ``param_groups`` hold the hyperparameters of the whole optimizer: an LR scheduler changes
    them there and :meth:`step` passes them on to the inner optimizer. ``state`` is the inner
    optimizer's state (this rank's slices), so :func:`distlab.tools.memory.model_state_bytes`
    counts what this rank holds; ``shards`` are the slices themselves, and in ZeRO-2 their
    ``.grad`` are the only gradients left.

    Like torch's, it does not broadcast: every rank must start from the same weights (DDP
    beside it sees to that; without DDP use the same seed, or
    :func:`distlab.data_parallel.naive.broadcast_parameters`).
    """

    def __init__(self, params, optimizer_class=torch.optim.AdamW, *, average_gradients: bool = False,
                 shard_gradients: bool = False, bucket_mb: float = 25.0, **options):
        super().__init__(params, options)          # param groups parsed as any torch optimizer does
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.average_gradients = average_gradients or shard_gradients
        self.units, self.buffers, self.shards, inner_groups = [], [], [], []
        for group in self.param_groups:
            group_shards = []
            for bucket in plan_buckets(group["params"], bucket_mb):
                unit = FlatUnit(bucket, self.rank, self.world)
                buffer = unit.flatten([p.detach() for p in unit.params])
                unit.point_parameters_at(buffer)            # the model's weights now live in `buffer`
                shard = nn.Parameter(buffer[unit.mine()])   # a view: updating it updates the model
                self.units.append(unit)
                self.buffers.append(buffer)
                group_shards.append(shard)
            self.shards += group_shards
            inner_groups.append({**hyperparameters(group), "params": group_shards})
        self.inner = optimizer_class(inner_groups, **options)
        self.state = self.inner.state
        copy_hyperparameters(self.inner.param_groups, self.param_groups)   # its defaults too (betas...)
        self.hooks = WhenGradientsReady(self.units, self.reduce_bucket) if shard_gradients else None

    def add_param_group(self, param_group: dict) -> None:
        if hasattr(self, "inner"):
            raise NotImplementedError("ShardedOptimizer cuts its parameters into slices once, when it is built: "
                                      "pass every param group to the constructor")
        super().add_param_group(param_group)

    def reduce_bucket(self, index: int) -> None:
        """ZeRO-2, from a gradient hook: reduce-scatter bucket ``index`` into its slice, drop the rest."""
        reduce_scatter_into(self.units[index], self.shards[index])

    def averaged_slice(self, unit: FlatUnit) -> torch.Tensor:
        """This rank's slice of the unit's gradient averaged over ranks (ZeRO-1)."""
        if self.average_gradients:
            return reduce_scatter_gradients(unit)                       # the local gradients: average them
        return unit.flatten([p.grad for p in unit.params])[unit.mine()].clone()   # DDP averaged them

    @torch.no_grad()
    def step(self, closure=None):
        """Update this rank's slices with the inner optimizer, then all-gather them into every rank's model.

        ``closure`` (optional) re-evaluates the model and returns the loss, as for torch's optimizers.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        copy_hyperparameters(self.param_groups, self.inner.param_groups)   # an LR scheduler may have changed them
        if self.hooks is not None:                   # ZeRO-2: backward has reduce-scattered the buckets...
            for index in self.hooks.incomplete():    # ...except where a parameter got no gradient
                self.reduce_bucket(index)
        else:
            for unit, shard in zip(self.units, self.shards):
                if any(p.grad is not None for p in unit.params):
                    shard.grad = self.averaged_slice(unit)
        self.inner.step()
        for shard, buffer in zip(self.shards, self.buffers):
            all_gather_parameters(shard, buffer)
        if self.hooks is None:
            for shard in self.shards:       # ZeRO-1: the full gradients stay, the slice was for the update
                shard.grad = None
        else:
            self.hooks.clear()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)          # the model's gradients (ZeRO-1)
        self.inner.zero_grad(set_to_none)       # the slices' gradients (ZeRO-2)
        if self.hooks is not None:
            self.hooks.clear()

    def state_dict(self) -> dict:
        """This rank's part of the optimizer state: a sharded checkpoint, one file per rank.

        It can only be loaded by the same rank of the same number of ranks (with the same
        parameters and buckets): a slice means nothing elsewhere.
        """
        copy_hyperparameters(self.param_groups, self.inner.param_groups)
        return {"world_size": self.world, "rank": self.rank, "inner": self.inner.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = (state_dict["world_size"], state_dict["rank"])
        if saved != (self.world, self.rank):
            raise ValueError(f"this optimizer state was saved by rank {saved[1]} of {saved[0]} ranks; it cannot be "
                             f"loaded on rank {self.rank} of {self.world}: each rank's slices depend on the number "
                             "of ranks (gather the full state to change it)")
        self.inner.load_state_dict(state_dict["inner"])
        copy_hyperparameters(self.inner.param_groups, self.param_groups)
