"""distlab.run: results, output, errors, timeouts, bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from eavesdrop import BUSY_RANKS
from process_support import REPEAT_UNDER_LOAD, alive_with_marker

import distlab
from distlab import DistTimeout, RankError

# ---- results -------------------------------------------------------------------------------

def rank_and_world(offset, scale=1):
    return (dist.get_rank() + offset) * scale, dist.get_world_size()


@pytest.mark.parametrize("nprocs", [2, 4])
def test_results_come_back_in_rank_order_with_args_and_kwargs(nprocs):
    results = distlab.run(rank_and_world, 10, nprocs=nprocs, scale=2)
    assert results == [((r + 10) * 2, nprocs) for r in range(nprocs)]


def test_lambdas_closures_and_tensors_travel_both_ways():
    base = torch.arange(4.0)
    factor = 3.0

    def summed(t):
        out = t * factor + dist.get_rank()
        dist.all_reduce(out)
        return out

    results = distlab.run(summed, base, nprocs=2)
    expected = base * factor * 2 + 1  # ranks add 0 and 1
    for r in results:
        torch.testing.assert_close(r, expected, rtol=0, atol=0)  # small integers: exact
    assert distlab.run(lambda: dist.get_rank() ** 2, nprocs=2) == [0, 1]


def test_a_function_defined_in_main_is_sent_by_value(tmp_path):
    # Like a notebook: the function lives in __main__, which the ranks cannot import.
    script = tmp_path / "notebook_like.py"
    script.write_text(
        "import distlab, torch.distributed as dist\n"
        "SECRET = 41\n"
        "def helper(x):\n    return x + 1\n"
        "def fn():\n    return helper(SECRET) + dist.get_rank()\n"
        "print(distlab.run(fn, nprocs=2))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[42, 43]"


def test_results_are_detached_and_on_cpu():
    def loss():
        w = torch.ones(3, requires_grad=True)
        return (w * 2).sum()  # a non-leaf that requires grad cannot be pickled as is

    results = distlab.run(loss, nprocs=2)
    assert all(r.item() == 6.0 and not r.requires_grad for r in results)


def test_each_rank_gets_threads_seed_and_backend():
    def facts():
        return torch.get_num_threads(), torch.rand(2), dist.get_backend(), str(distlab.device())

    results = distlab.run(facts, nprocs=2)
    torch.manual_seed(0)
    expected_rand = torch.rand(2)
    for threads, rand, backend, device in results:
        assert threads == max(1, (os.cpu_count() or 1) // 2)
        torch.testing.assert_close(rand, expected_rand, rtol=0, atol=0)  # same seed everywhere
        assert (backend, device) == ("gloo", "cpu")  # no GPU on this machine
    assert distlab.run(torch.get_num_threads, nprocs=2, threads=1) == [1, 1]
    first = distlab.run(lambda: torch.rand(1).item(), nprocs=1, seed=7)[0]
    torch.manual_seed(7)
    assert first == torch.rand(1).item()


def test_output_is_streamed_live_with_rank_prefix(capsys):
    def talk():
        print(f"hello from {dist.get_rank()}")
        print("to stderr", file=sys.stderr)
        time.sleep(3)
        return True

    seen = {}
    real_write = sys.stdout.write

    def timed_write(text):
        if "hello from 0" in text and "first" not in seen:
            seen["first"] = time.monotonic()
        return real_write(text)

    sys.stdout.write = timed_write
    try:
        distlab.run(talk, nprocs=2)
        returned = time.monotonic()
    finally:
        sys.stdout.write = real_write
    out, err = capsys.readouterr()
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    assert "[rank 0] to stderr" in err and "[rank 1] to stderr" in err
    assert returned - seen["first"] > 2.0, "output appeared only when the run ended, not live"


def test_huge_output_is_cut_and_counted(capsys, monkeypatch):
    monkeypatch.setattr(distlab.runtime.output, "MAX_OUTPUT_BYTES", 10_000)

    def chatty():
        for i in range(20_000):
            print(f"line {i}")

    distlab.run(chatty, nprocs=1)
    out, _ = capsys.readouterr()
    assert "[rank 0] line 0" in out and "line 19999" not in out
    assert re.search(r"\[rank 0\] \.\.\. \d+ more bytes of output not shown", out)
    echoed = sum(len(line) - len("[rank 0] ") + 1 for line in out.splitlines()[:-1])
    assert 9_000 < echoed <= 10_000  # the rank's own bytes, without our prefixes


# ---- failures ------------------------------------------------------------------------------

def raise_on_rank_one():
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError(f"raised at {time.time()}")
    t = torch.zeros(4)
    dist.recv(t, src=1)  # would wait forever: rank 1 never sends


def test_a_raising_rank_becomes_rank_error_quickly_and_stops_the_others():
    started = time.monotonic()
    with pytest.raises(RankError) as info:
        distlab.run(raise_on_rank_one, nprocs=2, timeout=100)
    raised_to_us = time.time()
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "raise ValueError" in err.remote_traceback and "raise_on_rank_one" in err.remote_traceback
    assert isinstance(err.remote_exception, ValueError)
    raised_on_rank = float(err.remote_message.split()[-1])
    assert raised_to_us - raised_on_rank < 5.0
    assert time.monotonic() - started < 30, "the other rank was left to time out"
    assert "rank 1 raised ValueError" in str(err)


def _leave(how, rank):
    if dist.get_rank() == rank:
        if how == "sys.exit":
            sys.exit(4)
        os._exit(3)
    dist.barrier()


@pytest.mark.parametrize("how, rank, kind, says", [
    ("sys.exit", 0, "SystemExit", "sys.exit(4)"),
    ("os._exit", 1, "ProcessExited", "exited with code 3"),
])
def test_sys_exit_and_os_exit_in_a_rank_are_rank_errors(how, rank, kind, says):
    with pytest.raises(RankError) as info:
        distlab.run(_leave, how, rank, nprocs=2, timeout=60)
    assert info.value.rank == rank and info.value.exc_type == kind
    assert says in str(info.value)


def _start_detached_children(marker, die):
    """Start a child in a session of its own and a grandchild that double-forks away; then return, or die."""
    import subprocess
    import sys

    sleeper = f"import time; time.sleep(600)  # {marker}"
    subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
    escape = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)"
    subprocess.run([sys.executable, "-c", escape], check=True)   # its parent is gone at once: an orphan
    if die and dist.get_rank() == 1:
        os._exit(3)
    return dist.get_rank()


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(REPEAT_UNDER_LOAD))
def test_a_failed_run_raises_only_once_what_its_dead_rank_started_is_gone_under_load(cpu_load, attempt):
    marker = f"distlab-test-orphan-{attempt}"
    with pytest.raises(RankError, match="exited with code 3"):
        distlab.run(_start_detached_children, marker, True, nprocs=2, timeout=60)
    assert not alive_with_marker(marker)


def test_a_pool_call_returns_only_once_what_it_started_is_gone_and_the_ranks_stay():
    with distlab.Pool(2) as pool:
        ranks = pool.job.watcher.workers
        assert distlab.run(_start_detached_children, "distlab-test-pool-call", False, nprocs=2) == [0, 1]
        assert not alive_with_marker("distlab-test-pool-call")
        assert distlab.run(rank_and_world, 0, nprocs=2) == [(0, 2), (1, 2)]
        assert pool.job.watcher.workers == ranks and all(p.is_running() for p in ranks.values())


def test_an_unpicklable_result_is_a_rank_error_that_says_so():
    with pytest.raises(RankError) as info:
        distlab.run(lambda: threading.Lock(), nprocs=1)
    assert "lock" in str(info.value).lower() and "pickle" in str(info.value).lower()


def deadlock(started_file=None):
    if started_file is not None and dist.get_rank() == 0:
        # When this rank joined: the "since" of the state the worker wrote as the call began,
        # before it unpickled this function (which imports this test module: up to seconds on a
        # loaded machine, and counted against the timeout, as the docstring of run says).
        from distlab.runtime import rundir
        joined = rundir.read_state(Path(sys.argv[1]), 0)["since"]
        with open(started_file, "w") as f:
            f.write(str(joined))
    t = torch.zeros(4)
    if dist.get_rank() == 0:
        dist.recv(t, src=1)
    else:
        while True:  # busy in user code, never sends
            time.sleep(0.01)


@pytest.mark.slow
def test_timeout_names_what_each_rank_was_doing(tmp_path):
    started_file = tmp_path / "started"
    with pytest.raises(DistTimeout) as info:
        distlab.run(deadlock, str(started_file), nprocs=2, timeout=10)
    # The clock starts when the ranks have joined (startup is not counted against the function).
    elapsed = time.time() - float(started_file.read_text())  # since rank 0 joined
    assert isinstance(info.value, TimeoutError)
    assert 10 <= elapsed < 15, elapsed
    states = info.value.rank_states
    assert re.match(r"blocked in recv\(float32\[4\], from rank 1, group of 2\) for \d+\.\d s", states[0]), states
    assert states[1].startswith("in user code"), states
    assert "rank 0: blocked in recv" in str(info.value)
    # Its first line says how to give the call more time (a cell's is tests/runtime/test_notebook.py's).
    assert str(info.value).split("\n")[0] == (
        "the run did not finish within 10 s. To give it more time: distlab.run(..., timeout=60).")


def test_a_timeout_keeps_its_hint_across_processes_and_shows_without_frames_in_a_notebook():
    """A DistTimeout travels pickled (from a grader's process, say) with its hint; IPython shows
    it as its message alone (``_render_traceback_``), the rank states included."""
    import pickle

    error = DistTimeout(600, {0: "in user code for 600.0 s", 1: "returned"}).with_hint("Ask for more.")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.hint == "Ask for more." and copy.rank_states == error.rank_states
    shown = copy._render_traceback_()
    assert shown[0] == "\x1b[0;31mDistTimeout\x1b[0m: the run did not finish within 600 s. Ask for more."
    assert shown[1:] == ["What each rank was doing:", "  rank 0: in user code for 600.0 s", "  rank 1: returned"]


def one_rank_skips_a_collective():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))


@pytest.mark.slow
def test_a_rank_that_returned_while_another_waits_is_reported_as_returned():
    """The classic hang: one rank skipped a collective and returned. Its state must say so,
    not name the end-of-run barrier the launcher makes it wait in."""
    with pytest.raises(DistTimeout) as info:
        distlab.run(one_rank_skips_a_collective, nprocs=2, timeout=5)
    states = info.value.rank_states
    assert states[0].startswith("blocked in all_reduce(float32[4]"), states
    assert states[1] == "returned (waiting for the other ranks)", states


def test_rank_state_writes_what_settles_and_skips_what_races_past(tmp_path):
    """The state file costs a rank nothing per call: a state is written once it has stayed
    ``settle`` seconds (a hang always does), never while calls race past; phase changes the
    launcher waits for are written at once."""
    from distlab.runtime import rundir
    from distlab.runtime.rank_state import RankState

    state, built = RankState(tmp_path, 3, settle=0.05), []
    state.now({"phase": "ready"})
    assert rundir.read_state(tmp_path, 3) == {"phase": "ready"}
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:          # thousands of calls, each replacing the last
        state.soon(lambda: built.append(1) or {"phase": "call", "call": "racing"})
    assert rundir.read_state(tmp_path, 3) == {"phase": "ready"} and not built
    state.soon(lambda: {"phase": "call", "call": "recv(stuck)"})
    time.sleep(0.3)                              # more than 2 * settle: a hang is on disk
    assert rundir.read_state(tmp_path, 3) == {"phase": "call", "call": "recv(stuck)"}


@pytest.mark.slow
def test_timeout_while_an_async_op_is_pending():
    def stuck_waiting():
        t = torch.zeros(8)
        if dist.get_rank() == 0:
            work = dist.irecv(t, src=1)
            work.wait()
        else:
            time.sleep(60)

    with pytest.raises(DistTimeout) as info:
        distlab.run(stuck_waiting, nprocs=2, timeout=10)
    assert "Work.wait" in info.value.rank_states[0] and "irecv(float32[8]" in info.value.rank_states[0]


# ---- bad input fails before any process starts --------------------------------------------

@pytest.fixture
def no_process_may_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started for bad input")
    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(nprocs=0), ValueError, "between 1 and 64"),
    (dict(nprocs=65), ValueError, "between 1 and 64"),
    (dict(nprocs="2"), TypeError, "integer"),
    (dict(nprocs=2, timeout=-1), ValueError, "positive"),
    (dict(nprocs=2, backend="mpi"), ValueError, "backend"),
    (dict(nprocs=2, backend="nccl"), ValueError, "one GPU per rank"),
    (dict(nprocs=2, threads=0), ValueError, "threads"),
    (dict(nprocs=2, launcher="mpirun"), ValueError, "launcher"),
])
def test_bad_arguments_fail_clearly(no_process_may_start, kwargs, error, words):
    with pytest.raises(error, match=words):
        distlab.run(rank_and_world, 0, **kwargs)


def test_not_callable_fails_clearly(no_process_may_start):
    with pytest.raises(TypeError, match="needs a function"):
        distlab.run(42, nprocs=2)


def test_unpicklable_things_are_named(no_process_may_start):
    lock = threading.Lock()

    def uses_closure():
        return lock.locked()

    with pytest.raises(distlab.NotPicklableError, match="closure variable `lock`"):
        distlab.run(uses_closure, nprocs=2)
    with pytest.raises(distlab.NotPicklableError, match="positional argument 0 \\(lock\\)"):
        distlab.run(print, threading.Lock(), nprocs=2)
    with pytest.raises(distlab.NotPicklableError, match="keyword argument `stream`"):
        distlab.run(print, stream=(x for x in range(3)), nprocs=2)


def test_global_unpicklable_is_named(tmp_path):
    script = tmp_path / "nb.py"
    script.write_text(
        "import threading, distlab\n"
        "LOCK = threading.Lock()\n"
        "def fn():\n    return LOCK.locked()\n"
        "try:\n    distlab.run(fn)\nexcept distlab.NotPicklableError as e:\n    print(e)\n")
    out = subprocess.check_output([sys.executable, str(script)], text=True, timeout=60)
    assert "global variable `LOCK`" in out


def test_ranks_that_cannot_start_give_a_start_timeout(monkeypatch):
    from distlab.runtime import watcher

    monkeypatch.setattr(watcher, "START_TIMEOUT", 0.5)  # no rank imports torch that fast
    with pytest.raises(DistTimeout) as info:
        distlab.run(rank_and_world, 0, nprocs=2, timeout=60)
    assert info.value.waiting_for == "start"
    assert str(info.value).startswith("the ranks did not start within 0.5 s. A busy node starts ranks slowly: "
                                      "give them longer with the environment variable DISTLAB_START_TIMEOUT=60")
    assert "not started yet" in str(info.value)


# ---- concurrency ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_concurrent_runs_from_different_processes_do_not_collide():
    # Ten notebooks on one login node, all at once: ports and run directories must not clash.
    code = ("import sys, distlab, torch, torch.distributed as dist\n"
            "k = int(sys.argv[1])\n"
            "def f():\n    t = torch.tensor([k + dist.get_rank()])\n    dist.all_reduce(t)\n    return t.item()\n"
            "print('RESULT', distlab.run(f, nprocs=2, timeout=400))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(10)]
    for k, proc in enumerate(procs):
        out, err = proc.communicate(timeout=500)
        assert proc.returncode == 0, err[-2000:]
        assert f"RESULT {[2 * k + 1] * 2}" in out


# ---- a second account on the node (issue 44) ------------------------------------------------

VICTIM_RUN = """
import json, time
import distlab

""" + BUSY_RANKS + """
print(json.dumps(distlab.run(busy, 10, nprocs=2, timeout=180)))
"""


@pytest.mark.timeout(300)
def test_another_account_on_the_node_cannot_reach_a_runs_store_or_ranks(tmp_path):
    """While a student's ``distlab.run`` works, a second account looks for every port the
    student listens on (/proc/net/tcp names each one's owner), tries each as the run's
    rendezvous store (write a key) and sends junk to each (gloo's connections). The ranks live
    in a network of their own: it finds no port, and the run's result is right."""
    import shutil
    import tempfile

    from eavesdrop import VICTIM_UID, intrude_on_ranks, python_for_any_account

    home = Path(tempfile.mkdtemp(prefix="dl-r-", dir="/tmp"))
    try:
        os.chown(home, VICTIM_UID, VICTIM_UID)
        home.chmod(0o700)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
        intruder = intrude_on_ranks(VICTIM_UID, seconds=30)
        done = subprocess.run(["setpriv", f"--reuid={VICTIM_UID}", f"--regid={VICTIM_UID}", "--clear-groups",
                               python_for_any_account(), "-c", VICTIM_RUN],
                              capture_output=True, text=True, env=env, cwd=home, timeout=240)
        tried, intruder_errors = intruder.communicate(timeout=120)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    import json

    report = json.loads(tried or "{}")
    assert report, intruder_errors[-3000:]
    assert report["store_written"] == [], report     # the rendezvous store: not reached
    assert report["ports"] == [], report             # nor anything else the ranks listen on
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r[0] for r in results] == [[3.0] * 4] * 2 and all(r[1] > 10 for r in results), results


def test_a_machine_that_refuses_the_private_network_part_way_still_runs_the_ranks(monkeypatch, capfd):
    """Some security modules let a process make the namespaces and then refuse a step inside
    them (here: bringing up the new loopback). The agent's child fails before it runs
    anything; the agent starts again in this network, the run's result is right, and one
    line says the ports are reachable."""
    from distlab.runtime import private_network

    def refused():
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(private_network, "_loopback_up", refused)   # the fork copies it into the child
    assert distlab.run(rank_and_world, 1, nprocs=2) == [(1, 2), (2, 2)]
    assert "refused a private network for the ranks part-way" in capfd.readouterr().err
