"""Pipeline parallelism from scratch: give every rank a few consecutive layers, and keep them all busy.

Data parallelism splits the batch, tensor parallelism splits each weight matrix; pipeline
parallelism splits the *depth*. With ``p`` ranks, rank ``s`` holds stage ``s``: a contiguous run
of the model's layers (stage 0 also the embeddings, the last stage also the final norm, the head
and the loss). A batch flows forward through the stages, each sending its output activation to
the next with a point-to-point ``send``; the gradient of that activation flows back the same
way. Each rank stores only ``1/p`` of the weights, and the only traffic is one activation-sized
tensor per stage boundary and direction.

The catch is the **bubble**. Run the whole batch forward through the stages and then backward
(:func:`naive`), and only one rank works at any time: ``p - 1`` out of every ``p`` rank-seconds
are idle. The fix is to cut the batch into ``m`` **micro-batches** and keep several of them in
the pipe at once. Each schedule below is a different order in which a rank runs its pieces of
work, called *actions*: ``F`` (forward of micro-batch ``i``), ``B`` (its backward), and for
zero-bubble schedules ``B`` split in two, ``I`` (gradient of the stage's *input*, which the
previous stage waits for) and ``W`` (gradient of the stage's *weights*, which nobody waits for).
These are the letters of ``torch.distributed.pipelining``; the zero-bubble paper calls ``I``
"B".

==================  ===========================================  ===========================  ================================
schedule            order on stage ``s``                         idle fraction of the step    micro-batches held on stage ``s``
==================  ===========================================  ===========================  ================================
:func:`naive`       F then B of the whole batch                  ``(p-1)/p``                  1 (the whole batch)
:func:`gpipe`       all ``m`` F, then all ``m`` B                ``(p-1)/(m+p-1)``            ``m``
:func:`one_f_one_b` ``p-1-s`` F, then F,B,F,B..., then the B's   ``(p-1)/(m+p-1)``            ``min(p-s, m)``
:func:`interleaved` as 1F1B over ``v`` chunks per rank           ``(p-1)/(v*m+p-1)``          more than 1F1B
:func:`zb_h1`       1F1B with B split in I and W, W's delayed    ``(p-1)/(3m+p-1)`` (*)       ``min(p, m)``
==================  ===========================================  ===========================  ================================

(*) for ``m >= p``, when F, I and W each take the same time; in general
``(p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W))`` (Qi et al., 2023, "Zero Bubble Pipeline
Parallelism"). The others assume a backward costs the same on every stage; the formulas count
idle time over the whole step, ``p`` ranks times its length (Megatron's papers quote the idle
time over the *useful* time instead, ``(p-1)/m``: the same bubble, another denominator).

GPipe (Huang et al., 2019) and 1F1B (PipeDream-Flush, Narayanan et al., 2019) have the same
bubble; 1F1B starts each micro-batch's backward as soon as it can, so stage ``s`` never holds
the activations of more than ``p - s`` micro-batches, where GPipe holds all ``m``. The
**interleaved** schedule (Narayanan et al., 2021, "Megatron-LM" at scale) cuts the model into
``p * v`` chunks and gives rank ``r`` the chunks ``r, r + p, r + 2p, ...``: the pipeline fills
``v`` times faster, so the bubble shrinks ``v`` times, for ``v`` times more messages.
**ZB-H1** splits the backward: the ``I`` passes run the critical path back through the stages
quickly, and the ``W`` passes, which depend on nothing downstream, fill the idle slots.

How the code is organised (one idea per part):

1. :func:`split_gpt` cuts a :class:`distlab.models.TinyGPT` into chunks (:class:`Stage`) built
   from the same seed as the single-process reference; their parameters keep the reference's
   names, so gradients compare name by name (:func:`stage_gradients`).
2. One small function per schedule returns, for every rank, its ordered list of
   :class:`Action` s (:func:`make_schedule` picks one by name).
3. **The same action lists** drive the real run (:class:`Executor`, on each rank, with
   ``isend``/``irecv``) and a pure-Python model of the timeline (:func:`simulate`, with fixed
   costs per action, no processes): that is what the book's widget draws, and it also finds
   schedules that would deadlock.
4. :func:`train_step` does one step on a rank and returns its gradients, loss, timeline and
   memory counts; :func:`torch_pipeline_step` does the same with
   ``torch.distributed.pipelining`` for comparison.

The loss is the mean over the *full* batch: each micro-batch's mean loss is divided by ``m``, and
the gradients of the ``m`` backwards add up in ``.grad``, so after a step they equal the
single-process full-batch gradients (up to float32 rounding).

Communication. Receives are posted one action ahead: before running an action, a rank posts the
``irecv`` for the next action's input (into a buffer of the known shape, micro-batch x sequence
x width), so the message can arrive while it computes, and ``wait`` s for it right before it is
needed. Sends are ``isend`` s waited for only at the end of the step: in 1F1B's steady phase two
neighbours send to each other at the same moment (an activation one way, a gradient the other),
and two blocking sends would wait for each other forever. Every message carries a tag naming its
micro-batch, chunk and direction, so it can never be taken for another. (Not
``batch_isend_irecv``: gloo's batched point-to-point has a history of hangs in pipelining code.)

Measured and modelled. :func:`simulate` is a *model*: every F costs ``forward``, every B
``backward + weight``, etc., and messages are free. :func:`train_step` *measures*: each action is
timed with ``time.perf_counter`` on its rank (ranks on one machine share that clock), and
:func:`bubble_fraction` computes the idle fraction from those spans. On a small CPU machine the
stages' real compute is tiny and 4 ranks share 2 cores, so one rank's compute slows down whenever
another computes. The ``delay`` knob adds pretend compute to every action (``time.sleep``: F
sleeps ``delay``, I and W ``delay`` each, a full B ``2 * delay``, divided by ``v`` for a chunk of
an interleaved schedule): sleeping needs no core, so the measured timeline then shows the
schedule's shape, with real messages and real waiting, as a GPU cluster would. Say which one a
figure uses.

Kept out, to stay readable: combining with data or tensor parallelism (chapter 7; ``group=``
runs a pipeline inside a process group for that), activation checkpointing, any overlap of
messages with compute beyond receiving one action ahead, stages of unequal size, tied
embeddings, and the V-shaped schedules (ZB-V, DualPipe-V), which :func:`torch_pipeline_step`
runs through torch.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab import memory, models
from distlab.trace import Event, Tracer


# -- 1. cutting the model into stages -----------------------------------------------------------------

class Stage(nn.Module):
    """Chunk ``index`` of ``count`` of a TinyGPT: a contiguous run of its blocks.

    Chunk 0 also holds the token and position embeddings (its input is the tokens), the last
    chunk the final LayerNorm and the head (its output is the logits). The modules are the
    reference model's own, and keep its names: a block at position ``k`` of the full model is
    ``blocks.k`` here too (a ``ModuleDict`` keyed by ``"k"``), so ``stage.named_parameters()``
    yields exactly the reference's names for the parameters it holds.
    """

    def __init__(self, model: models.TinyGPT, index: int, count: int):
        super().__init__()
        layers = model.cfg.layers
        if count < 1 or layers % count:
            raise ValueError(f"TinyGPT's {layers} layers do not split evenly into {count} pipeline chunks; "
                             f"build it with layers= a multiple of {count}")
        per_chunk = layers // count
        self.index, self.count, self.dim = index, count, model.cfg.dim
        self.first, self.last = index == 0, index == count - 1
        if self.first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleDict({str(k): model.blocks[k] for k in range(index * per_chunk, (index + 1) * per_chunk)})
        if self.last:
            self.norm, self.head = model.norm, model.head
        self.later = None      # a zero-bubble stage's queue of weight-gradient jobs (see defer_weight_gradients)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(batch, seq)`` on chunk 0, else activations ``(batch, seq, dim)``; logits on the last."""
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def split_gpt(model: models.TinyGPT, count: int) -> list[Stage]:
    """Cut ``model`` into ``count`` chunks of equal depth (``layers`` must be a multiple of ``count``)."""
    return [Stage(model, index, count) for index in range(count)]


