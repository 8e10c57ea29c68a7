"""Warm ranks shared by the book build's kernels (distlab.runtime.shared_pools, launchers/shared.py).

The test process plays the build (the owner of the pools); each "kernel" is a child Python
process that starts ``distlab.Pool(nprocs=2)`` as a page does, runs calls and prints what it
saw as JSON. Real ranks, real locks, real processes: nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_until_gone

from distlab.runtime import rundir as files
from distlab.runtime.launchers import shared
from distlab.runtime.shared_pools import SharedPools

KERNEL = r"""
import json, os, sys, time, warnings
import torch.distributed as dist
import distlab

def where():
    filters = len(warnings.filters)
    warnings.filterwarnings("ignore")          # a page's call silences warnings: the next call must not inherit it
    return os.getpid(), os.getcwd(), filters

options = json.loads(sys.argv[1])
n = options.pop("nprocs", 2)
pool = distlab.Pool(nprocs=n, **options).activate()
report = {"borrowed": pool.borrowed}
report["first"] = distlab.run(where, nprocs=n)
report["second"] = distlab.run(where, nprocs=n)
distlab.run(lambda: print("printed by", os.getppid() and dist.get_rank()), nprocs=n)
def divide_while_the_peer_waits():
    if dist.get_rank() == 1:
        dist.barrier()                         # rank 0 never joins: rank 1 stays in the call
    return 1 / dist.get_rank()

mode = sys.argv[2]
if mode in ("fail", "fail-cleanly"):
    try:
        distlab.run(divide_while_the_peer_waits if mode == "fail" else lambda: 1 / dist.get_rank(), nprocs=2)
    except distlab.RankError as exc:
        report["failed"] = exc.exc_type
    report["after"] = distlab.run(where, nprocs=2)
elif mode == "hang":
    print(json.dumps(report), flush=True)
    distlab.run(time.sleep, 600, nprocs=2, timeout=900)
elif mode == "hold":
    print(json.dumps(report), flush=True)
    time.sleep(600)
