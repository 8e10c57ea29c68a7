"""A seeded schedule for the relay's deliveries: messages late and out of order, as a real network
may have them, to catch solutions that work only by luck of timing.

Off by default. With ``DISTLAB_RELAY_SEED=<n>`` in the environment of the process that runs the
router (a kernel, a script), or of the grading command (``python -m distlab.grade autograde``,
which hands it to its clean rooms, below), each message the router delivers waits first,
between 0 and :data:`MOST_DELAY_S` seconds drawn from a generator seeded with ``n``. Messages
between *different* pairs of ranks then arrive in another order than they were sent; between one
pair they never do: a message is never delivered before the one its sender sent to the same
destination before it (torch keeps that order, and so does every backend). Collectives are not
delayed: nothing can be read of their result before they complete.

What it catches: a receive whose buffer is read before ``wait()`` (it holds the message only if
the message happened to arrive first), a ``recv`` from the wrong rank that works because that
rank usually sends first, a barrier left out between phases. A solution correct under every
schedule passes under every seed; the same seed gives the same delays for the same messages, so
a failure can be replayed. Why off by default: every delayed message makes a graded run
longer, and the course's figures (``benchmarks/autograde.py``) are for the plain relay; a course
that wants it grades with a few seeds, one run each, and keeps the seed of each in its log.

The ranks never see the seed. With it, a rank could draw the same delays and know which of its
messages will be late: a solution could then wait exactly where this run needs it and pass by
luck that it computed in advance. So only the router's process knows it: a launcher leaves
:data:`VARIABLE` out of every rank's environment (:func:`without_seed`), and the grader does not
put it in the clean room's environment at all (a forked process keeps showing its parent's
first environment in ``/proc/self/environ``, and the clean room's ranks descend from it by
forks): the seed travels in the clean room's job, on a pipe, and :func:`choose` sets it there.
"""

from __future__ import annotations

import heapq
import os
import random
import time

VARIABLE = "DISTLAB_RELAY_SEED"
MOST_DELAY_S = 0.05
"""The longest a message waits before the router delivers it."""


_chosen: int | None = None   # the seed the clean room's job named (see choose)


def seed_from_environment() -> int | None:
    """The seed ``$DISTLAB_RELAY_SEED`` names in this process's environment, or ``None``."""
    seed = os.environ.get(VARIABLE, "").strip()
    return int(seed) if seed else None


def choose(seed: int | None) -> None:
    """Delay every router this process makes from now on with ``seed`` (``None``: as the environment
    says): how the clean room, whose environment never holds the seed, is given it."""
    global _chosen
    _chosen = None if seed is None else int(seed)


def without_seed(env: dict) -> dict:
    """``env`` without the seed: the environment a launcher may hand to an agent and its ranks."""
    return {name: value for name, value in env.items() if name != VARIABLE}


def from_environment() -> "Schedule | None":
    """The schedule of the chosen seed, or else of ``$DISTLAB_RELAY_SEED``; ``None``: deliver at once."""
    seed = _chosen if _chosen is not None else seed_from_environment()
    return Schedule(seed) if seed is not None else None


class Schedule:
    """When each message is due, and the messages waiting for their time."""

    def __init__(self, seed: int):
        self.seed = seed
        self._random = random.Random(seed)
        self._last_due: dict[tuple[int, int], float] = {}   # (src, dst) -> due time of its latest message
        self._waiting: list = []                            # heap of (due, order, delivery)
        self._order = 0

    def hold(self, src: int, dst: int, delivery) -> None:
        """Keep ``delivery`` until its time: a random delay, never before the pair's previous message."""
        due = max(time.monotonic() + self._random.uniform(0, MOST_DELAY_S), self._last_due.get((src, dst), 0.0))
        self._last_due[(src, dst)] = due
        self._order += 1
        heapq.heappush(self._waiting, (due, self._order, delivery))

    def due(self) -> list:
        """The deliveries whose time has come, in order."""
        now, found = time.monotonic(), []
        while self._waiting and self._waiting[0][0] <= now:
            found.append(heapq.heappop(self._waiting)[2])
        return found

    def timeout(self) -> float | None:
        """Seconds until the next delivery is due (``None``: nothing waits)."""
        return max(0.0, self._waiting[0][0] - time.monotonic()) if self._waiting else None

    def clear(self) -> None:
        self._waiting.clear()