def stage_gradients(stages) -> dict[str, torch.Tensor]:
    """``{reference parameter name: gradient}`` of the parameters these stages hold.

    The names are the single-process model's (see :class:`Stage`), so the dicts of all ranks
    together cover the reference's gradients exactly once.
    """
    return {name: p.grad.detach().clone() for stage in stages for name, p in stage.named_parameters()}


def world(group=None) -> tuple[int, int]:
    """``(pipeline ranks, my pipeline rank)`` in ``group`` (default: all ranks; ``(1, 0)`` with no process group)."""
    if not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def rank_of(chunk: int, ranks: int) -> int:
    """The rank that holds ``chunk``: chunks are dealt round-robin (rank ``r``: ``r, r+p, r+2p, ...``)."""
    return chunk % ranks


def micro_batches_of(batch, micro_batches: int) -> tuple[list, list]:
    """``(inputs, targets)`` each cut into ``micro_batches`` equal slices along the batch dimension."""
    inputs, targets = batch
    if micro_batches < 1 or inputs.shape[0] % micro_batches:
        raise ValueError(f"a batch of {inputs.shape[0]} sequences does not split into {micro_batches} equal "
                         f"micro-batches; pick a number of micro-batches that divides the batch size")
    return list(inputs.chunk(micro_batches)), list(targets.chunk(micro_batches))


