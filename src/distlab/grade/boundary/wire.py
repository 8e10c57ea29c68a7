"""Bytes on the wire, counted by the operating system: what the ranks cannot edit.

The exercises limit how many bytes a rank may send (a ring all-reduce sends ``2(N-1)/N`` of
the tensor, a naive one ``N-1`` times it). Those bytes are counted by
:mod:`distlab.tools.comm`, a recorder that wraps ``torch.distributed`` *inside* each rank,
in the same process as the student's code, which can reach around it (the unwrapped
functions are one attribute away) or edit what it wrote down. So when grading, the count is
checked against one the ranks cannot touch: the kernel's byte counter of the network
interface.

Why that counter means something here: the grader's clean room runs in a network namespace
of its own (:mod:`distlab.grade.boundary.bubblewrap`), whose only interface is a private loopback.
Every byte any rank sends to another crosses it, and nothing else does: no other process of
the machine is in that namespace. The counter (``/proc/net/dev``, "lo", bytes transmitted)
is read by the clean room before and after each run. On a machine's shared loopback, with
other users' traffic in it, the count would mean nothing, so :func:`start_metering` switches
this on only where the namespace holds loopback alone; elsewhere (a student's own kernel, a
grader with ``DISTLAB_GRADE_SANDBOX=none``) the recorder's count is all there is.

What else crosses the wire, and the allowance for it (:func:`allowance`, measured with
``torch==2.13`` and gloo on 2 and 4 ranks of a warm pool, see ``tests/grade/test_wire.py``):

* each run of a warm pool: 9 to 10 KB per rank for its hand-shakes (the pool's store), plus
  about 0.5 KB per rank per second while it runs. Allowed: 24 KiB per rank, and 2 KiB per
  rank per second.
* each collective call: headers, acknowledgements and a few small messages of the algorithm,
  1 to 1.5 KB per rank for a 12-byte all-reduce. Allowed: 4 KiB per rank per recorded call,
  for at most 64 calls (so a rank cannot buy itself room by recording calls it never made).
* the payload itself: 0.4 % more than the rule counts for a 1 MiB all-reduce (TCP and gloo
  headers). Allowed: 2 %.

A run passes when the counter grew by no more than ``nprocs`` times the most each rank may
send, plus that allowance. A hidden test then only has to move enough data that sending
more than the rule allows is far beyond the allowance (chapter 0 sends 1 MiB on 4 ranks:
a gather-based mean puts 6 MB more on the wire than the ring).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

PER_RUN_BYTES = 24 * 1024
PER_SECOND_BYTES = 2 * 1024
PER_CALL_BYTES = 4 * 1024
MOST_CALLS_ALLOWED_FOR = 64
PAYLOAD_OVERHEAD = 0.02

_metering = False


def interfaces() -> dict[str, int]:
    """``{interface: bytes transmitted}`` of this process's network namespace."""
    sent = {}
    with open("/proc/self/net/dev") as table:
        for line in table.readlines()[2:]:
            name, _, counters = line.partition(":")
            sent[name.strip()] = int(counters.split()[8])
    return sent


def start_metering() -> bool:
    """Count bytes on the wire from now on, if this namespace holds loopback alone (the clean
    room's sandbox); return whether it does."""
    global _metering
    _metering = set(interfaces()) == {"lo"}
    return _metering


def stop_metering() -> None:
    global _metering
    _metering = False


def metering() -> bool:
    return _metering


@dataclass
class Measured:
    """What crossed the wire during one run of ``nprocs`` ranks (``sent`` is None when not metered)."""

    nprocs: int
    sent: int | None = None
    seconds: float = 0.0

    def allowed(self, most_per_rank: float, calls: int) -> int:
        """The most this run may have put on the wire, if each rank sends at most
        ``most_per_rank`` bytes of payload in ``calls`` recorded calls."""
        return allowance(self.nprocs, most_per_rank, calls, self.seconds)


def allowance(nprocs: int, most_per_rank: float, calls: int, seconds: float) -> int:
    per_rank = (most_per_rank * (1 + PAYLOAD_OVERHEAD) + PER_RUN_BYTES + PER_SECOND_BYTES * seconds
                + PER_CALL_BYTES * min(calls, MOST_CALLS_ALLOWED_FOR))
    return int(nprocs * per_rank)


@contextlib.contextmanager
def measure(nprocs: int):
    """``with measure(n) as m: <one run>``: afterwards ``m.sent`` holds the bytes the run put on
    the wire (None when not metering) and ``m.seconds`` how long it took."""
    measured = Measured(nprocs)
    before, start = (interfaces()["lo"] if _metering else None), time.monotonic()
    try:
        yield measured
    finally:
        measured.seconds = time.monotonic() - start
        if before is not None:
            measured.sent = interfaces()["lo"] - before
