"""The router's record: every message and collective of a run, written down outside the ranks.

The router (:mod:`distlab.relay.router`) appends one entry for everything a rank hands it, in
the order it reads them:

* a :class:`Message`: ``src`` sent ``nbytes`` bytes to ``dst`` with ``tag``. The source is the
  descriptor the bytes came in on, which the router gave that rank at launch: a rank cannot
  sign a message with another rank's number;
* a :class:`Collective`: the ranks of a group called ``op`` together; ``sent[i]`` is what group
  rank ``i`` counts under :mod:`distlab.tools.comm_bytes`'s rules (see
  :mod:`distlab.relay.collectives`), ``sizes[i]`` the bytes of its parts.

Who reads it: ``with capture() as record: <runs>`` collects what every router in this process
writes while the block runs (the grader's checks, :func:`distlab.grade.checks.run_ranks`).
The record lives in the process that owns the routers (the grader's clean room, or a student's
kernel): the ranks hold no reference to it, only their end of a descriptor.

The checks here are the exercises' rules, stated on the record:

* :func:`check_ring`: chapter 2's ring. Per case and phase, every rank sends ``N-1`` messages,
  each to its right neighbour ``(r + 1) % N``, each one chunk of ``torch.tensor_split`` (so
  ``floor`` or ``ceil`` of ``numel / N`` elements), and no collective is called at all;
* :func:`ring_schedule`: the exact messages of the book's ring, for tests of the relay itself;
  :func:`pipeline_schedule` and :func:`kv_ring_schedule` the same for chapter 6's pipeline
  and chapter 8's ring attention (their rules are checked in :mod:`distlab.grade.relay_checks`);
* :meth:`Record.sent_by` and :meth:`Record.collective_calls`: the bytes a rank sent and the
  collectives it called, for byte limits (chapter 0) and call sequences (chapter 3).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    nbytes: int
    tag: int = 0
    order: int = 0


@dataclass(frozen=True)
class Collective:
    op: str
    ranks: tuple          # global ranks of the group, in group order
    sent: tuple           # per group rank, bytes counted as sent
    sizes: tuple          # per group rank, bytes of the parts it handed in
    reduction: str = ""
    order: int = 0


class RecordMismatch(AssertionError):
    """The record breaks the exercise's rule; the message is safe to show a student."""


@dataclass
class Record:
    entries: list = field(default_factory=list)
    seeds: set = field(default_factory=set)   # the seeds of the routers that delayed messages (relay.schedule)

    def messages(self) -> list[Message]:
        return [e for e in self.entries if isinstance(e, Message)]

    def collectives(self) -> list[Collective]:
        return [e for e in self.entries if isinstance(e, Collective)]

    def sent_by(self, rank: int) -> int:
        """Bytes global rank ``rank`` sent: its messages, and its counted share of collectives."""
        total = sum(m.nbytes for m in self.messages() if m.src == rank)
        for c in self.collectives():
            if rank in c.ranks:
                total += c.sent[c.ranks.index(rank)]
        return total

    def collective_calls(self, rank: int) -> list[tuple[str, int]]:
        """``[(op, bytes of its parts)]`` of the collectives ``rank`` took part in, in order."""
        return [(c.op, c.sizes[c.ranks.index(rank)]) for c in self.collectives() if rank in c.ranks]

    def describe(self, limit: int = 6) -> str:
        """A short account, for failure messages."""
        lines = []
        for e in self.entries[:limit]:
            if isinstance(e, Message):
                lines.append(f"rank {e.src} -> rank {e.dst}: {e.nbytes} bytes")
            else:
                lines.append(f"{e.op} on ranks {list(e.ranks)}")
        if len(self.entries) > limit:
            lines.append(f"... and {len(self.entries) - limit} more")
        return "; ".join(lines) or "nothing"


# -- capturing what the routers record ----------------------------------------------------------

_lock = threading.Lock()
_captures: list[Record] = []
_routers: set = set()


def publish(entry) -> None:
    """Called by the routers: hand an entry to every capture that is open."""
    with _lock:
        for record in _captures:
            record.entries.append(entry)


def _seed_of(router) -> set:
    schedule = getattr(router, "schedule", None)
    return {schedule.seed} if schedule is not None else set()


def register_router(router) -> None:
    with _lock:
        _routers.add(router)
        for record in _captures:
            record.seeds |= _seed_of(router)


def unregister_router(router) -> None:
    with _lock:
        _routers.discard(router)


@contextlib.contextmanager
def capture():
    """``with capture() as record:``: ``record`` holds what the routers saw during the block.

    At the end every router first reads what is already waiting on its descriptors (a rank
    whose call returned wrote its last message before its result), so nothing a call sent is
    left out for arriving late.
    """
    record = Record()
    with _lock:
        _captures.append(record)
        for router in _routers:
            record.seeds |= _seed_of(router)
    try:
        yield record
    finally:
        with _lock:
            routers = list(_routers)
        for router in routers:
            router.settle()
        with _lock:
            _captures.remove(record)


