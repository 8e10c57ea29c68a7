"""distlab.data_parallel against the single-process reference: gradients, trajectories, calls on the wire.

Tolerances: data-parallel gradients differ from the full-batch gradients by float32 rounding
only (measured ~1e-8 absolute on gradients of order 1e-2..1, bitwise equal run to run), so
gradients are compared at ``checks.GRAD_*`` (1e-5 relative to the largest gradient): a
thousand times the rounding, and a thousand times smaller than forgetting to average or
broadcast. Trajectories use SGD, where a gradient difference d moves a parameter by lr*d.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import distlab
from distlab import models
from distlab.data_parallel import buckets as data_parallel_buckets
from distlab.data_parallel import naive, overlap
from distlab.grade import checks


class Awkward(nn.Module):
    """Tied weights, a frozen parameter, a parameter that never gets a gradient, odd shapes."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 7)
        self.mix = nn.Linear(7, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(7, 3)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, tokens):
        x = self.embed(tokens)
        x = torch.tanh(self.mix(x)) + self.frozen(x)
        return self.scale * x @ self.embed.weight.T  # tied: the embedding is also the output layer


def build(kind, seed):
    if kind == "awkward":
        torch.manual_seed(seed)
        return Awkward()
    return models.build(kind, seed=seed)


def batch_of(kind, batch_size=8, seed=0):
    if kind == "awkward":
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 11, (batch_size, 5), generator=g)
        return tokens, torch.randint(0, 11, (batch_size, 5), generator=g)
    return models.example_batch(kind, batch_size=batch_size, seed=seed)


def loss_of(model, batch):
    inner = getattr(model, "module", model)
    if isinstance(inner, Awkward):
        inputs, targets = batch
        logits = model(inputs)
        return nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    return models.loss_fn(model, batch)


