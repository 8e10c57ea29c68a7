"""Measuring a data loader on each rank: memory it holds, samples per second, bytes it sends.

Memory, four numbers from the Linux kernel (``/proc/self/status``), in MiB:

* ``rss``: resident set size, every page of this process in RAM, *including* pages it
  shares with other processes (a memory-mapped file read by four ranks counts four times).
* ``anon``: the anonymous part of ``rss``: memory the process allocated for itself (the
  heap, tensors, an in-memory copy of the data). Nobody else can use it.
* ``file``: the file-backed part of ``rss``: pages of memory-mapped files. They live in the
  operating system's page cache, are shared by every process mapping the same file, and the
  kernel can drop them under memory pressure and read them again later.
* ``peak``: the highest ``rss`` the process ever had (``VmHWM``). In a warm
  :class:`distlab.Pool` a rank lives across calls, so the book uses the change of ``anon`` and
  ``file`` during a call; ``benchmarks/data_loading.py`` starts fresh ranks and reports ``peak``.

A rank idles at a few hundred MiB (Python + torch); what matters is the difference between
strategies, so the book's memory measurements use a corpus repeated enough times
(``copies``) to be larger than the noise.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import torch
import torch.distributed as dist

from distlab.data import corpus, sharding

STRATEGIES = ("iterable", "batch-sampler", "dispatch")


_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}


def rank_memory() -> dict:
    """``{"rss", "anon", "file", "peak"}`` of this process in MiB (Linux)."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in _STATUS_FIELDS:
                found[_STATUS_FIELDS[key]] = int(value.split()[0]) / 1024  # kB -> MiB
    return found


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS, so ``anon`` falls again.

    glibc keeps freed blocks for reuse (and, after a large block is freed, serves the next
    ones from its heap); a later measurement in the same process would then see no growth.
    """
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the numbers are just noisier
        pass


def in_memory_copy(dataset) -> np.ndarray:
    """The ``tokens`` column of an Arrow dataset copied into this process's own memory (uint8).

    Each chunk's ``values`` is a view of the memory-mapped file (no bytes read yet); copying
    it into one private array reads every byte.
    """
    column = dataset.with_format(None).data.table.column("tokens")
    width = column.type.list_size
    copy = np.empty((len(column), width), dtype=np.uint8)
    row = 0
    for chunk in column.chunks:
        view = chunk.values.to_numpy(zero_copy_only=True)[chunk.offset * width:(chunk.offset + len(chunk)) * width]
        copy[row:row + len(chunk)] = view.reshape(-1, width)
        row += len(chunk)
    return copy


def read_mapped(dataset, indices) -> torch.Tensor:
    """Samples ``indices`` of a memory-mapped Arrow dataset as a uint8 tensor (only those are read)."""
    return dataset[list(map(int, indices))]["tokens"].to(torch.uint8)


def strategy_batches(strategy: str, dataset, batches, source: str):
    """This rank's batches (uint8 tensors) under ``strategy``, reading from ``source`` ("memory" or "mmap")."""
    rank, world = dist.get_rank(), dist.get_world_size()
    width = len(dataset[0]["tokens"])
    data = None
    if source == "memory" and (strategy != "dispatch" or rank == 0):
        data = torch.from_numpy(in_memory_copy(dataset))

    def read(indices):
        return data[torch.as_tensor(indices)] if data is not None else read_mapped(dataset, indices)

    if strategy == "iterable":
        stream = (data[i] if data is not None else read_mapped(dataset, [i])[0]
                  for i in batches.reshape(-1).tolist())
        per_rank = batches.shape[1] // world
        shard = iter(sharding.IterableShard(stream, per_rank, rank, world))
        for _ in range(len(batches)):
            yield torch.stack([next(shard) for _ in range(per_rank)])
    elif strategy == "batch-sampler":
        for indices in sharding.BatchSamplerShard(batches, rank, world):
            yield read(indices)
    elif strategy == "dispatch":
        yield from sharding.dispatch(read if rank == 0 else None, batches, (width,))
    else:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


DEFAULT_SOURCE = {"iterable": "memory", "batch-sampler": "mmap", "dispatch": "memory"}
"""Where each strategy reads from in the book's comparison, as usually deployed: iterable
sharding keeps the data in every process, batch-sampler sharding reads a shared memory map,
dispatching keeps one in-memory copy on rank 0."""


def measure_strategy(strategy: str, per_rank_batch: int = 64, steps: int = 40, copies: int = 1,
                     source: str | None = None, seed: int = 0) -> dict:
    """Run on every rank: load ``steps`` batches with ``strategy``; what it cost this rank.

    Returns ``{"samples_per_s"`` (this rank's samples / seconds), ``"anon_delta"``,
    ``"file_delta"`` (the most MiB held while loading minus before), ``"rss", "anon", "file",
    "peak"`` (the most while loading; memory is sampled every 25 steps, which costs ~0.1 ms),
    ``"bytes_sent"`` (counted by :mod:`distlab.tools.comm`), ``"checksum"`` (sum of every token this
    rank received, to compare strategies)``}``.
    """
    from distlab.tools import comm

    source = source or DEFAULT_SOURCE[strategy]
    world = dist.get_world_size()
    dataset = corpus.corpus_dataset(copies=copies)   # opening maps the file; nothing is read yet
    release_freed_memory()
    before = rank_memory()
    batches = sharding.global_batches(len(dataset), per_rank_batch * world, seed=seed)[:steps]
    dist.barrier()
    checksum, most = 0, dict(before)
    with comm.record() as log:
        start = time.perf_counter()
        loader = strategy_batches(strategy, dataset, batches, source)
        for step, batch in enumerate(loader):
            checksum += int(batch.sum())
            if step % 25 == 0 or step == len(batches) - 1:   # while the loader (and its data) is alive
                now = rank_memory()
                most = {key: max(most[key], now[key]) for key in most}
        seconds = time.perf_counter() - start
    after = most
    del loader, dataset
    release_freed_memory()
    return {"strategy": strategy, "source": source, "samples_per_s": len(batches) * per_rank_batch / seconds,
            "seconds": seconds, "anon_delta": after["anon"] - before["anon"], "file_delta": after["file"] - before["file"],
            **after, "bytes_sent": log.bytes_sent(), "checksum": checksum}