# -- the exercises' rules, on the record ---------------------------------------------------------

def chunk_sizes(numel: int, n: int) -> list[int]:
    """Elements of each chunk of ``torch.tensor_split`` of ``numel`` elements into ``n``."""
    return [numel // n + (1 if i < numel % n else 0) for i in range(n)]


def ring_schedule(numel: int, itemsize: int, n: int, phases=("reduce_scatter", "all_gather")) -> list[tuple]:
    """``(src, dst, bytes)`` of every message of the book's ring, step by step, rank by rank.

    Reduce-scatter step ``s``: rank ``r`` sends chunk ``(r - s - 1) % n``; all-gather step ``s``:
    chunk ``(r - s) % n``; always to ``(r + 1) % n``.
    """
    sizes = chunk_sizes(numel, n)
    schedule = []
    for phase in phases:
        shift = 1 if phase == "reduce_scatter" else 0
        for step in range(n - 1):
            for r in range(n):
                schedule.append((r, (r + 1) % n, sizes[(r - step - shift) % n] * itemsize))
    return schedule


def by_sender(messages) -> dict[int, list[tuple[int, int]]]:
    """``{src: [(dst, bytes), ...]}`` in the order each rank sent them. Ranks run at once, so the
    order *between* ranks is the luck of the moment; each rank's own order is not."""
    found: dict[int, list] = {}
    for m in messages:
        src, dst, nbytes = (m.src, m.dst, m.nbytes) if isinstance(m, Message) else m
        found.setdefault(src, []).append((dst, nbytes))
    return found


def check_ring(record: Record, n: int, cases: list[tuple], what: str = "a ring") -> None:
    """Raise :class:`RecordMismatch` unless the record is a ring for every case, in order.

    ``cases``: ``(numel, itemsize, phases)`` per case, ``phases`` the number of ring passes it
    makes (1 for a reduce-scatter or an all-gather, 2 for an all-reduce).
    """
    if record.collectives():
        ops = sorted({c.op for c in record.collectives()})
        raise RecordMismatch(f"the grader saw built-in collectives ({', '.join(ops)}) go through its network; "
                             f"{what} is made of send and receive only")
    for rank in range(n):
        mine = [m for m in record.messages() if m.src == rank]
        expected = sum(phases * (n - 1) for _, _, phases in cases)
        right = (rank + 1) % n
        wrong_way = [m for m in mine if m.dst != right]
        if wrong_way:
            raise RecordMismatch(f"rank {rank} sent {wrong_way[0].nbytes} bytes to rank {wrong_way[0].dst}; in "
                                 f"{what} every rank sends to its right neighbour only (rank {right})")
        if len(mine) != expected:
            raise RecordMismatch(f"rank {rank} sent {len(mine)} messages; {what} sends {n - 1} per pass "
                                 f"around the ring, {expected} for these cases")
        index = 0
        for case, (numel, itemsize, phases) in enumerate(cases):
            allowed = {size * itemsize for size in set(chunk_sizes(numel, n))}
            for m in mine[index:index + phases * (n - 1)]:
                if m.nbytes not in allowed:
                    raise RecordMismatch(f"case {case}: rank {rank} sent a message of {m.nbytes} bytes; each "
                                         f"message of {what} is one chunk ({' or '.join(map(str, sorted(allowed)))} "
                                         "bytes here)")
            index += phases * (n - 1)


def pipeline_schedule(orders: list[list[str]], message_bytes: list[int]) -> list[tuple]:
    """``(src, dst, bytes)`` of every message of a pipeline step, each stage's in its own order.

    ``orders[s]``: stage ``s``'s actions (``"F3"``, ``"B0"``, ...) as it runs them;
    ``message_bytes[i]``: bytes of micro-batch ``i``'s activation, and so of its gradient. F of
    micro-batch ``i`` sends the activation to the next stage (unless last), B sends the
    gradient of the stage's input to the previous one (unless first).
    """
    p, schedule = len(orders), []
    for s, order in enumerate(orders):
        for label in order:
            i = int(label[1:])
            if label[0] == "F" and s < p - 1:
                schedule.append((s, s + 1, message_bytes[i]))
            elif label[0] == "B" and s > 0:
                schedule.append((s, s - 1, message_bytes[i]))
    return schedule


def kv_ring_schedule(block_bytes: list[int]) -> list[tuple]:
    """``(src, dst, bytes)`` of chapter 8's ring: in step ``t`` rank ``r`` passes the block of rank
    ``r - t`` (``block_bytes[r - t]``, keys and values together) to ``r + 1``, as two messages of
    half that, keys then values; ``N - 1`` steps (the last block stays)."""
    n, schedule = len(block_bytes), []
    for r in range(n):
        for step in range(n - 1):
            half = block_bytes[(r - step) % n] // 2
            schedule += [(r, (r + 1) % n, half), (r, (r + 1) % n, half)]
    return schedule
