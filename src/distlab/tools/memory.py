"""Counting the memory a rank holds: model states, activations saved for backward, peaks.

Training a model keeps four kinds of tensors alive on every rank: **parameters**,
**gradients**, **optimizer state** (Adam: two running averages per parameter) and
**activations** (what forward saves for backward). How many bytes the first three *should*
take, by precision and ZeRO stage, is chapter 4's formula (:mod:`distlab.zero.theory`); this
module counts what a rank *does* hold, so the two can be compared.

Measuring on a CPU: torch has no CPU allocator statistics, and a process's resident memory
is too coarse (an idle rank already holds hundreds of MB). What *can* be counted exactly is
the bytes of the tensors a rank holds (:func:`storage_bytes`, :func:`model_state_bytes`),
views of one buffer counted once. The activations a forward pass keeps for backward are
seen by autograd's saved-tensor hooks (:func:`saved_activation_bytes`); for a peak inside a
piece of code, :func:`peak_allocated` replays the allocation events torch's profiler records
(CUDA's own counters where there is a GPU); :func:`largest_tensor_made` proves that a rank
never materialises some full tensor.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

KINDS = ("parameters", "gradients", "optimizer")
"""The model states, in the order the book's tables list them."""


# -- counting what a rank holds -----------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` held on this rank: a DTensor's local shard, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_bytes(tensors) -> int:
    """Bytes of memory behind ``tensors``, each buffer counted once.

    Counts whole *storages*, not views: twenty parameters that are views into one flat buffer
    count as that buffer, once (padding included); a buffer whose storage was freed (resized
    to 0 bytes, as ZeRO-3 does between uses) counts 0. ``None`` entries are skipped.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = _local(t).untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (Adam: ``exp_avg``, ``exp_avg_sq`` and a ``step`` scalar)."""
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def model_state_bytes(model=None, optimizer=None, parameters=(), gradients=(), optimizer_state=()) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds right now.

    ``model`` contributes its parameters and their ``.grad``; ``optimizer`` its state. The
    other arguments add tensors held elsewhere (a ZeRO shard, a flat gradient buffer).
    Everything is deduplicated by storage, within each kind.
    """
    params = list(model.parameters()) if model is not None else []
    counted = {
        "parameters": storage_bytes(params + list(parameters)),
        "gradients": storage_bytes([p.grad for p in params] + list(gradients)),
        "optimizer": storage_bytes((optimizer_tensors(optimizer) if optimizer is not None else []) + list(optimizer_state)),
    }
    counted["total"] = sum(counted.values())
    return counted


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# -- activations and peaks --------------------------------------------------------------------

@dataclass
class Measured:
    """Filled in when the ``with`` block of a measuring context manager of this module ends."""

    bytes: int = 0
    seconds: float = 0.0
    shape: tuple = ()          # largest_tensor_made: the shape of that tensor


@contextmanager
def saved_activation_bytes():
    """Bytes that forward passes inside the block save for backward, parameters excluded.

    Uses autograd's saved-tensor hooks: every tensor an operation keeps for its backward
    passes through ``pack``. Tensors that share a buffer count once; parameters (leaves that
    require grad) and views of them (a linear layer saves its weight transposed) are model
    state, not activations, and are left out::

        with saved_activation_bytes() as saved:
            loss = loss_fn(model, batch)
        print(saved.bytes)
    """
    result = Measured()
    seen: set[tuple[int, int]] = set()

    def pack(t):
        base = t._base if t._base is not None else t     # F.linear saves weight.t(): a view of a parameter
        if not (base.is_leaf and base.requires_grad):
            storage = getattr(t, "_local_tensor", t).untyped_storage()    # a DTensor: its local piece
            key = (storage.data_ptr(), storage.nbytes())
            if key not in seen:
                seen.add(key)
                result.bytes += storage.nbytes()
        return t

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
    result.seconds = time.perf_counter() - start


@contextmanager
def peak_allocated(device: str | None = None):
    """Highest bytes allocated *above the level at entry* while the block runs.

    On CUDA, the allocator's own counter (``torch.cuda.max_memory_allocated``). On CPU there
    is no such counter, so the block runs under ``torch.profiler`` with memory profiling and
    the peak is replayed from its allocation and free events, in time order. The profiler
    slows the block down: use it for memory, not for timing.
    """
    result = Measured()
    start = time.perf_counter()
    if device is not None and str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = torch.cuda.max_memory_allocated(device) - base
    else:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _c_stderr_silenced():      # the profiler's C++ side logs its own start ("USDT: profiler_start")
            prof.start()
        try:
            yield result                # what the measured code writes is not touched
        finally:
            with _c_stderr_silenced():
                prof.stop()
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        level = peak = 0
        for _, nbytes in events:
            level += nbytes
            peak = max(peak, level)
        result.bytes = peak
    result.seconds = time.perf_counter() - start


@contextmanager
def _c_stderr_silenced():
    """File descriptor 2 goes to /dev/null inside the block (C++ logs bypass Python's ``sys.stderr``)."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextmanager
def largest_tensor_made():
    """The largest tensor (in bytes) that any operation inside the block produced.

    A probe for "this rank never materialises X": every torch operation's outputs pass
    through a ``TorchDispatchMode`` on their way out, so nothing created by an op escapes it
    (tensors made before the block, and parameters, are not counted)::

        with largest_tensor_made() as largest:
            loss = loss_fn(model, batch)
        print(largest.bytes, largest.shape)
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    result = Measured()

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > result.bytes:
                    result.bytes, result.shape = t.numel() * t.element_size(), tuple(t.shape)
            return out

    start = time.perf_counter()
    with Probe():
        yield result
    result.seconds = time.perf_counter() - start


def human(nbytes: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return str(nbytes)
