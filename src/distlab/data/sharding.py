"""How N data-parallel ranks get their data: a distributed sampler and three sharding strategies.

Data parallelism needs, at every step, a *global batch* of ``B = b * N`` samples cut into N
disjoint pieces of ``b``, one per rank, and over an epoch every sample exactly once. All
three strategies below deliver exactly the same pieces (the tests check it); they differ in
who reads what, how much memory each rank holds, and what travels over the network.

* :class:`DistributedSampler` — per-rank index lists, the classic way (a from-scratch copy of
  ``torch.utils.data.DistributedSampler``: same indices, same padding rule, same ``set_epoch``).
* **Iterable sharding** (:class:`IterableShard`): every rank reads the *whole* stream of
  samples, builds each global batch and keeps its own chunk. No communication and no index
  bookkeeping, but each rank holds all the data and does N times the reading work.
* **Batch-sampler sharding** (:class:`BatchSamplerShard`): the global batches are made of
  *indices* (cheap), identically on every rank from a shared seed; each rank slices out its
  indices and reads only those samples. Any sampling scheme (weighted, temperature-based)
  lives once, in :func:`global_batches`, so every rank agrees on it by construction.
* **Dispatching** (:func:`dispatch`): one rank holds the data and reads every global batch;
  it *scatters* the pieces to the others. Only one copy of the data, but the pieces cross the
  network every step, and that rank's reading speed bounds everyone.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

# -- the distributed sampler --------------------------------------------------------------------

class DistributedSampler:
    """The indices rank ``rank`` of ``num_replicas`` visits in one epoch.

    Every epoch, all ranks compute the *same* permutation of ``range(num_samples)`` (seeded
    with ``seed + epoch``, no communication), make it divisible by ``num_replicas``, and rank
    ``r`` takes every ``num_replicas``-th index starting at ``r``. So shards are disjoint,
    equally long, and together cover the dataset.

    Divisibility, two choices:

    * ``drop_last=False`` (padding): repeat indices from the start of the permutation until
      the length divides; a few samples are seen twice this epoch.
    * ``drop_last=True``: cut the tail; a few samples are not seen this epoch.

    Call :meth:`set_epoch` before each epoch. Forget it and every epoch repeats epoch 0's
    order: the model sees the same batches in the same order, epoch after epoch.
    """

    def __init__(self, num_samples: int, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.num_samples_total = num_samples
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        if drop_last:
            self.per_rank = num_samples // num_replicas
        else:
            self.per_rank = math.ceil(num_samples / num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle :meth:`__iter__` will use."""
        self.epoch = epoch

    def global_order(self) -> list[int]:
        """This epoch's order of all samples, padded or cut to ``per_rank * num_replicas``."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples_total, generator=g).tolist()
        else:
            order = list(range(self.num_samples_total))
        total = self.per_rank * self.num_replicas
        if total <= len(order):
            return order[:total]                                  # drop_last: cut the tail
        padding = total - len(order)                              # pad: repeat from the start
        return order + (order * math.ceil(padding / len(order)))[:padding]

    def __iter__(self):
        return iter(self.global_order()[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return self.per_rank


# -- global batches: made once, from indices ------------------------------------------------------

def global_batches(num_samples: int, global_batch_size: int, seed: int = 0, epoch: int = 0,
                   weights=None) -> torch.Tensor:
    """The global batches of one epoch as indices, shape ``(steps, global_batch_size)``.

    Every rank calls this with the same arguments and gets the same tensor: the shared seed
    replaces communication. Without ``weights``: a fresh permutation per epoch, an incomplete
    last batch dropped. With ``weights`` (one non-negative number per sample): ``num_samples``
    draws with replacement, sample ``i`` with probability ``weights[i] / sum(weights)``; see
    :func:`temperature_weights`.
    """
    g = torch.Generator().manual_seed(seed + epoch)
    if weights is None:
        order = torch.randperm(num_samples, generator=g)
    else:
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if len(weights) != num_samples:
            raise ValueError(f"{len(weights)} weights for {num_samples} samples")
        order = torch.multinomial(weights, num_samples, replacement=True, generator=g)
    steps = num_samples // global_batch_size
    return order[: steps * global_batch_size].view(steps, global_batch_size)


def temperature_weights(sources: list[str], temperature: float = 1.0) -> torch.Tensor:
    """Per-sample weights that draw source ``s`` with probability proportional to ``n_s ** (1 / T)``.

    ``n_s`` is the number of samples of source ``s`` (a book, a language, a dataset of a
    mixture). ``T = 1`` keeps the natural proportions (every sample equally likely); large
    ``T`` flattens them towards one source as likely as any other, which up-samples the small
    sources (multilingual models do this for rare languages). Within a source, samples stay
    equally likely.
    """
    names = sorted(set(sources))
    counts = {s: 0 for s in names}
    for s in sources:
        counts[s] += 1
    share = {s: counts[s] ** (1.0 / temperature) for s in names}
    total = sum(share.values())
    return torch.tensor([share[s] / total / counts[s] for s in sources], dtype=torch.float64)


def rank_slice(batch, rank: int, world_size: int):
    """Rank ``rank``'s contiguous ``1/world_size`` of a global batch (its length must divide)."""
    if len(batch) % world_size:
        raise ValueError(f"a global batch of {len(batch)} does not split evenly over {world_size} ranks")
    per_rank = len(batch) // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank]


