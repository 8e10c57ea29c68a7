"""The bubble formula with the machine in it: measure what messages cost, then predict the bubble.

The textbook bubble, ``(p-1)/(m+p-1)`` for GPipe and 1F1B, assumes equal stages and free
messages. Measured steps sit above it, and by more for the schedules that send more messages
for the same work (interleaved) or whose bubble is already small (zero bubble). Two costs,
read off measured timelines, account for the difference:

* **hand-off** (:func:`message_costs`): from the end of an action on one rank to the start of
  the action on the next rank that waited for its result (an activation, a gradient), when
  that rank had nothing else to do. The message, and waking the process that waits for it.
* **overhead**: between two actions on one rank when nothing was waited for: posting the
  receives, starting the sends, the executor's bookkeeping.

Both are properties of the machine and the runtime, not of a schedule, so they are measured
once, pooled over every schedule's steps. :func:`predicted_bubble` plays a schedule in
:func:`~.timeline.simulate` with them, and with each stage's measured compute time (the first
stage also embeds, the last also computes the loss: real stages are not equal). With both
costs at zero and equal stages it gives the textbook formula back, its limit for free messages.
"""

from __future__ import annotations

import statistics

from distlab.pipeline_parallel.schedules import Action
from distlab.pipeline_parallel.stages import rank_of
from distlab.pipeline_parallel.timeline import _label, dependencies, simulate


def _matched(schedule: list[list[Action]], events) -> list[list[tuple]]:
    """Pair every rank's measured events with its schedule's actions, in order (checked by label)."""
    chunks = 1 + max(a.chunk for actions in schedule for a in actions)
    virtual = chunks // len(schedule)
    pairs = []
    for rank, (actions, spans) in enumerate(zip(schedule, events)):
        labels = [_label(a, virtual) for a in actions]
        if [e.name for e in spans] != labels:
            raise ValueError(f"rank {rank}'s events are not its schedule's actions: "
                             f"{[e.name for e in spans][:6]}... vs {labels[:6]}...")
        pairs.append(list(zip(actions, spans)))
    return pairs


def action_durations(schedule: list[list[Action]], steps) -> dict[tuple[str, int], float]:
    """Median measured seconds of each kind of action on each chunk: ``{("F", 0): 0.021, ...}``.

    ``steps``: the measured steps of ``schedule``, each one list of events per rank.
    """
    samples: dict[tuple[str, int], list[float]] = {}
    for events in steps:
        for pairs in _matched(schedule, events):
            for action, event in pairs:
                samples.setdefault((action.kind, action.chunk), []).append(event.duration)
    return {key: statistics.median(values) for key, values in samples.items()}


def message_costs(runs) -> tuple[float, float]:
    """``(hand_off, overhead)`` in seconds, averaged over every step of every run.

    ``runs``: ``(schedule, steps)`` pairs. An action whose input came from another rank after
    its own rank's previous action had ended waited for a message: its start minus that
    input's end is one hand-off. An action whose inputs had all arrived (made at least a
    hand-off before its rank was free) started after its rank's previous action by the
    overhead. Means, not medians: idle time adds up, so the model needs the average cost,
    slow wake-ups included.
    """
    waits, gaps = [], []              # (start - remote input's end), and (start - previous end, inputs' end)
    for schedule, steps in runs:
        ranks = len(schedule)
        chunks = 1 + max(a.chunk for actions in schedule for a in actions)
        split = any(a.kind in "IW" for actions in schedule for a in actions)
        for events in steps:
            matched = _matched(schedule, events)
            end_of = {tuple(action): event.end for pairs in matched for action, event in pairs}
            for rank, pairs in enumerate(matched):
                for k, (action, event) in enumerate(pairs):
                    previous_end = pairs[k - 1][1].end if k else None
                    remote = max((end_of[need] for need in dependencies(action, chunks, split)
                                  if rank_of(need[2], ranks) != rank), default=None)
                    if remote is not None and (previous_end is None or remote > previous_end):
                        waits.append(event.start - remote)
                    elif previous_end is not None:
                        gaps.append((event.start - previous_end, previous_end - (remote or float("-inf"))))
    hand_off = statistics.fmean(waits)
    overhead = statistics.fmean(gap for gap, input_early in gaps if input_early >= hand_off)
    return hand_off, overhead


def predicted_bubble(schedule: list[list[Action]], steps, hand_off: float, overhead: float) -> float:
    """The idle fraction :func:`~.timeline.simulate` predicts for ``schedule`` with the measured
    stage times of ``steps`` and the message costs of :func:`message_costs`."""
    durations = action_durations(schedule, steps)
    return simulate(schedule, hand_off=hand_off, overhead=overhead, durations=durations).bubble
