"""The fork launcher (distlab.runtime.launchers.forked) behaves as torchrun does, started faster.

The grader's clean room starts its ranks with it; these tests hold it to torchrun's behaviour
side by side: the variables a rank sees, results, a raising or vanishing rank, a timeout, a
pool, and no process left behind, even when the agent itself is killed.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab import DistTimeout, RankError

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                      "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
"""What torchrun tells each worker (torch.distributed.elastic's documented worker variables),
less those whose values are per launch (``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``)."""


def what_a_rank_sees():
    summed = torch.full((2,), float(dist.get_rank() + 1))
    dist.all_reduce(summed)
    me, parent = psutil.Process(), psutil.Process().parent()
    return {"variables": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES},
            "port": os.environ.get("MASTER_PORT", "").isdigit(), "sum": summed.tolist(),
            "tmp": tempfile.gettempdir(),
            "rank_command": " ".join(me.cmdline()), "parent_command": " ".join(parent.cmdline())}


def test_a_forked_rank_sees_what_a_torchrun_rank_sees_without_starting_a_new_python():
    torchrun = distlab.run(what_a_rank_sees, nprocs=4, launcher="local")
    forked = distlab.run(what_a_rank_sees, nprocs=4, launcher="fork")
    for rank, (theirs, ours) in enumerate(zip(torchrun, forked)):
        assert ours["variables"] == theirs["variables"], rank
        assert ours["variables"]["RANK"] == str(rank) and ours["port"] and ours["sum"] == [10.0, 10.0]
        assert ours["sum"] == theirs["sum"]
        # The user's temporary folder, not the run's (a forked rank once kept the one its agent found).
        assert ours["tmp"] == theirs["tmp"] == tempfile.gettempdir()
        # torchrun's rank is a new interpreter running the worker; ours is the agent, forked.
        assert "distlab.runtime.worker" in theirs["rank_command"] and "torch.distributed.run" in theirs["parent_command"]
        assert "distlab.runtime.launchers.forked" in ours["rank_command"] == ours["parent_command"]


def raise_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("only rank 1 raises")
    dist.barrier()


def vanish_on_rank_one():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


@pytest.mark.parametrize("launcher", ["local", "fork"])
def test_a_raising_or_vanishing_rank_is_the_same_rank_error_from_both_launchers(launcher):
    started = time.monotonic()
    with pytest.raises(RankError) as raised:
        distlab.run(raise_on_rank_one, nprocs=2, timeout=60, launcher=launcher)
    assert raised.value.rank == 1 and raised.value.exc_type == "ValueError"
    assert "only rank 1 raises" in str(raised.value)
    with pytest.raises(RankError) as vanished:
        distlab.run(vanish_on_rank_one, nprocs=2, timeout=60, launcher=launcher)
    assert vanished.value.rank == 1 and vanished.value.exc_type == "ProcessExited"
    assert "exited with code 3" in str(vanished.value)   # the agent's failure lines, read by the watcher
    assert time.monotonic() - started < 45, "a peer was left to time out"


def one_rank_skips_a_collective():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))


def test_a_timeout_on_forked_ranks_names_what_each_was_doing():
    with pytest.raises(DistTimeout) as info:
        distlab.run(one_rank_skips_a_collective, nprocs=2, timeout=5, launcher="fork")
    states = info.value.rank_states
    assert states[0].startswith("blocked in all_reduce(float32[4]"), states
    assert states[1] == "returned (waiting for the other ranks)", states


def rank():
    return dist.get_rank()


def _processes_of(pool) -> list[psutil.Process]:
    return [psutil.Process(pool.job.agent.pid), *pool.job.watcher.workers.values()]


def test_a_forked_pool_serves_calls_and_leaves_no_process():
    pool = distlab.Pool(2, launcher="fork").start()
    processes = _processes_of(pool)
    assert pool.run(rank) == [0, 1] and pool.run(rank) == [0, 1]
    pool.stop()
    assert not [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_killing_the_agent_ends_its_forked_ranks():
    pool = distlab.Pool(2, launcher="fork").start()
    try:
        ranks = list(pool.job.watcher.workers.values())
        assert len(ranks) == 2 and pool.run(rank) == [0, 1]
        os.kill(pool.job.agent.pid, signal.SIGKILL)
        gone, alive = psutil.wait_procs(ranks, timeout=10)
        assert not alive, f"ranks outlived their agent: {alive}"
    finally:
        pool.stop(gracefully=False)
