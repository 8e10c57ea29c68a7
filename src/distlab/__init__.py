"""distlab: run code on N ranks from a notebook, and the reference implementations of the book.

The package follows the book. Each chapter's reference code is one package; the pages import
it to make their figures, and the grader uses it as the reference:

===  ====================  ================================  =======================================================
ch.  topic                 package                           what its pages and exercise use
===  ====================  ================================  =======================================================
0    First steps           :mod:`distlab.runtime`            ``distlab.run``, ``distlab.Pool``, ``%%distributed``,
                                                             ``distlab.RankError``; launchers (torchrun, srun,
                                                             sbatch)
1    Data loading          :mod:`distlab.data`               ``corpus_dataset``, ``sharding``
                                                             (``DistributedSampler``, the three strategies),
                                                             ``measure``
2    Collectives           :mod:`distlab.collectives`        ``all_reduce`` (naive, tree, ring = reduce-scatter +
                                                             all-gather), ``faster_ring`` (the ring without
                                                             temporaries, optionally in pipelined segments),
                                                             ``cost_model`` (α-β)
3    Data parallelism      :mod:`distlab.data_parallel`      ``naive``, ``buckets``, ``overlap`` (``OverlappedDDP``,
                                                             ``no_sync`` and accumulation)
4    ZeRO and FSDP         :mod:`distlab.zero`               ``theory`` (bytes per stage), ``flat``, ``stages``,
                                                             ``optimizer`` (``ShardedOptimizer``: ZeRO-1/2),
                                                             ``fully_shard`` (``FullyShardedModel``: ZeRO-3),
                                                             ``fsdp2`` (``fully_shard``, torch's per-parameter
                                                             form), ``checkpointing``
5    Tensor parallelism    :mod:`distlab.tensor_parallel`    ``regions`` (f and g), ``layers``, ``model`` (Megatron
                                                             GPT, sequence parallel), ``dtensor``, ``experts``
6    Pipeline parallelism  :mod:`distlab.pipeline_parallel`  ``stages``, ``schedules`` (GPipe, 1F1B, interleaved,
                                                             ZB-H1), ``timeline`` (simulate, bubble),
                                                             ``measured_model`` (the bubble with message costs),
                                                             ``executor``, ``training``
7    3D parallelism        :mod:`distlab.parallel3d`         ``mesh`` (``Grid``, the rank grid), ``train``,
                                                             ``torch_train``, ``planner`` (choosing a layout),
                                                             ``recommend``
8    Context parallelism   :mod:`distlab.context_parallel`   ``blockwise`` (attention by blocks, the exact merge),
                                                             ``layout``, ``ring`` (ring attention, forward and
                                                             backward, its bytes), ``balance`` (the balanced causal
                                                             layout), ``ulysses``, ``torch_native``, ``model`` (a
                                                             model with attention split by sequence), ``timeline``
                                                             (the ring's measured steps), ``reference`` (the
                                                             exercise's tasks)
===  ====================  ================================  =======================================================

Shared by every chapter: :mod:`distlab.models` (the tiny GPT and MLP, and the single-process
reference), :mod:`distlab.tools` (the communication recorder, timelines, memory counting),
:mod:`distlab.figures` (plots and widgets the pages share). The grader is :mod:`distlab.grade`.

Here, at the top, is only what a notebook needs to run code on ranks:

* :func:`run`: call a function on N ranks; :class:`Pool`: keep N ranks warm between calls;
* :class:`RankError`, :class:`DistTimeout`, :class:`LaunchError`: what goes wrong, said clearly;
* :func:`device`: the device this rank should use;
* ``%load_ext distlab`` then ``%%distributed -n 4``: a cell on N ranks.

``import distlab`` is cheap: torch is imported only by the modules that need it.
"""

from distlab.runtime.errors import DistTimeout, LaunchError, RankError
from distlab.runtime.options import MAX_NPROCS
from distlab.runtime.pool import Pool, active_pools, fresh_processes, start_pool, stop_pools
from distlab.runtime.run import run
from distlab.runtime.serialize import NotPicklableError

__all__ = ["run", "Pool", "start_pool", "stop_pools", "active_pools", "fresh_processes", "RankError", "DistTimeout",
           "LaunchError", "NotPicklableError", "MAX_NPROCS", "device", "load_ipython_extension"]


def device():
    """The device this rank should put its tensors on: ``cuda:LOCAL_RANK`` under NCCL, else CPU."""
    from distlab.runtime.devices import device as _device

    return _device()


def load_ipython_extension(ipython):
    """``%load_ext distlab`` registers the ``%%distributed`` cell magic."""
    from distlab.runtime.magic import register

    register(ipython)
