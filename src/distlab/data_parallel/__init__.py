"""Chapter 3: distributed data parallelism (DDP) from scratch, in three steps of increasing speed.

Every rank holds a full copy of the model and trains on its own shard of the batch. If the
copies start equal and every rank applies the *average* of all ranks' gradients, the copies
stay equal, and each step is exactly the step a single process would take on the whole batch
(the mean loss over a batch is the mean of the shards' mean losses when the shards are equal
in size, and the gradient of a mean is the mean of the gradients).

Read the modules in order:

1. :mod:`.naive`: one ``all_reduce`` per parameter after backward;
2. :mod:`.buckets`: the gradients in a few flat buffers, one ``all_reduce`` each;
3. :mod:`.overlap`: those all-reduces launched from gradient hooks while backward still runs,
   ``no_sync`` for gradient accumulation, and the classic ``no_sync`` bug.
"""
