"""One pipelined training step on a rank: build this rank's chunks, run its part of a schedule.

:func:`train_step` returns the rank's gradients (under the reference's names), the loss (on
the rank with the last chunk), the measured F/B/I/W spans and the peak of micro-batches in
flight with the activation bytes they keep. The ``delay`` knob adds pretend compute to every
action (``time.sleep``, which needs no core): on a small CPU machine it makes the measured
timeline show the schedule's shape, with real messages and real waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from distlab import models
from distlab.pipeline_parallel.executor import Executor
from distlab.pipeline_parallel.schedules import Action, check_schedule, make_schedule
from distlab.pipeline_parallel.stages import Stage, rank_of, split_gpt, stage_gradients
from distlab.pipeline_parallel.zero_bubble import defer_weight_gradients
from distlab.tools.groups import world
from distlab.tools.trace import Event, Tracer


@dataclass
class StepResult:
    """What one rank reports after a pipelined step."""

    rank: int
    loss: float | None                       # the full-batch mean loss, on the rank holding the last chunk
    grads: dict[str, torch.Tensor]           # reference names -> gradients of this rank's parameters
    events: list[Event] = field(default_factory=list)   # measured F/B/I/W spans (empty for torch's schedules)
    peak_in_flight: int = 0                  # most micro-batch chunks forwarded and not fully backwarded
    peak_activation_bytes: int = 0           # bytes those kept for backward at the peak (counted)
    actions: list[Action] = field(default_factory=list)
    seconds: float = 0.0                     # wall time of the step on this rank


def build_chunks(virtual: int = 1, seed: int = 0, zero_bubble: bool = False, group=None, **config) -> dict[int, Stage]:
    """This rank's chunks of a TinyGPT built from ``seed`` (``config``: GPTConfig fields).

    The model is cut into ``ranks * virtual`` chunks; rank ``r`` keeps ``r, r + ranks, ...``.
    ``zero_bubble``: make the linear layers defer their weight gradients (for I/W schedules).
    """
    ranks, rank = world(group)
    chunks = split_gpt(models.build("gpt", seed=seed, **config), ranks * virtual)
    mine = {c.index: c for c in chunks if rank_of(c.index, ranks) == rank}
    if zero_bubble:
        for stage in mine.values():
            defer_weight_gradients(stage)
    return mine


def run_step(chunks: dict[int, Stage], schedule: list[list[Action]], batch, micro_batches: int,
             delay: float = 0.0, trace: bool = True, group=None, loss_fn=None) -> StepResult:
    """Run this rank's part of ``schedule`` on ``chunks`` (gradients accumulate in ``.grad``).

    ``loss_fn(outputs, targets)``: the last stage's mean loss of a micro-batch (default: the
    cross-entropy of full logits; see :class:`~distlab.pipeline_parallel.executor.Executor`).

    ``group``: the ranks of this pipeline, in stage order (default: all ranks). Inside a 3D
    layout each data- and tensor-parallel coordinate has its own pipeline group.
    """
    ranks, rank = world(group)
    if len(schedule) != ranks:
        raise ValueError(f"the schedule is for {len(schedule)} pipeline ranks, but {ranks} ranks are running; "
                         f"build it with stages={ranks}")
    total = ranks * len(chunks)
    check_schedule(schedule, micro_batches, total)
    split = any(a.kind in "IW" for actions in schedule for a in actions)
    if split != any(stage.later is not None for stage in chunks.values()):
        raise ValueError("a schedule with I and W actions needs stages built with zero_bubble=True, and only it"
                         if split else "these stages defer their weight gradients: run a schedule with I and W actions")
    executor = Executor(chunks, total, batch, micro_batches, Tracer() if trace else None, delay, group, loss_fn)
    start = time.perf_counter()
    executor.run(schedule[rank])
    seconds = time.perf_counter() - start
    return StepResult(rank=rank, loss=None if executor.loss is None else executor.loss.item(),
                      grads=stage_gradients(chunks.values()),
                      events=executor.tracer.events if trace else [],
                      peak_in_flight=executor.peak_in_flight, peak_activation_bytes=executor.peak_bytes,
                      actions=list(schedule[rank]), seconds=seconds)


def train_step(schedule, batch, micro_batches: int = 1, virtual: int = 1, seed: int = 0, delay: float = 0.0,
               group=None, **config) -> StepResult:
    """One pipelined forward and backward of ``batch`` on this rank; call it on every rank.

    ``schedule``: a name from :data:`SCHEDULES` (built for this world size, ``micro_batches``,
    ``virtual``), or every rank's action list. The model is a TinyGPT built from ``seed`` with
    ``config`` (its ``layers`` must divide by ``ranks * virtual``); ``delay``: pretend compute per
    action (see the module docstring). The gradients in the result are those of the full-batch
    mean loss; compare them with :func:`distlab.models.reference_gradients`. ``group``: see
    :func:`run_step`.
    """
    ranks, _ = world(group)
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, ranks, micro_batches, virtual)
    virtual = (1 + max(a.chunk for actions in schedule for a in actions)) // len(schedule)
    zero_bubble = any(a.kind in "IW" for actions in schedule for a in actions)
    chunks = build_chunks(virtual, seed, zero_bubble, group, **config)
    return run_step(chunks, schedule, batch, micro_batches, delay, group=group)
