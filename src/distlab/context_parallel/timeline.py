"""Ring attention's timeline, measured: when each rank computed, when its blocks were on the wire, when it waited.

:func:`~distlab.context_parallel.ring.ring_attention` posts each step's transfer *before* it
computes on the block it holds, so that the two can run at once. Whether they do is a matter
of measurement, and :func:`traced` measures it on every rank without changing the ring's
code: while it is active, three of the functions the ring calls are wrapped.

* ``blockwise.block_attention``, ``blockwise.merge`` and ``blockwise.block_backward``: the
  compute, one span per call (kind ``"forward"`` or ``"backward"``);
* ``ring._post_exchange``: the transfer, from the moment it is posted until both its send and
  its receive have completed (kind ``"comm"``). gloo's point-to-point requests have no future
  to report their completion, and waiting on one twice is not allowed, so a helper thread is
  the only one that waits on them: it notes the time they complete and then lets the ring go on;
* ``ring._wait``: the time the ring spent waiting for that helper (kind ``"wait"``): the part of
  the transfer that computing did not hide;
* ``ring.RingAttention.forward`` and ``backward``: only to know which pass the others belong to.

The events are :class:`distlab.tools.trace.Event` s, drawn by :func:`distlab.tools.trace.gantt`
as chapter 6's pipelines are; :func:`hidden_fraction` sums how much of the transfer time ran
under compute. Times come from ``time.perf_counter``, one clock for all ranks of a machine.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from distlab.context_parallel import blockwise, ring
from distlab.tools.trace import Tracer, overlap_seconds


class _Transfer:
    """Requests being waited on by a helper thread; ``done`` is set when all have completed."""

    def __init__(self, requests: list, tracer: Tracer, name: str):
        self.done = threading.Event()
        self.error: BaseException | None = None
        start = tracer.clock()

        def watch():
            try:
                for request in requests:
                    request.wait()
                tracer.add(name, start, tracer.clock(), lane="ring", kind="comm")
            except BaseException as e:           # handed to the ring's thread by _wait
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=watch, daemon=True, name=f"distlab-ring-{name}").start()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error


@contextmanager
def traced(tracer: Tracer | None = None):
    """Record the ring's compute, transfers and waits on this rank meanwhile; yields the :class:`Tracer`."""
    tracer = Tracer() if tracer is None else tracer
    originals = {(blockwise, name): getattr(blockwise, name) for name in ("block_attention", "merge", "block_backward")}
    originals.update({(ring, name): getattr(ring, name) for name in ("_post_exchange", "_wait")})
    passes = {name: getattr(ring.RingAttention, name) for name in ("forward", "backward")}
    phase = {"kind": "forward"}

    def in_phase(name, original):
        def run(*args, **kwargs):
            phase["kind"] = name
            return original(*args, **kwargs)
        return staticmethod(run)

    def computing(name, original):
        def timed(*args, **kwargs):
            start = tracer.clock()
            try:
                return original(*args, **kwargs)
            finally:
                tracer.add(name, start, tracer.clock(), lane="compute", kind=phase["kind"])
        return timed

    def post_exchange(send, receive, group, tag):
        requests = originals[(ring, "_post_exchange")](send, receive, group, tag)
        what = "key/value block" if tag == ring.KV_TAG else "gradient accumulator"
        return _Transfer(requests, tracer, f"{phase['kind']}: {what}")

    def wait(requests):
        start = tracer.clock()
        for request in requests if isinstance(requests, list) else [requests]:
            request.wait()
        tracer.add("wait", start, tracer.clock(), lane="compute", kind="wait")

    for (module, name), original in originals.items():
        if module is blockwise:
            setattr(module, name, computing(name, original))
    ring._post_exchange, ring._wait = post_exchange, wait
    for name, original in passes.items():
        setattr(ring.RingAttention, name, in_phase(name, original))
    try:
        yield tracer
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)
        for name, original in passes.items():
            setattr(ring.RingAttention, name, staticmethod(original))


def hidden_fraction(events) -> float:
    """Of all the time transfers were on the wire (summed over ranks), the fraction during which the rank computed."""
    wire = sum(e.duration for e in _kind(events, "comm"))
    if wire == 0:
        return 1.0
    under = overlap_seconds(events, "comm", "forward") + overlap_seconds(events, "comm", "backward")
    return min(1.0, under / wire)


def _kind(events, kind):
    from distlab.tools.trace import _flatten

    return [e for e in _flatten(events) if e.kind == kind]
