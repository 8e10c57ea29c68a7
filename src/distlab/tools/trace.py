"""Per-rank timelines: what each rank was doing when, and a Gantt chart of it.

Inside a rank, note spans of work as they happen::

    tracer = Tracer()
    with tracer.span("forward", lane="compute"):
        loss = model(x)
    work = dist.all_reduce(flat, async_op=True)
    tracer.async_event(work, "all-reduce", start, lane="comm")   # ends when the work completes
    return tracer.events                                           # plain data: travels home

then, in the notebook, draw every rank's events in one figure::

    gantt(distlab.run(step, nprocs=4))      # one list of events per rank

An :class:`Event` is a rank, a *lane* (a row within the rank: "compute" and "comm" for data
parallelism; a pipeline stage for pipeline schedules), a name, a *kind* (which sets the
colour: "forward", "backward", "comm", ...), and start and end times in seconds.

Clocks: times come from :func:`time.perf_counter`, which on Linux reads the system-wide
monotonic clock, so ranks on one machine share a time axis. Ranks on different nodes do not;
there, compare durations, or align the ranks at a barrier first (:meth:`Tracer.align`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

COLOURS = {
    "forward": "tab:blue", "backward": "tab:orange", "comm": "tab:green", "wait": "tab:red",
    "step": "tab:purple", "idle": "0.85", "other": "tab:gray",
}


@dataclass
class Event:
    """One span of work on one rank."""

    rank: int
    lane: str
    name: str
    kind: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict:
        return asdict(self)


class Tracer:
    """Collects :class:`Event` s on one rank. ``rank`` defaults to this process's rank (or 0)."""

    def __init__(self, rank: int | None = None, clock=time.perf_counter):
        if rank is None:
            rank = _current_rank()
        self.rank = rank
        self.clock = clock
        self.offset = 0.0      # subtracted from every time (see align)
        self.events: list[Event] = []

    def add(self, name: str, start: float, end: float, lane: str = "compute", kind: str | None = None) -> Event:
        """Record a span that has already happened (times from ``self.clock``)."""
        event = Event(self.rank, lane, name, kind or name, start - self.offset, end - self.offset)
        self.events.append(event)
        return event

    @contextmanager
    def span(self, name: str, lane: str = "compute", kind: str | None = None):
        """Record the time spent inside the ``with`` block."""
        start = self.clock()
        try:
            yield
        finally:
            self.add(name, start, self.clock(), lane, kind)

    def async_event(self, work, name: str, start: float, lane: str = "comm", kind: str = "comm") -> None:
        """Record an asynchronous operation from ``start`` until its ``work`` completes.

        The end time is taken by a callback on the work's future, on whatever thread completes
        it, so it is the completion itself, not the moment somebody waited for it.
        """
        def done(_future):
            self.add(name, start, self.clock(), lane, kind)

        try:
            work.get_future().add_done_callback(done)
        except (AttributeError, RuntimeError):  # a work without a future: end at wait()
            original_wait = work.wait

            def wait(*args, **kwargs):
                result = original_wait(*args, **kwargs)
                done(None)
                return result
            work.wait = wait

    def align(self) -> None:
        """Make time 0 the moment all ranks leave a barrier (for ranks on different machines)."""
        import torch.distributed as dist

        dist.barrier()
        self.offset = self.clock()

    def sorted_events(self) -> list[Event]:
        return sorted(self.events, key=lambda e: e.start)


def _current_rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0
    except ImportError:
        return 0


def _flatten(events) -> list[Event]:
    """Accept one list of events, or one list per rank (as ``distlab.run`` returns them)."""
    flat = []
    for item in events:
        if isinstance(item, Event):
            flat.append(item)
        elif isinstance(item, dict):
            flat.append(Event(**item))
        else:
            flat.extend(_flatten(item))
    return flat


def lanes_of(events) -> list[tuple[int, str]]:
    """The (rank, lane) rows of a chart, rank by rank, lanes in order of first appearance."""
    rows: list[tuple[int, str]] = []
    for event in sorted(_flatten(events), key=lambda e: (e.rank, e.start)):
        if (event.rank, event.lane) not in rows:
            rows.append((event.rank, event.lane))
    order = {}
    for _, lane in rows:
        order.setdefault(lane, len(order))
    return sorted(rows, key=lambda row: (row[0], order[row[1]]))


def overlap_seconds(events, a: str, b: str) -> float:
    """Seconds during which some event of kind ``a`` and some event of kind ``b`` run at once
    on the same rank, summed over ranks (e.g. how much communication hid behind backward)."""
    total = 0.0
    flat = _flatten(events)
    for rank in {e.rank for e in flat}:
        first = _union([(e.start, e.end) for e in flat if e.rank == rank and e.kind == a])
        second = _union([(e.start, e.end) for e in flat if e.rank == rank and e.kind == b])
        for s1, e1 in first:
            for s2, e2 in second:
                total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def _union(spans):
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def gantt(events, ax=None, colours: dict | None = None, labels: bool = False, unit: str = "ms",
          title: str = "", legend: str = "inside"):
    """Draw a Gantt chart: one row per (rank, lane), one bar per event, coloured by kind.

    ``events``: a list of events, or one list per rank. Time 0 is the earliest start.
    ``labels=True`` writes each event's name on its bar (for pipeline schedules with few,
    wide bars). ``legend="beside"`` puts the legend right of the chart, for timelines whose
    bars fill every corner. Returns the matplotlib axes.
    """
    if legend not in ("inside", "beside"):
        raise ValueError(f"legend must be 'inside' or 'beside', got {legend!r}")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    flat = _flatten(events)
    if not flat:
        raise ValueError("no events to draw")
    colours = {**COLOURS, **(colours or {})}
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    t0 = min(e.start for e in flat)
    rows = lanes_of(flat)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    y_of = {row: i for i, row in enumerate(rows)}
    kinds = []
    for event in flat:
        y = y_of[(event.rank, event.lane)]
        colour = colours.get(event.kind, colours["other"])
        ax.barh(y, (event.end - event.start) * scale, left=(event.start - t0) * scale, height=0.7,
                color=colour, edgecolor="white", linewidth=0.5)
        if labels:
            ax.text((event.start - t0 + event.duration / 2) * scale, y, event.name, ha="center", va="center",
                    fontsize=7, color="white", clip_on=True)
        if event.kind not in kinds:
            kinds.append(event.kind)
    ax.set_yticks(range(len(rows)), [f"rank {r} {lane}" for r, lane in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(title, fontsize=10)
    handles = [Patch(color=colours.get(k, colours["other"]), label=k) for k in kinds]
    if legend == "inside":
        ax.legend(handles=handles, fontsize=7, loc="upper right", ncol=len(kinds))
    else:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax
