"""The relay (distlab.relay): ranks whose every message goes through a router that records it.

The router's record of a correct ring is exactly the ring's schedule; results on the relay are
those of gloo and of one process; collectives are performed once, centrally, and recorded under
comm_bytes' rules; and a rank can neither sign a message with another rank's number nor reach
another rank's descriptor or a store shared with the others.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.relay import record
from distlab.tools.comm_bytes import all_reduce_bytes


@pytest.fixture(scope="module")
def relay_pools():
    """Warm relay ranks of 2 and 4 for this file (each pool has its own router in this process),
    and warm gloo ranks to compare with."""
    with distlab.Pool(2, backend="relay"), distlab.Pool(4, backend="relay"), distlab.Pool(2), distlab.Pool(4):
        yield


def book_ring_all_reduce(tensor):
    """Chapter 2's ring: reduce-scatter then all-gather, with batch_isend_irecv, N-1 steps each."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = [c.clone() for c in torch.tensor_split(tensor, n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_index, recv_index = (r - step - 1) % n, (r - step - 2) % n
        incoming = torch.empty_like(chunks[recv_index])
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[send_index], right),
                                            dist.P2POp(dist.irecv, incoming, left)]):
            work.wait()
        chunks[recv_index] += incoming
    for step in range(n - 1):
        send_index, recv_index = (r - step) % n, (r - step - 1) % n
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[send_index], right),
                                            dist.P2POp(dist.irecv, chunks[recv_index], left)]):
            work.wait()
    return torch.cat(chunks)


def ring_on_rank(numel, seed):
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    mine = torch.randn(numel, generator=g)
    return book_ring_all_reduce(mine), dist.get_backend()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("numel", [1000, 7])   # even chunks, then uneven ones (7 on 4 ranks: 2, 2, 2, 1)
def test_the_record_of_a_ring_is_the_ring_schedule_and_its_sums_are_glooʼs(relay_pools, n, numel):
    with record.capture() as seen:
        relayed = distlab.run(ring_on_rank, numel, 5, nprocs=n, backend="relay")
    assert record.by_sender(seen.messages()) == record.by_sender(record.ring_schedule(numel, 4, n))
    assert seen.collectives() == []
    assert {backend for _, backend in relayed} == {"relay"}
    # The same additions in the same order on gloo: bitwise the same sums (tolerance 0).
    on_gloo = distlab.run(ring_on_rank, numel, 5, nprocs=n)
    inputs = [torch.randn(numel, generator=torch.Generator().manual_seed(5 + r)) for r in range(n)]
    exact = sum(x.double() for x in inputs)
    for (mine, _), (theirs, backend) in zip(relayed, on_gloo):
        assert backend == "gloo"
        assert torch.equal(mine, theirs)
        # Against one process's float64 sum: float32 rounding of n terms of |x| < ~4.5 is below
        # (n-1) * 6e-8 * n * 4.5 ≈ 5e-6; 1e-5 leaves a margin and catches any wrong or missing chunk.
        torch.testing.assert_close(mine.double(), exact, rtol=0, atol=1e-5)
    record.check_ring(seen, n, [(numel, 4, 2)])


