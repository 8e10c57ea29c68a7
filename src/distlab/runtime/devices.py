"""Which backend and device a rank uses: chosen from what the machine has, never hard-coded.

* Enough GPUs for every rank on this node: NCCL, and rank ``LOCAL_RANK`` uses ``cuda:LOCAL_RANK``.
* Otherwise: gloo on the CPU (every collective works there, just slower).

Write code that runs on both by asking instead of assuming::

    x = torch.ones(4, device=distlab.device())
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def gpus_for_every_rank(local_world_size: int) -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size


def choose_backend(requested: str | None, local_world_size: int) -> str:
    """The backend a rank should use, given what the caller asked for (``None`` = decide)."""
    if requested in (None, "", "auto"):
        return "nccl" if gpus_for_every_rank(local_world_size) else "gloo"
    return requested


def device() -> torch.device:
    """The device this rank should put its tensors on (``cuda:LOCAL_RANK`` under NCCL, else CPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")
