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


def on_relay_and_on_gloo(rank_function, seed: int, n: int):
    """``rank_function(seed)`` on ``n`` ranks twice: on the relay (the router's record kept) and
    on gloo, the reference; ``(record, relay's results, gloo's results)``."""
    with record.capture() as seen:
        relayed = distlab.run(rank_function, seed, nprocs=n, backend="relay")
    return seen, relayed, distlab.run(rank_function, seed, nprocs=n)


def ranks_inputs_and_sum(seed: int, n: int):
    """Each rank's 12 numbers as this file's rank functions draw them (seed + rank), and their sum,
    taken in float64 and rounded once: the reference a float32 reduction is held to."""
    xs = [torch.randn(12, generator=torch.Generator().manual_seed(seed + r)) for r in range(n)]
    return xs, sum(x.double() for x in xs).float()


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_are_performed_by_the_router_and_recorded_once_each(relay_pools, n):
    with record.capture() as seen:
        results = distlab.run(collectives_on_rank, 3, nprocs=n, backend="relay")
    xs, total = ranks_inputs_and_sum(3, n)
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


def functional_collectives_on_rank(seed):
    """torch's functional collectives (what DTensor and fully_shard call): C++ resolves the group by
    its name and calls it; wait_tensor waits on the Work the relay returned."""
    import torch.distributed._functional_collectives as funcol

    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(12, generator=torch.Generator().manual_seed(seed + r))
    world = dist.group.WORLD
    out = {"all_reduce": funcol.all_reduce(x, "sum", world),
           "all_gather": funcol.all_gather_tensor(x, 0, world),
           "reduce_scatter": funcol.reduce_scatter_tensor(x, "sum", 0, world),
           "all_to_all": funcol.all_to_all_single(x, None, None, world),
           "broadcast": funcol.broadcast(x, n - 1, world)}
    out["coalesced"] = funcol.all_gather_into_tensor_coalesced([x, x[:n]], world)
    return {k: [t.clone() for t in v] if isinstance(v, list) else torch.as_tensor(v).clone() for k, v in out.items()}


