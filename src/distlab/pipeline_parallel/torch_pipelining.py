"""The same step with ``torch.distributed.pipelining``: torch's schedules on our stages, for comparison.

torch's ``PipelineStage`` wraps each of our chunks (:mod:`.stages`), and its schedule classes
(GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble, ZB-V) run them. The result has the
same form as :func:`distlab.pipeline_parallel.training.train_step`'s, so gradients and times compare.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab import models
from distlab.pipeline_parallel.stages import Stage, micro_batches_of, rank_of, split_gpt, stage_gradients
from distlab.pipeline_parallel.training import StepResult

TORCH_SCHEDULES = {
    # name: (class in torch.distributed.pipelining, chunks per rank, placement)
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
    "zb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
}
"""The torch schedules :func:`torch_pipeline_step` runs. "loop" deals chunks round-robin, like
ours; "v" gives rank ``r`` chunks ``r`` and ``2p-1-r``, so rank 0 holds the first and the last."""


def _gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_schedule(name: str, micro_batches: int, seed: int = 0, **config):
    """``(torch schedule object, this rank's chunks)`` for a key of :data:`TORCH_SCHEDULES`.

    The chunks are ours (:func:`split_gpt`), wrapped in ``PipelineStage`` s. torch's loss
    function returns each micro-batch's *mean* loss and ``scale_grads=True`` (the default)
    divides the accumulated gradients by ``m``: the same full-batch mean as ours.
    """
    import torch.distributed.pipelining as pipelining

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; pick one of {', '.join(TORCH_SCHEDULES)}")
    class_name, virtual, placement = TORCH_SCHEDULES[name]
    ranks, rank = dist.get_world_size(), dist.get_rank()
    total = ranks * virtual
    chunks = split_gpt(models.build("gpt", seed=seed, **config), total)
    mine = [rank, total - 1 - rank] if placement == "v" else [c for c in range(total) if rank_of(c, ranks) == rank]
    stages = [pipelining.PipelineStage(chunks[c], c, total, torch.device("cpu")) for c in mine]
    cls = getattr(pipelining, class_name)
    schedule = cls(stages[0] if virtual == 1 else stages, micro_batches, loss_fn=_gpt_loss)
    return schedule, {c: chunks[c] for c in mine}


def torch_step(schedule, chunks: dict[int, Stage], batch) -> float | None:
    """One step of a torch schedule on this rank; the full-batch mean loss on the rank with the last chunk."""
    inputs, targets = batch
    first, last = any(s.first for s in chunks.values()), any(s.last for s in chunks.values())
    losses: list[torch.Tensor] = []
    args = (inputs,) if first else ()
    kwargs = {"target": targets, "losses": losses} if last else {}
    schedule.step(*args, **kwargs)
    return torch.stack(losses).mean().item() if last else None


def torch_pipeline_step(name: str, batch, micro_batches: int, seed: int = 0, **config) -> StepResult:
    """:func:`train_step`'s twin on ``torch.distributed.pipelining`` (gradients, loss, step time)."""
    rank = dist.get_rank()
    micro_batches_of(batch, micro_batches)                    # the same clear ValueError as ours
    schedule, chunks = torch_schedule(name, micro_batches, seed, **config)
    start = time.perf_counter()
    loss = torch_step(schedule, chunks, batch)
    return StepResult(rank=rank, loss=loss, grads=stage_gradients(chunks.values()),
                      seconds=time.perf_counter() - start)