def reference(kind, steps=1, lr=0.1, batch_size=8):
    """Single process, full batches, rank 0's initial weights: grads at every step, final params."""
    model = build(kind, seed=0)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    grads = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, batch_of(kind, batch_size, seed=step)).backward()
        grads.append(models.gradients(model))
        optimizer.step()
    return grads, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_on_rank(kind, mode, steps=1, lr=0.1, bucket_mb=0.0005, batch_size=8):
    """Every rank starts from *its own* random weights: only the broadcast makes them agree."""
    from distlab.tools import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(kind, seed=rank)
    wrapper = overlap.OverlappedDDP(model, bucket_mb) if mode == "overlapped" else model
    if mode != "overlapped":
        naive.broadcast_parameters(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    grads, counts, launched_in_backward = [], [], []
    for step in range(steps):
        shard = models.shard(batch_of(kind, batch_size, seed=step), rank, world)
        optimizer.zero_grad(set_to_none=True)
        with comm.record() as log:
            loss = loss_of(wrapper, shard)
            loss.backward()
            launched_in_backward.append(sum(c.op == "all_reduce" and c.async_op for c in log))
            if mode == "naive":
                naive.average_gradients(model)
            elif mode == "bucketed":
                data_parallel_buckets.bucketed_average(model, bucket_mb)
            else:
                wrapper.finish()
        counts.append(log.counts()["all_reduce"])
        grads.append(models.gradients(model))
        optimizer.step()
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return grads, params, counts, launched_in_backward



def assert_grads_equal(per_rank_grads, ref_grads):
    for name, ref in ref_grads.items():
        for rank, grads in enumerate(per_rank_grads):
            if ref is None:
                assert grads[name] is None, f"rank {rank}: `{name}` got a gradient it should not have"
            else:
                checks.assert_tensor_close(grads[name], ref, name=f"grad of {name} on rank {rank}",
                                           rtol=checks.GRAD_RTOL, atol_scale=checks.GRAD_ATOL_SCALE)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mode", ["naive", "bucketed", "overlapped"])
@pytest.mark.parametrize("kind", ["mlp", "gpt", "awkward"])
def test_gradients_and_sgd_trajectory_match_the_single_process_reference(pools, n, mode, kind):
    steps, lr = 3, 0.1
    ref_grads, ref_params = reference(kind, steps, lr)
    results = distlab.run(train_on_rank, kind, mode, steps, lr, nprocs=n)
    for step in range(steps):
        assert_grads_equal([r[0][step] for r in results], ref_grads[step])
    # SGD: a gradient difference d moves a parameter by lr*d per step; 1e-6 is ~100x the rounding.
    for rank, (_, params, _, _) in enumerate(results):
        for name, ref in ref_params.items():
            torch.testing.assert_close(params[name], ref, rtol=0, atol=1e-6, msg=f"{name} on rank {rank}")


@pytest.mark.parametrize("kind", ["gpt", "awkward"])
def test_all_reduce_counts_naive_one_per_gradient_bucketed_one_per_bucket(pools, kind):
    model = build(kind, seed=0)
    with_grads = [p for p in model.parameters() if p.requires_grad]
    buckets = data_parallel_buckets.plan_buckets(model.parameters(), 0.0005)
    assert 1 < len(buckets) < len(with_grads)
    for mode, expected in (("naive", len(with_grads) - 2 * (kind == "awkward")),  # `unused`: no grads
                           ("bucketed", len(buckets)), ("overlapped", len(buckets))):
        for _, _, counts, launched in distlab.run(train_on_rank, kind, mode, 2, nprocs=2):
            assert counts == [expected, expected], (mode, counts)
            if mode == "overlapped":
                # From the second step on, every bucket starts inside backward; in the first, a
                # bucket holding a parameter without gradient (and those after it) waits for finish().
                assert launched[1] == len(buckets), launched
                assert launched[0] == (0 if kind == "awkward" else len(buckets)), launched
            else:
                assert launched == [0, 0]


def test_plan_buckets_reverse_order_cap_dtype_and_frozen():
    a, b, c = nn.Parameter(torch.zeros(100)), nn.Parameter(torch.zeros(100)), nn.Parameter(torch.zeros(1000))
    frozen = nn.Parameter(torch.zeros(5), requires_grad=False)
    d = nn.Parameter(torch.zeros(10, dtype=torch.float64))
    mb = 800 / data_parallel_buckets.MiB  # room for two of the small ones (400 bytes each)
    buckets = data_parallel_buckets.plan_buckets([a, b, frozen, c, d], mb)
    assert [[id(p) for p in bucket] for bucket in buckets] == [[id(d)], [id(c)], [id(b), id(a)]]


def ours_and_torchs_bucket_sizes(bucket_mb):
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    config = dict(dim=64, layers=2)
    theirs = DistributedDataParallel(models.build("gpt", seed=0, **config), bucket_cap_mb=bucket_mb)
    for step in range(3):        # torch rebuilds its buckets in gradient order, in the second forward
        models.loss_fn(theirs, models.shard(models.example_batch("gpt", 4 * world, seed=step, **config),
                                            rank, world)).backward()
    torch_sizes = [int(size) for size in theirs._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
    ours = data_parallel_buckets.plan_buckets(models.build("gpt", seed=0, **config).parameters(), bucket_mb)
    return [sum(p.numel() * p.element_size() for p in bucket) for bucket in ours], torch_sizes


@pytest.mark.parametrize("bucket_mb", [0.05, 0.2])
def test_plan_buckets_cuts_the_buckets_torch_ddp_cuts(pools, bucket_mb):
    """Same buckets as torch's DDP: each holds at least the cap, so the last one (the all-reduce
    that nothing hides) is the remainder, small."""
    ours, theirs = distlab.run(ours_and_torchs_bucket_sizes, bucket_mb, nprocs=2)[0]
    assert len(ours) > 2 and ours == theirs, (ours, theirs)


def accumulated_gradients(kind, k, sync_forward, bucket_mb=0.0005):
    from distlab.tools import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(kind, seed=rank)
    wrapper = overlap.OverlappedDDP(model, bucket_mb)
    micro = [models.shard(batch_of(kind, 8, seed=i), rank, world) for i in range(k)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: keep the weights, see the grads
    with comm.record() as log:
        overlap.accumulation_step(wrapper, optimizer, micro, loss_of, sync_forward=sync_forward)
    return models.gradients(model), log.counts()["all_reduce"], len(wrapper.buckets)


@pytest.mark.parametrize("n", [2, 4])
def test_no_sync_communicates_once_and_the_classic_bug_is_caught_by_counting(pools, n):
    k = 3
    model = build("gpt", seed=0)
    full = [batch_of("gpt", 8, seed=i) for i in range(k)]
    model.zero_grad()
    for batch in full:  # the reference: mean loss over all k*8 samples, in one process
        (loss_of(model, batch) / k).backward()
    ref = models.gradients(model)
    right = distlab.run(accumulated_gradients, "gpt", k, True, nprocs=n)
    wrong = distlab.run(accumulated_gradients, "gpt", k, False, nprocs=n)
    for _grads, calls, buckets in right:
        assert calls == buckets, "no_sync around forward and backward: one all-reduce per bucket"
    for _grads, calls, buckets in wrong:
        assert calls == k * buckets, "no_sync around backward only: every micro-step communicates"
    # Both give the right gradients: the bug costs k times the traffic, silently.
    assert_grads_equal([g for g, _, _ in right], ref)
    assert_grads_equal([g for g, _, _ in wrong], ref)


def torch_ddp_gradients(kind, bucket_mb, options=None):
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    shard = models.shard(batch_of(kind, 8), rank, world)
    model = build(kind, seed=rank)
    options = dict(options or {})
    if options.pop("one_bucket_per_parameter", False):
        options["buckets"] = [[p] for p in reversed(list(model.parameters()))]
    ours = overlap.OverlappedDDP(model, bucket_mb, **options)
    for _ in range(2):                              # twice: the kept buffers are reused correctly
        ours.zero_grad(set_to_none=True)
        loss_of(ours, shard).backward()
        ours.finish()
    assert len(ours.buckets) == len(options.get("buckets", ours.buckets))
    theirs = DistributedDataParallel(build(kind, seed=rank), bucket_cap_mb=bucket_mb)
    loss_of(theirs, shard).backward()
    return models.gradients(ours.module), models.gradients(theirs.module)


@pytest.mark.parametrize("options", [{}, {"reuse_buffers": False, "one_bucket_per_parameter": True}])
def test_same_gradients_as_torch_ddp(pools, options):
    for ours, theirs in distlab.run(torch_ddp_gradients, "gpt", 0.01, options, nprocs=4):
        for name, grad in theirs.items():
            # both average the same float32 numbers, perhaps grouped differently: rounding only
            torch.testing.assert_close(ours[name], grad, rtol=1e-5, atol=1e-7)
