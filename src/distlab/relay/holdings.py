"""What the relay's router holds for the ranks, counted, and the caps on it.

The router (:mod:`distlab.relay.router`) runs in the grader's clean room: every byte it keeps
for a rank is the grader's memory. A rank may send and send to a rank that never receives,
announce a frame of gigabytes, or stop reading what the router has for it; without caps the
grader would hold it all. So the router counts, per rank:

* what it *sent that was not received yet*: a message counts from the moment the router reads
  it until the destination's link reports that a receive took it (a ``taken`` frame,
  :mod:`distlab.relay.link`, which also completes the sender's send). The router hands a
  message on at once, so most of those bytes sit in the destination's own memory, not the
  grader's; counting them anyway bounds both, and names the sender, whose code is at fault;
* its share of *collectives still waiting* for the other ranks of their group;
* the payload of the frame it is writing now (reserved on the frame's header, before a byte
  of the payload is read);
* what is *queued for* it: written by the router, not yet read by the rank.

Bytes here are whole frames (:mod:`distlab.relay.frames`): the prefix, the header (the tag, the
tensor's description, anything else the rank wrote there) and the payload, everything a rank
made the router read. The record (:mod:`distlab.relay.record`) counts payloads only, the bytes
:mod:`distlab.tools.comm_bytes` calls ``S``, because the exercises' rules are stated in those
(chapter 2's chunks, chapter 8's ``ring_bytes_per_step``); the caps count what the router and
the receiver really hold. So empty messages are bounded twice: by number
(:data:`MOST_UNRECEIVED_MESSAGES`) and by bytes, however large the headers their sender wrote.

:func:`Holdings.refusal` checks a new frame against :data:`MOST_HELD_PER_RANK`,
:data:`MOST_UNRECEIVED_MESSAGES` and :data:`MOST_HELD_TOTAL` and returns the verdict when it
passes one (``rank 1 sent more than 256 MiB that rank 0 has not received yet (its send to rank
0, tag 0) ...``); the router then stops the run with it. Honest runs stay far below: the book's
largest graded payloads are a few MiB per rank, and a receive posted for every send keeps the
count near zero however much is sent in all.
"""

from __future__ import annotations

MiB = 1 << 20
MOST_HELD_PER_RANK = 256 * MiB
"""Bytes held for one rank at most: sent and not received yet, plus its share of waiting collectives
(also: the largest frame, and what may wait to be read by one rank)."""
MOST_HELD_TOTAL = 1024 * MiB
"""Bytes the router holds in its own memory for all the ranks of a run together at most."""
MOST_UNRECEIVED_MESSAGES = 100_000
"""Messages of one rank not received yet at most (an empty message still costs a header)."""


def operation(header: dict) -> str:
    """The operation a frame carries, in words, for a verdict."""
    if header.get("k") == "send":
        return f"its send to rank {header.get('dst')!r}, tag {header.get('tag', 0)!r}"
    if header.get("k") == "coll":
        return f"its {header.get('op')!r}"
    return f"a frame {header.get('k')!r}"


class Holdings:
    """The counts of one router's ranks (see the module docstring)."""

    def __init__(self, nprocs: int):
        n = range(nprocs)
        self.unreceived, self.unreceived_count = dict.fromkeys(n, 0), dict.fromkeys(n, 0)
        self.in_flight: dict[tuple, list] = {}       # (src, dst) -> [bytes, messages] not yet received
        self.waiting, self.queued, self.reading = dict.fromkeys(n, 0), dict.fromkeys(n, 0), dict.fromkeys(n, 0)

    def refusal(self, rank: int, header: dict, size: int) -> str | None:
        """Why rank ``rank``'s new frame (``header``; ``size`` bytes in all) must not be held, or
        ``None``: then it is counted as being read until :meth:`read`."""
        what, cap = operation(header), MOST_HELD_PER_RANK // MiB
        if size > MOST_HELD_PER_RANK:
            return (f"rank {rank} announced a message of {size // MiB} MiB ({what}); the grader's network "
                    f"carries at most {cap} MiB per rank at once")
        if self.unreceived[rank] + self.waiting[rank] + size > MOST_HELD_PER_RANK:
            return (f"rank {rank} sent more than {cap} MiB that rank {self.late_receiver(rank)} has not received "
                    f"yet ({what}); the grader's network holds at most {cap} MiB per rank: post the receives "
                    "as you send")
        if header.get("k") == "send" and self.unreceived_count[rank] >= MOST_UNRECEIVED_MESSAGES:
            return (f"rank {rank} sent more than {MOST_UNRECEIVED_MESSAGES} messages that rank "
                    f"{self.late_receiver(rank)} has not received yet ({what})")
        held = sum(self.queued.values()) + sum(self.waiting.values()) + sum(self.reading.values())
        if held + size > MOST_HELD_TOTAL:
            return (f"the ranks made the grader's network hold more than {MOST_HELD_TOTAL // MiB} MiB at once "
                    f"(rank {rank}, {what})")
        self.reading[rank] = size
        return None

    def read(self, rank: int) -> None:
        """Rank ``rank``'s frame is complete (handed on or dropped)."""
        self.reading[rank] = 0

    def late_receiver(self, src: int) -> int:
        """The rank holding up the most of ``src``'s messages."""
        late: dict[int, int] = {}
        for (s, d), (size, count) in self.in_flight.items():
            if s == src:
                late[d] = size + count
        return max(late, key=late.get) if late else src

    def sent(self, src: int, dst: int, size: int) -> None:
        """Rank ``src`` sent a frame of ``size`` bytes to ``dst``: held for ``src`` until :meth:`took`."""
        self._count(src, dst, size, 1)

    def took(self, src: int, dst: int, size: int) -> None:
        """Rank ``dst`` received a message of ``size`` bytes from ``src``. The router knows each
        message by its number, and calls this once per message, for its receiver only."""
        self._count(src, dst, -size, -1)

    def _count(self, src: int, dst: int, size: int, messages: int) -> None:
        self.unreceived[src] += size
        self.unreceived_count[src] += messages
        pair = self.in_flight.setdefault((src, dst), [0, 0])
        pair[0] += size
        pair[1] += messages

    def queue_verdict(self, rank: int) -> str | None:
        """Why the router must stop queueing for rank ``rank`` (it does not read), or ``None``."""
        if self.queued[rank] > MOST_HELD_PER_RANK:
            return (f"rank {rank} has not read the {self.queued[rank] // MiB} MiB the grader's network has for "
                    f"it (at most {MOST_HELD_PER_RANK // MiB} MiB wait for a rank)")
        return None
