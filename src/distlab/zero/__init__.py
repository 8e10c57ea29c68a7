"""Chapter 4: ZeRO from scratch: stop every rank from holding a full copy of everything.

Data parallelism replicates the model states (parameters, gradients, Adam's two moments) on
all ``N`` ranks: 16 bytes per parameter each. ZeRO (Rajbhandari et al., 2020) keeps the data
parallelism and removes the redundancy in three stages: the optimizer state (ZeRO-1), the
gradients too (ZeRO-2), the parameters as well (ZeRO-3).

* :mod:`.theory`: bytes per parameter and bytes on the wire, per stage (no torch);
* :mod:`.flat`: the unit of sharding, a flat buffer cut in ``N`` slices, and the two
  collectives every stage is made of;
* :mod:`.stages`: the stages, one class each;
* :mod:`.checkpointing`: activation checkpointing, for the memory no stage shards.
"""