def collectives_on_rank(seed):
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed + r)
    x = torch.randn(12, generator=g)
    out = {}
    out["all_reduce"] = x.clone()
    dist.all_reduce(out["all_reduce"])
    out["max"] = x.clone()
    dist.all_reduce(out["max"], op=dist.ReduceOp.MAX)
    gathered = torch.empty(n * 12)
    dist.all_gather_into_tensor(gathered, x)
    out["all_gather"] = gathered
    scattered = torch.empty(12 // n * 1)
    dist.reduce_scatter_tensor(scattered, x[: 12 // n * n])
    out["reduce_scatter"] = scattered
    exchanged = torch.empty(12)
    dist.all_to_all_single(exchanged, x)
    out["all_to_all"] = exchanged
    sent = x.clone()
    dist.broadcast(sent, src=n - 1)
    out["broadcast"] = sent
    dist.barrier()
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_are_performed_by_the_router_and_recorded_once_each(relay_pools, n):
    with record.capture() as seen:
        results = distlab.run(collectives_on_rank, 3, nprocs=n, backend="relay")
    xs = [torch.randn(12, generator=torch.Generator().manual_seed(3 + r)) for r in range(n)]
    total = sum(x.double() for x in xs).float()
    piece = 12 // n
    for r, out in enumerate(results):
        # A sum of n float32 terms in another order than float64's: within n * 6e-8 * max|sum of terms|.
        torch.testing.assert_close(out["all_reduce"], total, rtol=0, atol=1e-5)
        assert torch.equal(out["max"], torch.stack(xs).max(0).values)                 # no rounding in a max
        assert torch.equal(out["all_gather"], torch.cat(xs))                          # copies: exact
        torch.testing.assert_close(out["reduce_scatter"], total[r * piece:(r + 1) * piece], rtol=0, atol=1e-5)
        assert torch.equal(out["all_to_all"], torch.cat([x[r * piece:(r + 1) * piece] for x in xs]))
        assert torch.equal(out["broadcast"], xs[n - 1])
    ops = [c.op for c in seen.collectives()]
    assert ops == ["all_reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier"]
    assert seen.messages() == []
    first = seen.collectives()[0]
    assert first.ranks == tuple(range(n))
    assert first.sent == (all_reduce_bytes(48, n),) * n        # comm_bytes' rule: 2(N-1)/N * S
    gather = seen.collectives()[2]
    assert gather.sent == ((n - 1) * 48,) * n                    # (N-1) * S, S = the input
    assert seen.sent_by(0) == sum(c.sent[0] for c in seen.collectives())


def forge_and_look():
    """What a rank can do with the relay besides using it: all of it should fail or be harmless."""
    import os

    from distlab.relay import backend, frames

    r = dist.get_rank()
    link = backend.link()
    if r == 1:   # a frame claiming to come from rank 0: the router names the sender itself
        frames.write(link.sock, {"k": "send", "dst": 0, "tag": 7, "src": 0, "parts": [["float32", [2]]]},
                     frames.encode([torch.ones(2)])[1])
    got = None
    if r == 0:
        got = torch.empty(2)
        dist.recv(got, src=1, tag=7)
    sockets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                sockets.append(int(fd))
        except OSError:
            pass
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return got, sockets, int(os.environ[backend.RELAY_FD]), type(store).__name__, os.environ.get("MASTER_PORT")


def test_a_rank_cannot_sign_for_another_and_holds_only_its_own_end(relay_pools):
    with record.capture() as seen:
        results = distlab.run(forge_and_look, nprocs=2, backend="relay")
    assert [(m.src, m.dst, m.tag) for m in seen.messages()] == [(1, 0, 7)]
    assert torch.equal(results[0][0], torch.ones(2))   # delivered as from rank 1, where it came from
    for _, sockets, own, store, port in results:
        assert sockets == [own], "a rank holds another rank's end of the relay"
        assert store == "HashStore"    # a dictionary in this process: nothing shared between ranks
        assert port in ("0", None)     # the agent started no store for the ranks to share


def test_relay_runs_only_where_the_launcher_can_hand_out_descriptors():
    with pytest.raises(ValueError, match="relay"):
        distlab.run(lambda: 0, nprocs=2, backend="relay", launcher="local")


def send_to_each_other(numel):
    """Both ranks first send to the other, then receive: gloo's send waits for its receiver, so
    this deadlocks there; it must deadlock on the relay too (chapter 6's 1F1B with blocking sends)."""
    other = 1 - dist.get_rank()
    dist.send(torch.ones(numel), dst=other)
    got = torch.empty(numel)
    dist.recv(got, src=other)
    return got


def test_a_send_waits_for_its_receiver_as_on_gloo(relay_pools):
    from distlab import DistTimeout

    for backend in ("relay", None):
        with pytest.raises(DistTimeout, match=r"rank 0: blocked in send\(float32\[3\], to rank 1"):
            distlab.run(send_to_each_other, 3, nprocs=2, backend=backend, timeout=6)


def isend_waits_then_shapes():
    """Rank 0's isend completes only after rank 1 posted its receive (1 s later); an empty tensor
    of shape (0, 12345) arrives without its shape."""
    import time

    r = dist.get_rank()
    if r == 0:
        start = time.monotonic()
        work = dist.isend(torch.arange(6.0).reshape(2, 3), dst=1)
        early = work.is_completed()
        work.wait()
        dist.send(torch.empty(0, 12345), dst=1, tag=3)
        return early, time.monotonic() - start
    time.sleep(1.0)
    got = torch.empty(3, 2)
    dist.recv(got, src=0)
    from distlab.relay import link as relay_link

    peeked = []
    original = relay_link.Work.complete

    def peek(work, parts, payload):
        peeked.append(parts)
        return original(work, parts, payload)
    relay_link.Work.complete = peek
    try:
        dist.recv(torch.empty(0), src=0, tag=3)
    finally:
        relay_link.Work.complete = original
    return got, peeked


def test_an_isend_completes_when_its_receive_is_posted_and_shapes_do_not_travel(relay_pools):
    with record.capture() as seen:
        (early, waited), (got, peeked) = distlab.run(isend_waits_then_shapes, nprocs=2, backend="relay")
    assert not early and waited >= 0.9, (early, waited)
    assert torch.equal(got, torch.arange(6.0).reshape(3, 2))   # the bytes, in the receiver's shape
    assert peeked == [[["float32", [0]]]]                       # not (0, 12345): a shape carries no data
    assert [(m.src, m.dst, m.nbytes) for m in seen.messages()] == [(0, 1, 24), (0, 1, 0)]
