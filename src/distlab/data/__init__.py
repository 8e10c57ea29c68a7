"""Data for the book's language model, and the ways to shard it over data-parallel ranks (chapter 1).

* :mod:`distlab.data.corpus`: the shipped public-domain corpus, byte-tokenised into windows
  of ``context + 1`` bytes and stored as a memory-mapped ``datasets`` Arrow dataset
  (:func:`corpus_dataset`), the login-node / compute-node workflow of a cluster, and
  :func:`lm_batch` (windows -> ``(inputs, targets)`` for :class:`distlab.models.TinyGPT`).
* :mod:`distlab.data.sharding`: a distributed sampler from scratch and the three sharding
  strategies (iterable sharding, batch-sampler sharding, dispatching).
* :mod:`distlab.data.measure`: per-rank memory, samples per second and bytes sent of each strategy.

Later chapters train on the corpus like this::

    from distlab.data import corpus_dataset, lm_batch
    windows = corpus_dataset()                      # 41,415 windows of 33 bytes
    inputs, targets = lm_batch(windows[0:8]["tokens"])
"""

from distlab.data.corpus import CONTEXT, corpus_dataset, corpus_path, corpus_windows, lm_batch

__all__ = ["CONTEXT", "corpus_dataset", "corpus_path", "corpus_windows", "lm_batch"]
