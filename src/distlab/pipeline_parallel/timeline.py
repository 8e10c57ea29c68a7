"""Timelines of a pipelined step: modelled with fixed costs, measured on ranks, drawn, and their bubble.

:func:`simulate` is a *model*: it plays a schedule's action lists with a fixed cost per action
(F costs ``forward``, B ``backward + weight``, ...), messages free, no processes. That is what
the book's widget draws, and it finds schedules that would deadlock on real ranks.
:func:`bubble_fraction` measures the idle share of any timeline, modelled or measured (from the
spans :mod:`.training` records on each rank); :func:`bubble_formula` is the textbook value.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.pipeline_parallel.schedules import SCHEDULES, Action
from distlab.pipeline_parallel.stages import rank_of
from distlab.tools.trace import Event

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
             weight: float = 1.0, hand_off: float = 0.0, overhead: float = 0.0,
             durations: dict | None = None) -> Timeline:
    """Play ``schedule`` with fixed costs: F takes ``forward``, I ``backward``, W ``weight``, B both.

    With ``v`` chunks per rank each cost is divided by ``v`` (a chunk is ``1/v`` of a stage).
    An action starts when its rank is free and what it needs has finished; what it needs from
    another rank (an activation, a gradient) arrives ``hand_off`` after it was made: the cost
    of one message between stages. ``overhead`` is the rank's own bookkeeping between two
    actions (posting receives, starting sends), idle time in a measured trace. With both 0,
    messages are free, as in the textbook formulas; sends never block. ``durations``
    (optional) gives measured costs per ``(kind, chunk)``, in seconds, for stages that are not
    equal (the first embeds, the last computes the loss). If at some point no rank can go on,
    the schedule would deadlock on real ranks too: a ``ValueError`` says what each rank is
    waiting for.
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
                start = max([clock[r] + overhead] + [finished[n] + (hand_off if rank_of(n[2], ranks) != r else 0.0)
                                                     for n in needs])
                if durations is not None:
                    end = start + durations[(action.kind, action.chunk)]
                else:
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


def draw(events, ax=None, title: str = "", unit: str = "ms", labels: bool = True):
    """A Gantt chart of a pipelined step (measured, or modelled by :func:`simulate`).

    One row per rank; F blue, B and I orange, W green; white is the bubble. A modelled
    timeline's times are in cost units: draw it with ``unit="s"``.
    """
    from distlab.tools.trace import gantt

    return gantt(events, ax=ax, colours=COLOURS, labels=labels, unit=unit, title=title, legend="beside")
