"""Chapter 4: ZeRO from scratch: stop every rank from holding a full copy of everything.

Data parallelism replicates the model states (parameters, gradients, Adam's two moments) on
all ``N`` ranks: 16 bytes per parameter each. ZeRO (Rajbhandari et al., 2020) keeps the data
parallelism and removes the redundancy in three stages: the optimizer state (ZeRO-1), the
gradients too (ZeRO-2), the parameters as well (ZeRO-3). In the shapes torch gives them:

* :mod:`.theory`: bytes per parameter and bytes on the wire, per stage (no torch);
* :mod:`.flat`: the unit of sharding, a flat buffer cut in ``N`` slices, and the two
  collectives every stage is made of (a reduce-scatter and an all-gather);
* :mod:`.optimizer`: ZeRO-1 and 2 as an *optimizer*, :class:`~.optimizer.ShardedOptimizer`
  (torch: ``ZeroRedundancyOptimizer``), beside DDP or reduce-scattering itself;
* :mod:`.fully_shard`: ZeRO-3 as a *module wrapper*, :class:`~.fully_shard.FullyShardedModel`,
  over flat units, stepped by any optimizer built outside;
* :mod:`.fsdp2` and :mod:`.row_shards`: ZeRO-3 in torch's FSDP2 form, ``fsdp2.fully_shard``
  called per block and on the root, each parameter cut by rows into a DTensor that stays the
  module's own parameter (code written for ``torch.distributed.fsdp`` runs on it by changing
  the import). It lives in a module of its own, not at ``distlab.zero.fully_shard``: that
  name is the flat-unit module's, and this package imports nothing (its :mod:`.theory` must
  load without torch);
* :mod:`.stages`: the four stages side by side (``build(stage, model)``), for the book and
  the benchmark;
* :mod:`.checkpointing`: activation checkpointing, for the memory no stage shards.
"""