# -- strategy 1: iterable sharding -----------------------------------------------------------------

class IterableShard(torch.utils.data.IterableDataset):
    """Every rank iterates over *all* samples of ``stream``; it keeps its chunk of each global batch.

    ``stream`` is any iterable of samples in the same order on every rank (for example the
    rows of an in-memory copy in a seeded shuffled order). Groups of
    ``batch_size * world_size`` consecutive samples form a global batch; this rank yields
    samples ``rank * batch_size`` to ``(rank + 1) * batch_size - 1`` of each, and the last
    incomplete global batch is dropped, so every rank yields the same number of samples.
    Wrap it in ``DataLoader(shard, batch_size=batch_size)`` to get batches.
    """

    def __init__(self, stream, batch_size: int, rank: int, world_size: int):
        self.stream, self.batch_size = stream, batch_size
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        global_batch = []
        for sample in self.stream:                                  # every rank reads everything...
            global_batch.append(sample)
            if len(global_batch) == self.batch_size * self.world_size:
                yield from rank_slice(global_batch, self.rank, self.world_size)  # ...and keeps 1/N
                global_batch = []


# -- strategy 2: batch-sampler sharding -----------------------------------------------------------

class BatchSamplerShard:
    """This rank's indices of each global batch: pass it as ``DataLoader(..., batch_sampler=...)``.

    ``batches`` is a sequence of global batches of indices (from :func:`global_batches`, the
    same on every rank); each iteration yields the list of indices this rank should read.
    """

    def __init__(self, batches, rank: int, world_size: int):
        self.batches, self.rank, self.world_size = batches, rank, world_size

    def __iter__(self):
        for batch in self.batches:
            yield [int(i) for i in rank_slice(batch, self.rank, self.world_size)]

    def __len__(self) -> int:
        return len(self.batches)


# -- strategy 3: dispatching ----------------------------------------------------------------------

def dispatch(read_batch, batches, sample_shape, dtype=torch.uint8, src: int = 0):
    """Rank ``src`` reads each global batch and scatters one equal chunk to every rank; yield this rank's.

    ``read_batch(indices) -> tensor`` is called on rank ``src`` only (the others may pass
    ``None`` and need no copy of the data). ``batches`` are the global batches of indices,
    known to every rank (only their number and size matter off ``src``). Per step, rank
    ``src`` sends ``(N - 1) / N`` of the global batch: count it with :mod:`distlab.tools.comm`.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    for batch in batches:
        mine = torch.empty((len(batch) // world, *sample_shape), dtype=dtype)
        if rank == src:
            tokens = torch.as_tensor(read_batch(batch)).to(dtype)
            dist.scatter(mine, list(tokens.chunk(world)), src=src)
        else:
            dist.scatter(mine, None, src=src)
        yield mine