# -- 2. zero bubble: the weight gradient, later ----------------------------------------------------------

class _LinearWeightGradientLater(torch.autograd.Function):
    """``y = x @ W.T + b`` whose backward returns ``dL/dx`` now and queues ``dL/dW``, ``dL/db`` for later.

    The input gradient ``dy @ W`` is what the previous stage is waiting for; the weight gradient
    ``dy.T @ x`` is needed only by the optimizer. Backward keeps ``dy`` and ``x`` in a closure
    (so the memory of ``x`` is held until the W pass) and returns ``None`` for the weight, which
    leaves ``.grad`` untouched until the closure runs.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, later):
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias, ctx.later = weight, bias, later    # the parameters themselves: .grad goes there
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        (x,), weight, bias = ctx.saved_tensors, ctx.weight, ctx.bias

        def weight_gradient():
            flat_dy, flat_x = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
            _accumulate(weight, flat_dy.t() @ flat_x)
            if bias is not None:
                _accumulate(bias, flat_dy.sum(0))

        ctx.later.append(weight_gradient)
        return (dy @ weight if ctx.needs_input_grad[0] else None), None, None, None


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    param.grad = grad if param.grad is None else param.grad + grad


class DeferredLinear(nn.Module):
    """Stands in for an ``nn.Linear`` (same ``weight`` and ``bias`` objects, same names) in a zero-bubble stage."""

    def __init__(self, linear: nn.Linear, later: list):
        super().__init__()
        self.weight, self.bias, self.later = linear.weight, linear.bias, later

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearWeightGradientLater.apply(x, self.weight, self.bias, self.later)


def defer_weight_gradients(stage: Stage) -> Stage:
    """Replace every ``nn.Linear`` of ``stage`` by a :class:`DeferredLinear` sharing ``stage.later``.

    After a backward through the stage, ``stage.later`` holds one job per linear layer; running
    them is the stage's W pass. The LayerNorms and embeddings still get their weight gradients
    during backward (a sum and a scatter-add: cheap), as in the zero-bubble paper's
    implementation: the linear layers' matrix products are where the time goes.
    """
    stage.later = []
    for parent in list(stage.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, DeferredLinear(child, stage.later))
    return stage


# -- 3. schedules: who does what, in which order ---------------------------------------------------------

class Action(NamedTuple):
    """One piece of work: ``kind`` F, B (full backward), I (input gradient) or W (weight gradient)
    of micro-batch ``micro`` on model chunk ``chunk`` (the stage index; with ``v`` chunks per rank,
    the "virtual stage")."""

    kind: str
    micro: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}"


def naive(stages: int, micro_batches: int = 1) -> list[list[Action]]:
    """No micro-batching: the whole batch forward through every stage, then backward."""
    if micro_batches != 1:
        raise ValueError(f"the naive schedule sends the whole batch at once: micro_batches must be 1, "
                         f"got {micro_batches} (GPipe is the schedule with micro-batches)")
    return gpipe(stages, 1)


def gpipe(stages: int, micro_batches: int) -> list[list[Action]]:
    """GPipe: every stage runs all ``m`` forwards, then all ``m`` backwards."""
    return [[Action("F", i, s) for i in range(micro_batches)] + [Action("B", i, s) for i in range(micro_batches)]
            for s in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Action]]:
    """1F1B: ``p-1-s`` warm-up forwards, then one forward and one backward in turn, then the remaining backwards.

    The last stage starts backward right after its first forward; stage ``s`` never holds more
    than ``p - s`` micro-batches' activations.
    """
    out = []
    for s in range(stages):
        warmup = min(stages - 1 - s, micro_batches)
        actions = [Action("F", i, s) for i in range(warmup)]
        for i in range(micro_batches - warmup):                  # steady: F of a new one, B of the oldest
            actions += [Action("F", warmup + i, s), Action("B", i, s)]
        actions += [Action("B", i, s) for i in range(micro_batches - warmup, micro_batches)]   # cool-down
        out.append(actions)
    return out


def interleaved(stages: int, micro_batches: int, virtual: int = 2) -> list[list[Action]]:
    """Interleaved 1F1B (Megatron-LM): ``virtual`` chunks per rank, model cut into ``stages * virtual`` chunks.

    A rank's ``k``-th forward is micro-batch ``(k // (p*v)) * p + k % p`` on its local chunk
    ``(k // p) % v``: groups of ``p`` micro-batches go through local chunk 0, then the same group
    through chunk 1, and so on; backwards visit the chunks in reverse. The warm-up is
    ``2(p-1-s) + (v-1)p`` forwards, then 1F1B. Needs ``m`` to be a multiple of ``p``.
    """
    if micro_batches % stages:
        raise ValueError(f"the interleaved schedule sends micro-batches in groups of {stages} (one per rank): "
                         f"micro_batches must be a multiple of {stages}, got {micro_batches}")
    out = []
    total = micro_batches * virtual                          # forwards (and backwards) per rank
    for s in range(stages):
        def nth(k: int, kind: str) -> Action:
            """Rank s's k-th forward (or backward)."""
            local = (k // stages) % virtual
            if kind == "B":
                local = virtual - 1 - local
            return Action(kind, (k // (stages * virtual)) * stages + k % stages, local * stages + s)

        warmup = min(2 * (stages - 1 - s) + (virtual - 1) * stages, total)
        actions = [nth(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            actions += [nth(warmup + k, "F"), nth(k, "B")]
        actions += [nth(k, "B") for k in range(total - warmup, total)]
        out.append(actions)
    return out


def zb_h1(stages: int, micro_batches: int) -> list[list[Action]]:
    """ZB-H1 (zero bubble, "handcrafted 1"): 1F1B with each backward split into I and W.

    Same warm-up as 1F1B. In the steady phase stage ``s`` runs F, I and then a W, except that
    its first ``s`` W's are held back: the last stages answer the I's faster, and the held-back
    W's fill the idle time of the cool-down, one after each I, the rest at the end. Every stage
    then holds at most ``p`` micro-batches (1F1B's stage 0 already does).
    """
    out = []
    for s in range(stages):
        warmup = min(stages - 1 - s, micro_batches)
        actions = [Action("F", i, s) for i in range(warmup)]
        weights = 0                                              # W's done so far, in order
        for i in range(micro_batches - warmup):
            actions += [Action("F", warmup + i, s), Action("I", i, s)]
            if i >= s:
                actions.append(Action("W", weights, s))
                weights += 1
        for i in range(micro_batches - warmup, micro_batches):
            actions.append(Action("I", i, s))
            if weights <= i:
                actions.append(Action("W", weights, s))
                weights += 1
        actions += [Action("W", i, s) for i in range(weights, micro_batches)]
        out.append(actions)
    return out


SCHEDULES = {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1}


def make_schedule(name: str, stages: int, micro_batches: int, virtual: int = 1) -> list[list[Action]]:
    """Every rank's action list for the schedule called ``name`` (a key of :data:`SCHEDULES`).

    ``virtual`` chunks per rank: only the interleaved schedule takes more than 1.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; pick one of {', '.join(SCHEDULES)}")
    for what, value in (("stages", stages), ("micro_batches", micro_batches), ("virtual", virtual)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    if name == "interleaved":
        return interleaved(stages, micro_batches, virtual)
    if virtual != 1:
        raise ValueError(f"only the interleaved schedule runs several chunks per rank; {name!r} needs virtual=1")
    return SCHEDULES[name](stages, micro_batches)


def check_schedule(schedule: list[list[Action]], micro_batches: int, chunks: int) -> None:
    """A ``ValueError`` unless every rank runs, for each micro-batch and each of its chunks, one F
    and either one B or one I and one W, on the right rank.

    It does not prove that the order is free of deadlocks (:func:`simulate` does).
    """
    ranks = len(schedule)
    if chunks % ranks:
        raise ValueError(f"{chunks} chunks cannot be dealt evenly to {ranks} ranks")
    split = any(a.kind in "IW" for actions in schedule for a in actions)
    kinds = ("F", "I", "W") if split else ("F", "B")
    for rank, actions in enumerate(schedule):
        mine = [c for c in range(chunks) if rank_of(c, ranks) == rank]
        want = sorted((k, i, c) for k in kinds for i in range(micro_batches) for c in mine)
        have = sorted(tuple(a) for a in actions)
        if have != want:
            missing = sorted(set(want) - set(have))[:3]
            extra = sorted(set(have) - set(want))[:3]
            raise ValueError(f"rank {rank}'s actions are not one of each: missing {[Action(*a) for a in missing]}, "
                             f"unexpected or repeated {[Action(*a) for a in extra] or _repeated(actions)}")


def _repeated(actions):
    return sorted({a for a in actions if actions.count(a) > 1})


# -- 4. the model: the same action lists, with fixed costs, no processes -----------------------------------

KINDS = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}
"""The trace kind (the colour in a Gantt chart) of each action."""

COLOURS = {"forward": "tab:blue", "backward": "tab:orange", "weight": "tab:green"}


def dependencies(action: Action, chunks: int, split: bool) -> list[tuple]:
    """The actions whose results ``action`` waits for (on any rank)."""
    kind, i, c = action
    if kind == "F":
        return [("F", i, c - 1)] if c > 0 else []
    if kind in "BI":
        downstream = [("I" if split else "B", i, c + 1)] if c < chunks - 1 else []
        return [("F", i, c)] + downstream
    return [("I", i, c)]                                       # W needs its own I


def lane_name(rank: int, ranks: int, chunks: int) -> str:
    """The Gantt lane of a rank: ``"stage 2"``, or with several chunks per rank ``"stages 2,6"``."""
    mine = [str(c) for c in range(chunks) if rank_of(c, ranks) == rank]
    return f"stage {mine[0]}" if len(mine) == 1 else "stages " + ",".join(mine)


@dataclass
class Timeline:
    """What :func:`simulate` predicts for a schedule."""

    events: list[list[Event]]        # per rank, in the same format as measured traces
    length: float                    # time from the first action's start to the last one's end
    bubble: float                    # idle fraction (see bubble_fraction)
    peak_in_flight: list[int]        # per rank: most micro-batch chunks forwarded but not yet fully backwarded


def simulate(schedule: list[list[Action]], forward: float = 1.0, backward: float = 1.0,
             weight: float = 1.0) -> Timeline:
    """Play ``schedule`` with fixed costs: F takes ``forward``, I ``backward``, W ``weight``, B both.

    With ``v`` chunks per rank each cost is divided by ``v`` (a chunk is ``1/v`` of a stage).
    Messages are free and sends never block; an action starts when its rank is free and what it
    needs has finished. If at some point no rank can go on, the schedule would deadlock on real
    ranks too: a ``ValueError`` says what each rank is waiting for.
    """
    ranks = len(schedule)
    chunks = 1 + max(a.chunk for actions in schedule for a in actions)
    virtual = chunks // ranks
    split = any(a.kind in "IW" for actions in schedule for a in actions)
    cost = {"F": forward, "B": backward + weight, "I": backward, "W": weight}
    finished: dict[tuple, float] = {}
    clock, position = [0.0] * ranks, [0] * ranks
    in_flight, peak = [0] * ranks, [0] * ranks
    events: list[list[Event]] = [[] for _ in range(ranks)]
    lanes = [lane_name(r, ranks, chunks) for r in range(ranks)]
    while any(position[r] < len(schedule[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            while position[r] < len(schedule[r]):
                action = schedule[r][position[r]]
                needs = dependencies(action, chunks, split)
                if any(n not in finished for n in needs):
                    break
                start = max([clock[r]] + [finished[n] for n in needs])
                end = start + cost[action.kind] / virtual
                finished[tuple(action)] = clock[r] = end
                events[r].append(Event(r, lanes[r], _label(action, virtual), KINDS[action.kind], start, end))
                if action.kind == "F":
                    in_flight[r] += 1
                elif action.kind in ("B", "W"):                 # (after I, W still needs the inputs)
                    in_flight[r] -= 1
                peak[r] = max(peak[r], in_flight[r])
                position[r] += 1
                progressed = True
        if not progressed:
            waiting = []
            for r in range(ranks):
                if position[r] < len(schedule[r]):
                    action = schedule[r][position[r]]
                    missing = [Action(*n) for n in dependencies(action, chunks, split) if n not in finished]
                    waiting.append(f"rank {r}: {action} (chunk {action.chunk}) waits for "
                                   + ", ".join(f"{n} on chunk {n.chunk}" for n in missing))
            raise ValueError("the schedule deadlocks: " + "; ".join(waiting))
    length = max(clock)
    return Timeline(events, length, bubble_fraction(events), peak)


def _label(action: Action, virtual: int) -> str:
    return str(action) if virtual == 1 else f"{action}c{action.chunk}"


def bubble_fraction(events) -> float:
    """Idle fraction of a step: 1 - (busy rank-seconds) / (ranks x step length).

    The step runs from the earliest start to the latest end over all ranks; a rank is busy
    while one of its events runs. ``events``: one list per rank (from :func:`train_step` or
    :func:`simulate`), or one flat list.
    """
    flat = [e for per_rank in events for e in (per_rank if isinstance(per_rank, list) else [per_rank])]
    ranks = {e.rank for e in flat}
    length = max(e.end for e in flat) - min(e.start for e in flat)
    busy = sum(_busy([(e.start, e.end) for e in flat if e.rank == r]) for r in ranks)
    return 1.0 - busy / (len(ranks) * length)


def _busy(spans) -> float:
    """Total length covered by the ``(start, end)`` spans, overlaps counted once."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def bubble_formula(name: str, stages: int, micro_batches: int, virtual: int = 1, forward: float = 1.0,
                   backward: float = 1.0, weight: float = 1.0) -> float:
    """The textbook idle fraction of a schedule (see the table in the module docstring).

    For zero bubble the costs matter (``forward``, ``backward`` = I, ``weight`` = W; the
    formula assumes ``weight <= forward`` and ``m >= p``: with fewer micro-batches there are too
    few W's to fill the bubble); the others only need each stage to cost the same.
    """
    p, m, v = stages, micro_batches, virtual
    if name == "zb-h1":
        idle = (p - 1) * (forward + backward - weight)
        return idle / (m * (forward + backward + weight) + idle)
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name in ("naive", "gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    raise ValueError(f"unknown schedule {name!r}; pick one of {', '.join(SCHEDULES)}")


# -- 5. the executor: one rank runs its action list ---------------------------------------------------------

class Executor:
    """Runs one rank's actions for one step, talking to the other ranks with ``isend``/``irecv``.

    ``chunks``: ``{chunk index: Stage}`` held by this rank. The state it keeps between actions:
    ``saved`` (a micro-batch's stage input and output, from its F until its backward),
    ``weight_jobs`` (a zero-bubble stage's W work, from its I until its W), the receives posted
    ahead (``posted``) and the sends not yet waited for. It counts the micro-batch chunks in flight and the bytes of activations they
    keep (counted with :func:`distlab.memory.saved_activation_bytes`, plus the received input),
    with their peaks.
    """

    def __init__(self, chunks: dict[int, Stage], total_chunks: int, batch, micro_batches: int,
                 tracer: Tracer | None = None, delay: float = 0.0, group=None):
        self.chunks, self.total_chunks, self.group = chunks, total_chunks, group
        self.ranks, self.rank = world(group)
        self.inputs, self.targets = micro_batches_of(batch, micro_batches)
        self.m = micro_batches
        dim = next(iter(chunks.values())).dim
        self.shape = (*self.inputs[0].shape, dim)             # (micro-batch, seq, dim): what travels
        self.virtual = total_chunks // self.ranks
        self.tracer, self.delay = tracer, delay
        self.lane = lane_name(self.rank, self.ranks, total_chunks)
        self.saved, self.weight_jobs, self.sends, self.local, self.posted = {}, {}, [], {}, {}
        self.loss = None
        self.in_flight = self.peak_in_flight = 0
        self.live_bytes = self.peak_bytes = 0

    def run(self, actions: list[Action]) -> None:
        for k, action in enumerate(actions):
            if k + 1 < len(actions):                          # the next action's input may arrive meanwhile
                self.post_receive(actions[k + 1])
            {"F": self.forward, "B": self.backward, "I": self.backward, "W": self.weight}[action.kind](action)
        for work, _tensor in self.sends:                      # every message has left before the step ends
            work.wait()
        self.sends.clear()

    # -- messages ---------------------------------------------------------------------------------------

    def _tag(self, micro: int, chunk: int, what: str) -> int:
        """One number per message: micro-batch, receiving chunk, activation (0) or gradient (1)."""
        return (micro * self.total_chunks + chunk) * 2 + (what == "gradient")

    def send(self, tensor: torch.Tensor, micro: int, to_chunk: int, what: str) -> None:
        dst = rank_of(to_chunk, self.ranks)
        if dst == self.rank:                                  # the next chunk is on this rank (a 1-rank pipeline)
            self.local[(micro, to_chunk, what)] = tensor
            return
        tensor = tensor.contiguous()
        work = dist.isend(tensor, self._global(dst), group=self.group, tag=self._tag(micro, to_chunk, what))
        self.sends.append((work, tensor))

    def post_receive(self, action: Action) -> None:
        """Start receiving what ``action`` will need from another rank (if anything), without waiting."""
        stage = self.chunks[action.chunk]
        if action.kind == "F" and not stage.first:
            what, src_chunk = "activation", action.chunk - 1
        elif action.kind in "BI" and not stage.last:
            what, src_chunk = "gradient", action.chunk + 1
        else:
            return
        key, src = (action.micro, action.chunk, what), rank_of(src_chunk, self.ranks)
        if src != self.rank and key not in self.posted:
            buffer = torch.empty(self.shape)
            work = dist.irecv(buffer, self._global(src), group=self.group, tag=self._tag(*key))
            self.posted[key] = (work, buffer)

    def receive(self, micro: int, chunk: int, what: str) -> torch.Tensor:
        src = rank_of(chunk - 1 if what == "activation" else chunk + 1, self.ranks)
        if src == self.rank:
            return self.local.pop((micro, chunk, what))
        self.post_receive(Action("F" if what == "activation" else "B", micro, chunk))
        work, buffer = self.posted.pop((micro, chunk, what))
        work.wait()
        return buffer

    def _global(self, rank: int) -> int:
        """The global rank of pipeline rank ``rank`` (they differ inside a pipeline ``group``)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    # -- the three kinds of work ----------------------------------------------------------------------------

    @contextmanager
    def _work(self, action: Action, cost: float):
        """Trace the action's compute, and sleep ``delay * cost / v`` inside it (pretend compute)."""
        span = self.tracer.span(_label(action, self.virtual), self.lane, KINDS[action.kind]) if self.tracer else nullcontext()
        with span:
            yield
            if self.delay:
                time.sleep(self.delay * cost / self.virtual)

    def forward(self, action: Action) -> None:
        micro, chunk = action.micro, action.chunk
        stage = self.chunks[chunk]
        x = self.inputs[micro] if stage.first else self.receive(micro, chunk, "activation").requires_grad_()
        with self._work(action, 1.0), memory.saved_activation_bytes() as saved:
            out = stage(x)
            if stage.last:                                    # this micro-batch's share of the full-batch mean
                out = F.cross_entropy(out.reshape(-1, out.shape[-1]), self.targets[micro].reshape(-1)) / self.m
        if stage.last:
            self.loss = out.detach() if self.loss is None else self.loss + out.detach()
        else:
            self.send(out.detach(), micro, chunk + 1, "activation")
        nbytes = saved.bytes + (0 if stage.first else memory.storage_bytes([x]))   # a leaf: the hook skips it
        self.saved[(micro, chunk)] = (x, out, nbytes)
        self._count(+1, nbytes)

    def backward(self, action: Action) -> None:
        """B (input and weight gradients) or I (input gradient; the W work is queued for later)."""
        micro, chunk = action.micro, action.chunk
        stage = self.chunks[chunk]
        x, out, nbytes = self.saved.pop((micro, chunk))
        grad = None if stage.last else self.receive(micro, chunk, "gradient")
        with self._work(action, 2.0 if action.kind == "B" else 1.0):
            torch.autograd.backward(out, grad)
        if not stage.first:
            self.send(x.grad, micro, chunk - 1, "gradient")
        if action.kind == "I":
            self.weight_jobs[(micro, chunk)] = (list(stage.later), nbytes)
            stage.later.clear()
        else:
            self._count(-1, nbytes)

    def weight(self, action: Action) -> None:
        jobs, nbytes = self.weight_jobs.pop((action.micro, action.chunk))
        with self._work(action, 1.0):
            for job in jobs:
                job()
        self._count(-1, nbytes)

    def _count(self, micro_batches: int, nbytes: int) -> None:
        self.in_flight += micro_batches
        self.live_bytes += micro_batches * nbytes
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)


# -- 6. one step on a rank --------------------------------------------------------------------------------

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
             delay: float = 0.0, trace: bool = True, group=None) -> StepResult:
    """Run this rank's part of ``schedule`` on ``chunks`` (gradients accumulate in ``.grad``).

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
    executor = Executor(chunks, total, batch, micro_batches, Tracer() if trace else None, delay, group)
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


# -- 7. the same with torch.distributed.pipelining ----------------------------------------------------------

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


# -- 8. drawing -------------------------------------------------------------------------------------------

def draw(events, ax=None, title: str = "", unit: str = "ms", labels: bool = True):
    """A Gantt chart of a pipelined step (measured, or modelled by :func:`simulate`).

    One row per rank; F blue, B and I orange, W green; white is the bubble. A modelled
    timeline's times are in cost units: draw it with ``unit="s"``.
    """
    from distlab.trace import gantt

    return gantt(events, ax=ax, colours=COLOURS, labels=labels, unit=unit, title=title, legend="beside")
