"""distlab.tools.trace: spans, async events that end when the work completes, overlap, the Gantt chart."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch.distributed as dist  # noqa: E402

import distlab  # noqa: E402
from distlab import models  # noqa: E402
from distlab.data_parallel import overlap
from distlab.tools.trace import Event, Tracer, gantt, lanes_of, overlap_seconds  # noqa: E402


def test_spans_and_overlap_arithmetic():
    ticks = iter([0.0, 1.0, 0.5, 2.0])
    tracer = Tracer(rank=3, clock=lambda: next(ticks))
    with tracer.span("backward", kind="backward"):
        pass
    with tracer.span("bucket 0", lane="comm", kind="comm"):
        pass
    assert [(e.rank, e.lane, e.start, e.end) for e in tracer.events] == [(3, "compute", 0.0, 1.0), (3, "comm", 0.5, 2.0)]
    assert overlap_seconds(tracer.events, "backward", "comm") == pytest.approx(0.5)
    other = [Event(0, "comm", "x", "comm", 5.0, 6.0)]  # another rank: never overlaps rank 3's backward
    assert overlap_seconds([tracer.events, other], "backward", "comm") == pytest.approx(0.5)


def test_gantt_rows_per_rank_and_lane():
    events = [[Event(0, "compute", "F0", "forward", 0, 1), Event(0, "comm", "c", "comm", 0.5, 1.5)],
              [Event(1, "stage 1", "F0", "forward", 1, 2), Event(1, "stage 1", "B0", "backward", 2, 4)]]
    assert lanes_of(events) == [(0, "compute"), (0, "comm"), (1, "stage 1")]
    ax = gantt(events, labels=True)
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 compute", "rank 0 comm", "rank 1 stage 1"]
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths == [1000.0, 1000.0, 1000.0, 2000.0]  # milliseconds
    assert ax.get_legend()._loc == 1 and ax.get_legend()._ncols == 3  # upper right, one row
    beside = gantt(events, legend="beside")  # anchored by its upper left corner at the axes' right edge
    assert beside.get_legend()._loc == 2
    assert beside.get_legend().get_bbox_to_anchor().x0 == pytest.approx(beside.bbox.x1)
    with pytest.raises(ValueError, match="legend must be"):
        gantt(events, legend="below")


def traced_overlapped_step():
    tracer = Tracer()
    model = models.build("gpt", seed=0, dim=128, layers=4)
    wrapper = overlap.OverlappedDDP(model, bucket_mb=0.1, tracer=tracer)
    shard = models.shard(models.example_batch("gpt", 8, dim=128, layers=4), dist.get_rank(), dist.get_world_size())
    for _ in range(2):
        with tracer.span("forward", kind="forward"):
            loss = models.loss_fn(wrapper, shard)
        with tracer.span("backward", kind="backward"):
            loss.backward()
        with tracer.span("wait", kind="wait"):
            wrapper.finish()
    return tracer.events, len(wrapper.buckets)


def test_overlapped_ddp_traces_one_comm_event_per_bucket_starting_inside_backward():
    with distlab.Pool(2):
        results = distlab.run(traced_overlapped_step, nprocs=2)
    for events, buckets in results:
        comm = [e for e in events if e.kind == "comm"]
        backward = [e for e in events if e.kind == "backward"]
        assert len(comm) == 2 * buckets > 2
        assert all(c.end >= c.start for c in comm)
        # the first bucket's all-reduce is launched while backward is still running
        first = min(comm, key=lambda e: e.start)
        assert backward[0].start < first.start < backward[0].end
    assert overlap_seconds([r[0] for r in results], "backward", "comm") > 0