pool.stop()
print(json.dumps(report), flush=True)
"""


def kernel(tmp_path, mode: str = "", **pool_options) -> subprocess.Popen:
    """A child process that uses a pool (of 2 ranks unless ``nprocs=`` says) as a page would, in a folder of its own."""
    folder = tmp_path / f"kernel-{time.monotonic_ns()}"
    folder.mkdir()
    return subprocess.Popen([sys.executable, "-c", KERNEL, json.dumps(pool_options), mode], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = out.splitlines()
    return json.loads(lines[-1]), out


def report_so_far(proc: subprocess.Popen) -> dict:
    """The report a kernel prints before it holds on (the lines before it are its ranks' output)."""
    while True:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        if line.startswith("{"):
            return json.loads(line)


def rank_pids(pools: SharedPools, nprocs: int = 2) -> list[int]:
    return [files.read_pid(pools.pools[nprocs].run_dir, rank) for rank in range(nprocs)]


@pytest.fixture(scope="module")
def owner():
    with SharedPools(sizes=(2,)) as owner:
        yield owner
    assert shared.SHARED_POOLS not in os.environ


@pytest.fixture
def fit(owner):
    """Every test starts with fit ranks (a test before may have left them broken)."""
    owner.refresh()
    yield owner


def test_kernels_borrow_the_same_warm_ranks_and_run_in_their_own_folder(fit, tmp_path):
    pids = rank_pids(fit)
    first, output = finish(kernel(tmp_path))
    second, output2 = finish(kernel(tmp_path))
    for report in (first, second):
        assert report["borrowed"] is True
        assert sorted(pid for pid, _, _ in report["first"]) == sorted(pids)   # the owner's ranks
    assert first["first"][0][1].endswith(os.sep + "kernel-" + first["first"][0][1].rsplit("kernel-", 1)[1])
    assert first["first"][0][1] != second["first"][0][1]            # each kernel's calls run where it runs
    assert first["first"][0][2] == first["second"][0][2]            # the filters one call added are gone
    assert "[rank 0] printed by 0" in output and "[rank 1] printed by 1" in output2
    assert output2.count("printed by") == 2                         # not what the first kernel's calls printed
    assert fit.restarts == 0 and fit.calls() >= 6                   # three calls per kernel


def test_a_failed_call_leaves_the_ranks_to_the_owner_who_replaces_them(fit, tmp_path):
    before, restarts = rank_pids(fit), fit.restarts
    report, _ = finish(kernel(tmp_path, "fail"))   # rank 0 raises while rank 1 waits in a barrier
    assert report["failed"] == "ZeroDivisionError"
    assert set(p for p, _, _ in report["after"]).isdisjoint(before)    # the kernel's next call: fresh ranks
    assert (fit.pools[2].run_dir / shared.BROKEN).exists()
    own, _ = finish(kernel(tmp_path))          # broken ranks are not lent: the kernel starts its own
    assert own["borrowed"] is False and set(p for p, _, _ in own["first"]).isdisjoint(before)
    fit.refresh()
    assert fit.restarts == restarts + 1 and wait_until_gone(before, 10) == []
    after, _ = finish(kernel(tmp_path))
    assert after["borrowed"] is True and sorted(p for p, _, _ in after["first"]) == sorted(rank_pids(fit))


def test_a_call_that_failed_with_every_rank_out_of_the_call_keeps_the_shared_ranks(fit, tmp_path):
    before, restarts = rank_pids(fit), fit.restarts
    report, _ = finish(kernel(tmp_path, "fail-cleanly"))   # rank 0 divides by zero, rank 1 returns
    assert report["failed"] == "ZeroDivisionError"
    assert sorted(p for p, _, _ in report["after"]) == sorted(before)   # the same ranks took the next call
    assert not (fit.pools[2].run_dir / shared.BROKEN).exists()
    fit.refresh()
    assert fit.restarts == restarts and rank_pids(fit) == before


def test_a_size_added_during_the_build_is_lent_from_then_on(fit, tmp_path):
    before, _ = finish(kernel(tmp_path, nprocs=3))
    assert before["borrowed"] is False                 # no pool of 3 yet: the kernel starts its own
    fit.add(3)                                         # kept until the owner stops (module end)
    after, _ = finish(kernel(tmp_path, nprocs=3))
    assert after["borrowed"] is True and sorted(p for p, _, _ in after["first"]) == sorted(rank_pids(fit, 3))
    fit.add(3)                                         # asked again (a later page): the same ranks
    fit.refresh()
    again, _ = finish(kernel(tmp_path, nprocs=3))
    assert sorted(p for p, _, _ in again["first"]) == sorted(p for p, _, _ in after["first"])


# Five kernels in a row, three of them starting ranks of their own (each waits up to 300 s in
# finish): 120 s of pytest's default was too short beside a second make test (load 10 on 2
# cores, 120 s reached at the fifth kernel). The bound is a hang guard, not a speed claim.
@pytest.mark.timeout(900)
def test_one_borrower_at_a_time_and_only_the_owners_children_with_default_settings(fit, tmp_path):
    holder = kernel(tmp_path, "hold")
    try:
        held = report_so_far(holder)
        assert held["borrowed"] is True
        meanwhile, _ = finish(kernel(tmp_path))
        assert meanwhile["borrowed"] is False       # the lock is taken: ranks of its own
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    other, _ = finish(kernel(tmp_path, threads=1))
    assert other["borrowed"] is False               # not the settings the shared ranks have
    grandchild = subprocess.run([sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.run("
                                 f"[sys.executable, '-c', {KERNEL!r}, '{{}}', '']).returncode)"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert grandchild.returncode == 0, grandchild.stderr[-3000:]
    assert json.loads(grandchild.stdout.splitlines()[-1])["borrowed"] is False   # started by a page, not the build
    after, _ = finish(kernel(tmp_path))
    assert after["borrowed"] is True                # the killed holder's lock went with it; its ranks were idle


def test_a_kernel_killed_mid_call_leaves_ranks_nobody_borrows_until_replaced(fit, tmp_path):
    before = rank_pids(fit)
    hanging = kernel(tmp_path, "hang")
    try:
        assert report_so_far(hanging)["borrowed"] is True
        deadline = time.monotonic() + 30
        while not (fit.pools[2].run_dir / shared.BUSY).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(hanging.pid, signal.SIGKILL)     # the kernel dies, its call still running on the ranks
        hanging.wait()
    own, _ = finish(kernel(tmp_path))
    assert own["borrowed"] is False
    fit.refresh()
    assert wait_until_gone(before, 10) == []
    assert finish(kernel(tmp_path))[0]["borrowed"] is True


def test_the_owner_ends_every_rank_and_removes_its_folder(tmp_path):
    outer = os.environ.get(shared.SHARED_POOLS)    # the module's owner, if its tests ran first
    owner = SharedPools(sizes=(2,)).start()
    folder, pids = owner.folder, rank_pids(owner) + [owner.pools[2].job.agent.pid]
    assert os.environ[shared.SHARED_POOLS] == str(folder)
    owner.stop()
    assert wait_until_gone(pids, 10) == []
    assert not folder.exists() and os.environ.get(shared.SHARED_POOLS) == outer
    owner.stop()   # twice is fine
