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
* :mod:`.fully_shard`: ZeRO-3 as a *module wrapper*, :class:`~.fully_shard.FullyShardedModel`
  (torch: FSDP2's ``fully_shard``), stepped by any optimizer built outside;
* :mod:`.stages`: the four stages side by side (``build(stage, model)``), for the book and
  the benchmark;
* :mod:`.checkpointing`: activation checkpointing, for the memory no stage shards.
"""
