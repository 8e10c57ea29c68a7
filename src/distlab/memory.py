"""Where a training step's memory goes, counted on each rank, and the formula it should obey.

Training a model with Adam keeps four kinds of tensors alive on every rank:

* **parameters** — the weights themselves;
* **gradients** — one number per parameter, filled in by ``backward``;
* **optimizer state** — Adam keeps two running averages per parameter (``exp_avg``, the first
  moment, and ``exp_avg_sq``, the second), so twice the parameters again;
* **activations** — what forward saves for backward. They grow with batch size and
  sequence length, not with the parameters alone, and are the subject of activation
  checkpointing (:func:`saved_activation_bytes` measures them).

The first three are the *model states*. Their size per parameter is fixed by the precision:

=====================================  ==========  =========  ===============  =====
precision                              parameters  gradients  optimizer state  total
=====================================  ==========  =========  ===============  =====
fp32                                   4           4          4 + 4 (m, v)     16
mixed (bf16/fp16, fp32 master weights) 2           2          4 + 4 + 4        16
=====================================  ==========  =========  ===============  =====

In mixed precision forward and backward run on 2-byte copies of the weights, but the update
is applied to an fp32 *master* copy (a 2-byte number cannot absorb an update ``1e-4`` times
smaller than itself), so the optimizer holds 12 bytes per parameter: master weights, ``m``
and ``v`` (Rajbhandari et al., *ZeRO*, 2020). Mixed precision saves time and activation memory,
not model-state memory.

With data parallelism (DDP) every rank holds all of it: 16 bytes per parameter, a 7B model
needs 112 GB per rank before a single activation. ZeRO removes the redundancy across the
``N`` ranks, one kind at a time: stage 1 shards the optimizer state, stage 2 the gradients
too, stage 3 the parameters as well, so each rank keeps ``1/N`` of what is sharded
(:func:`bytes_per_parameter`, :func:`model_state_theory`).

Measuring on a CPU: torch has no CPU allocator statistics, and a process's resident memory
is too coarse (an idle rank already holds hundreds of MB). What *can* be counted exactly is
the bytes of the tensors a rank holds (:func:`storage_bytes`, :func:`model_state_bytes`),
views of one buffer counted once. For a peak inside a piece of code, :func:`peak_allocated`
replays the allocation events torch's profiler records (CUDA's own counters where there is
a GPU).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

KINDS = ("parameters", "gradients", "optimizer")

PRECISIONS = {
    "fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
    "mixed": {"parameters": 2, "gradients": 2, "optimizer": 12},
}
"""Bytes per parameter of each model state, with Adam(W) (see the table above)."""

SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"), 3: ("optimizer", "gradients", "parameters")}
"""Which model states each ZeRO stage splits over the ranks (stage 0 is plain DDP)."""

STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


# -- the formula --------------------------------------------------------------------------------

def bytes_per_parameter(stage: int, world: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes each rank holds per model parameter, by kind, for a ZeRO ``stage`` on ``world`` ranks.

    >>> bytes_per_parameter(0, 8)             # DDP: everything replicated
    {'parameters': 4, 'gradients': 4, 'optimizer': 8, 'total': 16}
    >>> bytes_per_parameter(3, 8, "mixed")    # ZeRO-3: everything divided by 8
    {'parameters': 0.25, 'gradients': 0.25, 'optimizer': 1.5, 'total': 2.0}
    """
    if stage not in SHARDED:
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    per = {kind: (b / world if kind in SHARDED[stage] else b) for kind, b in PRECISIONS[precision].items()}
    per["total"] = sum(per.values())
    return per


def model_state_theory(num_params: int, world: int, stage: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state per rank (and their total), by the formula."""
    return {kind: num_params * b for kind, b in bytes_per_parameter(stage, world, precision).items()}


def ranks_needed(num_params: float, capacity_bytes: float, stage: int, precision: str = "mixed") -> float:
    """The smallest number of ranks whose model states fit in ``capacity_bytes`` each (``inf`` if none).

    Replicated states do not shrink with more ranks, so stages 0-2 may never fit.
    """
    per = bytes_per_parameter(stage, 1, precision)
    fixed = sum(b for kind, b in per.items() if kind != "total" and kind not in SHARDED[stage]) * num_params
    shrinking = sum(b for kind, b in per.items() if kind != "total" and kind in SHARDED[stage]) * num_params
    if fixed >= capacity_bytes:
        return float("inf")
    if shrinking == 0:
        return 1
    return max(1, -(-shrinking // (capacity_bytes - fixed)))


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

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield result
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        level = peak = 0
        for _, nbytes in events:
            level += nbytes
            peak = max(peak, level)
        result.bytes = peak
    result.seconds = time.perf_counter() - start


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


# -- activation checkpointing -------------------------------------------------------------------

class Checkpointed(torch.nn.Module):
    """``module`` run without keeping its inner activations: backward recomputes them.

    Only the block's input is saved; in backward the block's forward runs again (under
    autograd this time) right before its gradients are needed. About one extra forward per
    block, for activation memory that no longer grows with the number of layers inside it.
    """

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.module, *args, use_reentrant=False)


def checkpoint_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap each of ``model.blocks`` (a TinyGPT's transformer blocks) in :class:`Checkpointed`, in place."""
    for index, block in enumerate(model.blocks):
        model.blocks[index] = Checkpointed(block)
    return model
