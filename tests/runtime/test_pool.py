"""distlab.Pool: warm ranks, same semantics as run, restart after failure, isolation between calls."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from conftest import wait_until_gone

import distlab
from distlab import DistTimeout, RankError
from distlab.runtime.options import rank_setup


def pid_and_sum(x):
    t = torch.tensor([float(x + dist.get_rank())])
    dist.all_reduce(t)
    return os.getpid(), t.item()


@pytest.fixture(scope="module")
def pool4():
    with distlab.Pool(nprocs=4) as pool:
        yield pool


def test_pool_calls_reuse_their_ranks_and_run_uses_the_active_pool(pool4):
    first = pool4.run(pid_and_sum, 1)
    assert [s for _, s in first] == [10.0] * 4
    for i in range(10):
        results = distlab.run(pid_and_sum, i, nprocs=4)  # goes to the active pool of 4
        assert [s for _, s in results] == [4 * i + 6.0] * 4
        assert [p for p, _ in results] == [p for p, _ in first], "the pool's ranks were not reused"
    # Another size, or the grader's explicit choice, takes fresh processes.
    other = distlab.run(pid_and_sum, 0, nprocs=2)
    assert {p for p, _ in other}.isdisjoint(p for p, _ in first)
    with distlab.fresh_processes():
        fresh = distlab.run(pid_and_sum, 0, nprocs=4)
    assert {p for p, _ in fresh}.isdisjoint(p for p, _ in first)


def test_output_is_streamed_per_call(pool4, capsys):
    pool4.run(lambda: print("call one", dist.get_rank()))
    pool4.run(lambda: print("call two", dist.get_rank()))
    out = capsys.readouterr().out
    for r in range(4):
        assert f"[rank {r}] call one {r}" in out and f"[rank {r}] call two {r}" in out
    assert out.index("call one") < out.index("call two")


def patch_things():
    import builtins

    import distlab.models

    builtins.sum = lambda *args: -1                     # what a reference computed later would use
    distlab.models.loss_fn = lambda *args: torch.tensor(0.0)
    dist.all_reduce = lambda *args, **kwargs: None
    torch.allclose = lambda *args, **kwargs: True
    torch.Tensor.sum = lambda self, *a, **k: torch.tensor(-1.0)
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    return torch.rand(1).item()


def observe_things():
    import distlab.models

    t = torch.ones(1)
    dist.all_reduce(t)
    loss = distlab.models.loss_fn(distlab.models.build("mlp"), distlab.models.example_batch("mlp")).item()
    return (t.item(), torch.allclose(torch.zeros(1), torch.ones(1)), torch.ones(3).sum().item(),
            torch.is_grad_enabled(), torch.rand(1).item(), sum([1, 2]), loss)


def test_a_call_cannot_change_the_next_calls_result(pool4):
    rand_in_patcher = pool4.run(patch_things)[0]
    for world_sum, close, total, grad, rand, builtin_sum, loss in pool4.run(observe_things):
        assert (world_sum, close, total, grad, builtin_sum) == (4.0, False, 3.0, True, 3)
        assert loss > 0.0  # distlab's own functions are put back too
        assert rand == rand_in_patcher  # re-seeded: both calls drew from seed 0


def test_a_failed_call_restarts_the_pool_on_the_next_call(capsys):
    with distlab.Pool(nprocs=2) as pool:
        before = {p for p, _ in pool.run(pid_and_sum, 0)}

        def fail_on_one():
            if dist.get_rank() == 1:
                raise ArithmeticError("rank one gives up")
            dist.barrier()

        with pytest.raises(RankError) as info:
            pool.run(fail_on_one)
        assert info.value.rank == 1 and info.value.exc_type == "ArithmeticError"
        assert not wait_until_gone(before, 5.0), "the failed pool's ranks are still alive"
        results = pool.run(pid_and_sum, 0)
        assert [s for _, s in results] == [1.0, 1.0]
        assert before.isdisjoint(p for p, _ in results)
        assert "starting fresh ranks for this pool (the previous call failed" in capsys.readouterr().err


def raise_everywhere():
    raise NotImplementedError("a blank answer")


def raise_on_rank_0_after_the_all_reduce():
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        raise ValueError("checked the sum and disliked it")
    return t.item()


def raise_inside_a_collective():
    dist.broadcast(torch.ones(1), src=5)     # no rank 5: torch raises inside the call, on every rank


def test_a_call_that_failed_outside_every_collective_keeps_its_ranks(capsys):
    """Each rank returned or raised between collectives: the process group is as after a success.
    A rank that raised inside a distributed call makes the next call start fresh ranks."""
    with distlab.Pool(nprocs=2) as pool:
        before = {p for p, _ in pool.run(pid_and_sum, 0)}
        for fn, rank, kind in ((raise_everywhere, None, "NotImplementedError"),    # either rank may be first
                               (raise_on_rank_0_after_the_all_reduce, 0, "ValueError")):
            with pytest.raises(RankError) as info:
                pool.run(fn)
            assert info.value.exc_type == kind and rank in (None, info.value.rank)
            results = pool.run(pid_and_sum, 0)
            assert {p for p, _ in results} == before and [s for _, s in results] == [1.0, 1.0]
        assert "starting fresh ranks" not in capsys.readouterr().err
        with pytest.raises(RankError):
            pool.run(raise_inside_a_collective)
        assert not wait_until_gone(before, 5.0), "ranks that failed inside a collective are still alive"
        results = pool.run(pid_and_sum, 0)
        assert before.isdisjoint(p for p, _ in results) and [s for _, s in results] == [1.0, 1.0]
        assert "starting fresh ranks for this pool (the previous call failed" in capsys.readouterr().err


@pytest.mark.slow
def test_a_deadlocked_call_times_out_and_the_next_call_works():
    with distlab.Pool(nprocs=2) as pool:
        pool.run(pid_and_sum, 0)

        def deadlock():
            if dist.get_rank() == 0:
                dist.recv(torch.zeros(2), src=1)
            else:
                time.sleep(100)

        started = time.monotonic()
        with pytest.raises(DistTimeout) as info:
            pool.run(deadlock, timeout=3)
        assert time.monotonic() - started < 3 + 5
        assert "rank 0: blocked in recv(float32[2], from rank 1" in str(info.value)
        assert [s for _, s in pool.run(pid_and_sum, 2)] == [5.0, 5.0]


def test_interrupting_a_pooled_call_stops_its_ranks():
    with distlab.Pool(nprocs=2) as pool:
        pids = [p for p, _ in pool.run(pid_and_sum, 0)]
        previous = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        try:
            with pytest.raises(KeyboardInterrupt):
                pool.run(time.sleep, 30)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert not wait_until_gone(pids, 5.0)
        assert not pool.running
        assert [s for _, s in pool.run(pid_and_sum, 0)] == [1.0, 1.0]


def test_rank_setup_steps_apply_per_call_and_are_undone(pool4):
    import setup_steps_for_tests as steps

    with rank_setup("setup_steps_for_tests", "mark", value="on"):
        assert pool4.run(steps.read_mark) == ["on"] * 4
    assert pool4.run(steps.read_mark) == [None] * 4  # the step's undo ran after the call
    pids = {p for p, _ in pool4.run(pid_and_sum, 0)}
    with rank_setup("os", "getpid", when="start"):  # "start" steps need fresh processes
        fresh = distlab.run(pid_and_sum, 0, nprocs=4)
    assert pids.isdisjoint(p for p, _ in fresh)


def test_a_pool_with_start_steps_serves_only_runs_that_ask_for_exactly_those():
    import setup_steps_for_tests as steps

    start = {"module": "setup_steps_for_tests", "function": "mark", "when": "start", "kwargs": {"value": "capped"}}
    with distlab.Pool(nprocs=2, start_setup=[start]) as pool:
        assert pool.run(steps.read_mark) == ["capped"] * 2  # ran once as the ranks started
        pids = {p for p, _ in pool.run(pid_and_sum, 0)}
        with rank_setup("setup_steps_for_tests", "mark", when="start", value="capped"):
            warm = distlab.run(pid_and_sum, 0, nprocs=2)
        with rank_setup("setup_steps_for_tests", "mark", when="start", value="other"):
            cold = distlab.run(pid_and_sum, 0, nprocs=2)
        cold_plain = distlab.run(pid_and_sum, 0, nprocs=2, threads=1)  # other settings: fresh too
    assert {p for p, _ in warm} == pids
    assert pids.isdisjoint(p for p, _ in cold) and pids.isdisjoint(p for p, _ in cold_plain)
    with pytest.raises(ValueError, match="when='start'"):
        distlab.Pool(nprocs=2, start_setup=[dict(start, when="call")])


def test_bad_pool_arguments_fail_before_starting():
    with pytest.raises(ValueError, match="between 1 and 64"):
        distlab.Pool(nprocs=0)
    with pytest.raises(ValueError, match="one GPU per rank"):
        distlab.Pool(nprocs=2, backend="nccl")


def test_the_clean_rooms_warm_ranks_are_reused_and_replaced_when_broken_or_old():
    from distlab.grade.boundary.cleanroom import LAUNCHER, WarmRanks

    def run(fn, *args, **kwargs):   # as the clean room calls distlab.run: with its pools' launcher
        return distlab.run(fn, *args, launcher=LAUNCHER, **kwargs)

    warm = WarmRanks([], max_age_s=3600.0)
    try:
        assert warm.smallest_running() == 1  # nothing warm yet: a one-off run takes one rank
        warm.ready(2)
        first = warm.pools[2]
        pids = {p for p, _ in run(pid_and_sum, 0, nprocs=2)}  # served by the warm pool
        assert pids == {p.pid for p in first.job.watcher.workers.values()}
        warm.ready(2)
        assert warm.pools[2] is first and {p for p, _ in run(pid_and_sum, 0, nprocs=2)} == pids
        assert warm.smallest_running() == 2
        first.stop(gracefully=False)                                   # as after a failed call
        warm.ready(2)
        second = warm.pools[2]
        assert second is not first and second.running
        warm.max_age_s = 0.0                                           # older than allowed
        warm.ready(2)
        assert warm.pools[2] is not second and not second.running
    finally:
        warm.stop()
    # Only the clean room's own pools: another test's module-scoped pool may rightly still be active.
    still_active = distlab.active_pools().values()
    assert not any(pool.running for pool in warm.pools.values())
    assert not any(any(pool is active for active in still_active) for pool in warm.pools.values())


def test_a_pool_whose_owner_was_killed_leaves_a_folder_that_the_next_run_removes(tmp_path):
    """A kernel killed with SIGKILL cannot remove its pool's folder (its ranks die with it);
    the next run of the same user removes it, and never a folder whose owner still lives."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    owner = subprocess.Popen([sys.executable, "-c", "import distlab, time\n"
                              "pool = distlab.Pool(nprocs=2).start()\n"
                              "print(pool.run_dir, flush=True)\n"
                              "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        left = Path(owner.stdout.readline().strip())
    finally:
        owner.kill()
        owner.wait()
    assert left.name.startswith(f"distlab-pool-{owner.pid}-") and left.is_dir()
    ranks = [int((left / f"pid-{rank}").read_text()) for rank in range(2)]
    assert wait_until_gone(ranks, 30) == []            # the ranks died with their owner
    assert left.is_dir()                                # but the folder stayed
    ours = Path(tempfile.mkdtemp(prefix=f"distlab-pool-{os.getpid()}-"))   # a live owner's
    try:
        assert distlab.run(pid_and_sum, 0, nprocs=2)[0][1] == 1.0
        assert not left.exists()
        assert ours.is_dir()
    finally:
        ours.rmdir()
