"""Pipeline schedules: who does what, in which order, as one list of actions per rank.

A schedule is a function of the number of stages ``p`` and micro-batches ``m`` that returns,
for every rank, its ordered list of :class:`Action` s: ``F`` (forward of a micro-batch on a
chunk), ``B`` (its backward), or for zero-bubble schedules ``I`` and ``W`` (the two halves of
B, see :mod:`.zero_bubble`). The same lists drive the real run (:mod:`.executor`) and the
model of it (:mod:`.timeline`).
"""

from __future__ import annotations

from typing import NamedTuple

from distlab.pipeline_parallel.stages import rank_of


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
        def nth(k: int, kind: str, s: int = s) -> Action:
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
