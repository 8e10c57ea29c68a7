"""distlab.tools.comm: every call is recorded with the bytes the documented model says."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distlab


def every_collective():
    """Run each op once on 64 float32 (256 bytes) per rank and return the log."""
    from distlab.tools import comm

    n, r = dist.get_world_size(), dist.get_rank()
    chunk = torch.ones(16)  # 64 bytes
    with comm.record() as log:
        dist.broadcast(torch.ones(64), src=0)
        dist.all_reduce(torch.ones(64))
        dist.reduce(torch.ones(64), dst=0)
        dist.all_gather([torch.empty(16) for _ in range(n)], chunk)
        dist.all_gather_into_tensor(torch.empty(16 * n), chunk)
        dist.reduce_scatter_tensor(torch.empty(16), torch.ones(16 * n))
        dist.all_to_all_single(torch.empty(16 * n), torch.ones(16 * n))
        dist.gather(chunk, [torch.empty(16) for _ in range(n)] if r == 0 else None, dst=0)
        dist.scatter(torch.empty(16), [torch.ones(16) for _ in range(n)] if r == 0 else None, src=0)
        dist.barrier()
        work = dist.all_reduce(torch.ones(64), async_op=True)
        work.wait()
        dist.broadcast_object_list(["x" * 100], src=0)  # calls broadcast inside: logged once
    return log


@pytest.mark.parametrize("n", [2, 4])
def test_bytes_per_op_follow_the_documented_model(n):
    logs = distlab.run(every_collective, nprocs=n)
    S, C = 256, 64  # bytes of the 64-float tensors and of a 16-float chunk
    for rank, log in enumerate(logs):
        ops = [c.op for c in log]
        assert ops == ["broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
                       "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier",
                       "all_reduce", "broadcast_object_list"]
        got = {(i, c.op): (c.sent, c.received) for i, c in enumerate(log)}
        root = rank == 0
        expected = {
            (0, "broadcast"): (S, 0) if root else (0, S),
            (1, "all_reduce"): (2 * (n - 1) * S // n,) * 2,
            (2, "reduce"): (0, S) if root else (S, 0),
            (3, "all_gather"): ((n - 1) * C,) * 2,
            (4, "all_gather_into_tensor"): ((n - 1) * C,) * 2,
            (5, "reduce_scatter_tensor"): ((n - 1) * C,) * 2,
            (6, "all_to_all_single"): ((n - 1) * C,) * 2,
            (7, "gather"): (0, (n - 1) * C) if root else (C, 0),
            (8, "scatter"): ((n - 1) * C, 0) if root else (0, C),
            (9, "barrier"): (0, 0),
            (10, "all_reduce"): (2 * (n - 1) * S // n,) * 2,
        }
        for key, value in expected.items():
            assert got[key] == value, (rank, key)
        obj_sent, obj_received = got[(11, "broadcast_object_list")]
        assert (obj_sent > 100 and obj_received == 0) if root else (obj_sent == 0 and obj_received > 100)
        assert all(c.group_size == n for c in log)
        assert log[10].async_op and log[10].duration is not None and log[10].duration >= 0
        assert log[1].shape == (64,) and log[1].dtype == "float32"
        assert log.counts()["all_reduce"] == 2
        assert log.bytes_sent("all_reduce") == 2 * (2 * (n - 1) * S // n)


def point_to_point():
    from distlab.tools import comm

    r = dist.get_rank()
    with comm.record() as log:
        if r == 0:
            dist.send(torch.ones(10), dst=1)
            dist.recv(torch.empty(3, dtype=torch.float64), src=1)
        else:
            dist.recv(torch.empty(10), src=0)
            dist.send(torch.ones(3, dtype=torch.float64), dst=0)
        peer = 1 - r
        ops = [dist.P2POp(dist.isend, torch.ones(5), peer), dist.P2POp(dist.irecv, torch.empty(5), peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        group = dist.new_group([0, 1])
        dist.broadcast(torch.ones(4), src=1, group=group)
    return log


def test_point_to_point_is_counted_exactly_with_peers():
    logs = distlab.run(point_to_point, nprocs=2)
    send0, recv0 = logs[0][0], logs[0][1]
    assert (send0.op, send0.sent, send0.received, send0.peer) == ("send", 40, 0, 1)
    assert (recv0.op, recv0.sent, recv0.received, recv0.peer) == ("recv", 0, 24, 1)
    assert recv0.describe() == "recv(float64[3], from rank 1, group of 2)"
    assert logs[1][0].describe() == "recv(float32[10], from rank 0, group of 2)"
    for log in logs:
        batch = [c for c in log if c.op == "batch_isend_irecv"]
        assert len(batch) == 1 and (batch[0].sent, batch[0].received) == (20, 20)
        assert not any(c.op in ("isend", "irecv") for c in log), "inner calls must not be logged twice"
        bcast = log[-1]
        assert bcast.op == "broadcast" and bcast.peer == 1
    assert (logs[1][-1].sent, logs[1][-1].received) == (16, 0)  # rank 1 is the root
    assert (logs[0][-1].sent, logs[0][-1].received) == (0, 16)


def test_summary_is_readable():
    log = distlab.run(every_collective, nprocs=2)[0]
    text = log.summary()
    assert "all_reduce" in text and "2" in text.splitlines()[2]


def nested_records():
    from distlab.tools import comm

    with comm.record() as outer:
        with comm.record() as inner:
            dist.all_reduce(torch.ones(4))
        dist.barrier()
        with comm.record() as second:  # equal to `inner` by content until it records
            pass
    return [c.op for c in outer], [c.op for c in inner], len(second)


def test_nested_recorders_each_see_their_own_calls():
    outer, inner, second = distlab.run(nested_records, nprocs=2)[0]
    assert outer == ["all_reduce", "barrier"] and inner == ["all_reduce"] and second == 0
