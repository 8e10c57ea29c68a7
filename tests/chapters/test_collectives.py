"""The from-scratch all-reduces agree with torch's and move the bytes the theory says."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.collectives import all_reduce, cost_model, faster_ring


def compare_with_builtin(numel, algorithm):
    from distlab.tools import comm

    g = torch.Generator().manual_seed(dist.get_rank())
    mine = torch.randn(numel, generator=g)
    reference = mine.clone()
    dist.all_reduce(reference)
    with comm.record() as log:
        getattr(all_reduce, f"{algorithm}_all_reduce")(mine)
    return mine, reference, log



@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive"])
@pytest.mark.parametrize("numel", [1, 7, 1000])  # fewer elements than ranks, uneven chunks, even
def test_from_scratch_all_reduce_matches_torch(pools, n, algorithm, numel):
    for mine, reference, log in distlab.run(compare_with_builtin, numel, algorithm, nprocs=n):
        # float32 sums of n terms in another order: each differs from the exact sum by at most
        # (n-1)·eps·sum|x| ≈ 3 · 1.2e-7 · 4 for standard normal inputs; 1e-5 absolute is ample.
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-5)
        assert "all_reduce" not in log.counts(), "the from-scratch version called the built-in"


def ring_bytes(numel):
    from distlab.tools import comm

    t = torch.ones(numel)
    with comm.record() as log:
        all_reduce.ring_all_reduce(t)
    return log.bytes_sent(), log.bytes_received(), t[0].item()


@pytest.mark.parametrize("n", [2, 4])
def test_ring_sends_exactly_2_n_minus_1_over_n_of_the_tensor(pools, n):
    numel = 1024  # divisible by n: every chunk is numel/n elements
    size = numel * 4
    for sent, received, value in distlab.run(ring_bytes, numel, nprocs=n):
        assert value == n
        assert sent == received == 2 * (n - 1) * size // n


def faster_ring_against_builtin(shape, segments):
    from distlab.tools import comm

    g = torch.Generator().manual_seed(dist.get_rank())
    mine = torch.randn(shape, generator=g).t()          # transposed: not contiguous when 2-D
    reference = mine.clone()
    dist.all_reduce(reference)
    with comm.record() as log:
        faster_ring.faster_ring_all_reduce(mine, segments=segments)
    scratch = faster_ring._SCRATCH[(torch.float32, torch.device("cpu"))].data_ptr()
    faster_ring.faster_ring_all_reduce(torch.ones(shape), segments=segments)
    kept = faster_ring._SCRATCH[(torch.float32, torch.device("cpu"))].data_ptr() == scratch
    return mine, reference, log.counts(), log.bytes_sent(), log.bytes_received(), kept


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("shape", [(1,), (7,), (1024,), (16, 10)])  # tiny, uneven, even, not contiguous
def test_faster_ring_matches_torch_and_sends_what_the_simple_ring_sends(pools, n, segments, shape):
    numel = torch.Size(shape).numel()
    for mine, reference, counts, sent, received, kept in distlab.run(
            faster_ring_against_builtin, shape, segments, nprocs=n):
        # the same float32 tolerance as the simple ring (above): the sums are the same, in ring order
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-5)
        assert "all_reduce" not in counts, "the from-scratch version called the built-in"
        if numel % n == 0:                              # even chunks: the simple ring's exact bytes
            assert sent == received == 2 * (n - 1) * numel * 4 // n
        assert kept, "the scratch buffer was allocated again on the second call of the same size"


def test_faster_ring_refuses_zero_segments(pools):
    def zero_segments():
        faster_ring.faster_ring_all_reduce(torch.ones(4), segments=0)

    with pytest.raises(distlab.RankError, match="segments must be at least 1"):
        distlab.run(zero_segments, nprocs=2)


def state_per_step():
    steps = []
    t = torch.full((4,), float(dist.get_rank() + 1))
    all_reduce.ring_all_reduce(t, on_step=lambda phase, step, chunks: steps.append(
        (phase, step, torch.cat([c.clone() for c in chunks]))))
    return steps


def test_on_step_shows_every_intermediate_state(pools):
    per_rank = distlab.run(state_per_step, nprocs=4)
    for rank, steps in enumerate(per_rank):
        assert [(p, s) for p, s, _ in steps] == [("reduce-scatter", s) for s in range(3)] + \
            [("all-gather", s) for s in range(3)]
        # After the reduce-scatter rank r owns the full sum (1+2+3+4) of chunk r+1 only.
        after_rs = steps[2][2]
        owned = (rank + 1) % 4
        assert after_rs[owned].item() == 10.0
        assert sum(after_rs[i].item() == 10.0 for i in range(4)) == 1
        assert torch.equal(steps[-1][2], torch.full((4,), 10.0))


def test_cost_model_and_fit():
    alpha, beta = 5e-6, 1e-9
    assert cost_model.predicted_time("ring", 4, 1e6, alpha, beta) == pytest.approx(6 * alpha + 1.5e6 * beta)
    assert cost_model.predicted_time("tree", 4, 1e6, alpha, beta) == pytest.approx(4 * (alpha + 1e6 * beta))
    assert cost_model.predicted_time("naive", 4, 1e6, alpha, beta) == pytest.approx(6 * (alpha + 1e6 * beta))
    # For large messages the ring wins, for tiny ones the tree (fewer latency terms).
    assert cost_model.predicted_time("ring", 64, 1e9, alpha, beta) < cost_model.predicted_time("tree", 64, 1e9, alpha, beta)
    assert cost_model.predicted_time("tree", 64, 8, alpha, beta) < cost_model.predicted_time("ring", 64, 8, alpha, beta)
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        times = [cost_model.ring_time(op, 4, s, alpha, beta) for s in sizes]
        assert cost_model.fit_alpha_beta(op, 4, sizes, times) == pytest.approx((alpha, beta), rel=1e-6)
    assert cost_model.ring_time("all_gather", 4, 1e6, alpha, beta) == pytest.approx(3 * alpha + 0.75e6 * beta)
    assert cost_model.bus_bandwidth("all_reduce", 4, 1e9, 1.0) == pytest.approx(1.5e9)
    with pytest.raises(ValueError):
        cost_model.predicted_time("star", 4, 1, 1, 1)
