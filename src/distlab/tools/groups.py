"""Who am I in a process group: the two questions every chapter's code asks of ``torch.distributed``.

``group=None`` means all ranks (the default group). Inside a group, ranks are numbered
``0 .. size-1`` in the group's own order; point-to-point calls and the roots of collectives
name *global* ranks, so code that runs inside a group (a tensor-parallel group, one pipeline
of a 3D layout) translates with :func:`global_rank`.
"""

from __future__ import annotations

import torch.distributed as dist


def world(group=None) -> tuple[int, int]:
    """``(number of ranks, my rank)`` in ``group``; ``(1, 0)`` when no process group is running."""
    if not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def global_rank(group, rank: int) -> int:
    """The global rank of the rank numbered ``rank`` inside ``group`` (itself for the default group)."""
    return rank if group is None else dist.get_global_rank(group, rank)