@pytest.mark.parametrize("n", [2, 4])
def test_functional_collectives_go_through_the_router_and_agree_with_gloo(relay_pools, n):
    seen, relayed, on_gloo = on_relay_and_on_gloo(functional_collectives_on_rank, 8, n)
    xs, total = ranks_inputs_and_sum(8, n)
    piece = 12 // n
    for r, (mine, theirs) in enumerate(zip(relayed, on_gloo)):
        # Sums of n float32 terms, in the router's order and in gloo's: within n * 6e-8 * max|x| of
        # each other and of float64's sum; 1e-5 is that with a margin (|x| < ~4.5).
        torch.testing.assert_close(mine["all_reduce"], theirs["all_reduce"], rtol=0, atol=1e-5)
        torch.testing.assert_close(mine["all_reduce"], total, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine["reduce_scatter"], total[r * piece:(r + 1) * piece], rtol=0, atol=1e-5)
        for exact in ("all_gather", "all_to_all", "broadcast"):   # copies: bitwise equal
            assert torch.equal(mine[exact], theirs[exact]), exact
        assert torch.equal(mine["all_gather"], torch.cat(xs))
        assert [torch.equal(a, b) for a, b in zip(mine["coalesced"], theirs["coalesced"])] == [True, True]
    ops = [(c.op, c.sizes[0]) for c in seen.collectives()]   # rank 0's parts (no root of the broadcast)
    assert ops == [("all_reduce", 48), ("all_gather", 48), ("reduce_scatter", 48), ("all_to_all", 48),
                   ("broadcast", 0), ("all_gather", 48), ("all_gather", 4 * n)]
    assert seen.messages() == []
    assert seen.collectives()[2].sent == ((n - 1) * 48 // n,) * n    # reduce_scatter: (N-1) * S, S = output
    assert seen.collectives()[4].sent == tuple(48 if r == n - 1 else 0 for r in range(n))   # broadcast: the source


def functional_variants_on_rank(seed):
    """The functional collectives' in-place and ``_out`` variants (what torch.compile's passes
    emit): each writes into a tensor the rank gives it."""
    import torch.distributed._functional_collectives  # noqa: F401 - registers the ops' Python parts

    ops, name = torch.ops._c10d_functional, dist.group.WORLD.group_name
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(12, generator=torch.Generator().manual_seed(seed + r))
    out = {"all_gather_out": torch.empty(12 * n), "reduce_scatter_out": torch.empty(12 // n),
           "all_reduce_": x.clone(), "broadcast_": x.clone(), "all_reduce_coalesced_": [x.clone(), 2 * x]}
    ops.wait_tensor(ops.all_gather_into_tensor_out(x, n, name, out=out["all_gather_out"]))
    ops.wait_tensor(ops.reduce_scatter_tensor_out(x, "sum", n, name, out=out["reduce_scatter_out"]))
    ops.wait_tensor(ops.all_reduce_(out["all_reduce_"], "sum", name))
    ops.wait_tensor(ops.broadcast_(out["broadcast_"], n - 1, name))
    for t in ops.all_reduce_coalesced_(out["all_reduce_coalesced_"], "sum", name):
        ops.wait_tensor(t)
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_the_functional_out_and_in_place_variants_go_through_the_router_too(relay_pools, n):
    seen, relayed, on_gloo = on_relay_and_on_gloo(functional_variants_on_rank, 9, n)
    xs, total = ranks_inputs_and_sum(9, n)
    for r, (mine, theirs) in enumerate(zip(relayed, on_gloo)):
        assert torch.equal(mine["all_gather_out"], torch.cat(xs))            # copies: exact
        assert torch.equal(mine["broadcast_"], xs[n - 1])
        # Sums of n float32 terms in the router's order: within n * 6e-8 * max|x| (< 4.5) of float64's.
        piece = 12 // n
        torch.testing.assert_close(mine["reduce_scatter_out"], total[r * piece:(r + 1) * piece], rtol=0, atol=1e-5)
        torch.testing.assert_close(mine["all_reduce_"], total, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine["all_reduce_"], theirs["all_reduce_"], rtol=0, atol=1e-5)
        torch.testing.assert_close(mine["all_reduce_coalesced_"][1], 2 * total, rtol=0, atol=2e-5)
    ops = [(c.op, c.sizes[0]) for c in seen.collectives()]
    assert ops == [("all_gather", 48), ("reduce_scatter", 48), ("all_reduce", 48), ("broadcast", 0),
                   ("all_reduce", 96)]
    assert seen.collectives()[0].sent == ((n - 1) * 48,) * n       # comm_bytes: (N-1) * S, S = the input
    assert seen.collectives()[4].sent == (all_reduce_bytes(96, n),) * n


def dtensor_and_subgroups_on_rank():
    """A 2 x 2 device mesh (chapter 7's kind), a DTensor redistributed on one of its dimensions, a
    fully_shard'ed layer trained one step, and a group of two made with new_group: all on a
    process group whose store is this process's alone, in a rank that needs no network."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    r = dist.get_rank()
    pair = dist.new_group([0, 1])
    x = torch.full((3,), float(r))
    if r in (0, 1):
        dist.all_reduce(x, group=pair)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    w = torch.arange(16.).reshape(4, 4)
    rows = distribute_tensor(w, mesh["tp"], [Shard(0)])
    whole = rows.redistribute(mesh["tp"], [Replicate()]).to_local()
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    fully_shard(layer, mesh=mesh["dp"])
    torch.manual_seed(1 + mesh.get_local_rank("dp"))
    layer(torch.randn(2, 4)).sum().backward()
    grad = layer.weight.grad.full_tensor()
    return x, whole, grad


def test_subgroups_device_meshes_dtensor_and_fully_shard_work_on_the_relay(relay_pools):
    with record.capture() as seen:
        relayed = distlab.run(dtensor_and_subgroups_on_rank, nprocs=4, backend="relay")
    on_gloo = distlab.run(dtensor_and_subgroups_on_rank, nprocs=4)
    w = torch.arange(16.).reshape(4, 4)
    for r, ((x, whole, grad), (_, _, gloo_grad)) in enumerate(zip(relayed, on_gloo)):
        assert torch.equal(x, torch.full((3,), 1.0 if r < 2 else float(r)))
        assert torch.equal(whole, w)
        # An average of 2 float32 gradients in another order: within 2 * 6e-8 * |g| (|g| < 10).
        torch.testing.assert_close(grad, gloo_grad, rtol=0, atol=1e-5)
    groups = {c.ranks for c in seen.collectives()}
    assert (0, 1) in groups and (2, 3) in groups     # the pair, then the mesh's rows and columns
    assert (0, 2) in groups and (1, 3) in groups
    assert {"all_gather", "reduce_scatter"} <= {c.op for c in seen.collectives() if c.ranks in ((0, 2), (1, 3))}


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
