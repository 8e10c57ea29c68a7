"""Shared fixtures: every test checks that it left no rank process behind."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from distlab.runtime.launchers import forked
from distlab.runtime.launchers.shared import SHARED_POOLS

# Every run directory (and so every torchrun/worker command line) of this test session lives
# under one private folder, so leftovers can be found without touching anyone else's processes.
# Under pytest-xdist each worker is its own session inside the controller's folder, with a short
# name: paths below it hold Unix sockets (Slurm's, torch's), which may be at most 107 bytes long.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
SESSION_TMP = Path(tempfile.mkdtemp(prefix=f"{_WORKER}-" if _WORKER else "distlab-tests-"))
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = str(SESSION_TMP)

REPO = Path(__file__).resolve().parent.parent
# scripts/ holds what the tests share with `make hub`: the private Slurm cluster's supervisor.
sys.path.insert(0, str(REPO / "scripts"))


def pytest_sessionfinish(session, exitstatus):
    """A session that passed removes its folder (one that failed keeps it, to be looked at):
    runs on a shared machine otherwise pile up in /tmp."""
    if not _WORKER and exitstatus == 0:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


def our_rank_processes() -> list[psutil.Process]:
    """Live (non-zombie) launcher agents and ranks started by this test session: torchrun and
    its workers, and the fork launcher's agent and its ranks (which carry the agent's command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] == psutil.STATUS_ZOMBIE or str(SESSION_TMP) not in cmd:
                continue
            if any(name in cmd for name in ("distlab.runtime.worker", "torch.distributed.run", forked.__name__)):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until_gone(pids, seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to disappear; return those still alive."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _outside_live_pools(procs) -> list[int]:
    """Pids of ``procs`` that belong to no pool still meant to be running (module-scoped fixtures)."""
    import distlab

    live = [str(pool.run_dir) for pool in distlab.active_pools().values() if pool.running]
    shared_folder = os.environ.get(SHARED_POOLS)       # warm ranks this process lends (test_shared_pools)
    if shared_folder:
        live += [json.loads(info.read_text())["run_dir"] for info in Path(shared_folder).glob("pool-*.json")]
    return [p.pid for p in procs if not any(d in " ".join(p.cmdline()) for d in live)]


@pytest.fixture(autouse=True)
def no_rank_process_left_behind():
    yield
    leftovers = wait_until_gone(_outside_live_pools(our_rank_processes()), 5.0)
    assert not leftovers, f"processes left behind by this test: {leftovers}"


@pytest.fixture(scope="session", autouse=True)
def no_rank_process_left_at_the_end():
    yield
    leftovers = wait_until_gone([p.pid for p in our_rank_processes()], 10.0)
    assert not leftovers, f"processes left behind by the test session: {leftovers}"


RANKS_AS_A_TOOL = {
    "test_checks.py", "test_collectives.py", "test_comm.py", "test_data.py", "test_ddp.py", "test_dtensor_tp.py",
    "test_experts.py", "test_mesh.py", "test_models.py", "test_pipeline.py", "test_tensor_parallel.py",
    "test_trace.py", "test_zero.py", "test_chapter01.py", "test_chapter02.py", "test_chapter03.py",
    "test_chapter04.py", "test_chapter05.py", "test_chapter06.py", "test_chapter07.py"}
"""Files whose subject is what runs on the ranks (the chapters' reference code, the checks, the
exercises' test helpers), not how ranks start. Their ranks start with the fork launcher
(``DISTLAB_LAUNCHER=fork``: one torch import per launch instead of one per rank plus torchrun's),
which tests/runtime/test_forked_launcher.py holds to torchrun's behaviour side by side. Measured, the
thirteen files above that are not a chapter's, in one pytest process: 688 s of CPU with
torchrun, 426 s forked (0.62); tests/grade/test_checks.py alone 136 s and 73 s. Every other file keeps the
default a student gets (torchrun): the runtime's, the notebook's, the book's, Slurm's. Grading
is untouched either way: the clean room always forks, and the sandbox does not pass the
variable to a student's kernel."""


@pytest.fixture(scope="module", autouse=True)
def launcher_for_this_file(request):
    """``DISTLAB_LAUNCHER=fork`` while a file of :data:`RANKS_AS_A_TOOL` runs (set before its ``pools``)."""
    if request.path.name not in RANKS_AS_A_TOOL:
        yield
        return
    saved = os.environ.get("DISTLAB_LAUNCHER")
    os.environ["DISTLAB_LAUNCHER"] = "fork"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DISTLAB_LAUNCHER", None)
        else:
            os.environ["DISTLAB_LAUNCHER"] = saved


@pytest.fixture(scope="module")
def pools():
    """Warm ranks for one test file: a pool of 2 and one of 4, which its ``distlab.run`` calls reuse."""
    import distlab

    with distlab.Pool(2), distlab.Pool(4):
        yield


@pytest.fixture
def cpu_load():
    """Two busy processes beside the test (the 2-core CI machine, loaded): started here, ended here by pid."""
    import subprocess
    import sys

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    time.sleep(0.5)   # let them take the cores
    yield
    for proc in busy:
        proc.kill()
        proc.wait()


LONGEST_FIRST = ("test_hostile.py", "test_book.py", "test_grading.py")
"""Files that take minutes each (measured: 11, 10 and 8 min of a 42-min serial run). Under
``pytest -n 2 --dist loadfile`` each file runs on one worker, in collection order, so these
start first and the short files fill the other worker around them."""


def pytest_collection_modifyitems(config, items):
    def priority(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=priority)          # stable: the order inside each file, and of the other files, stays


_FILE_SECONDS: dict[str, float] = {}
_WORKER_SECONDS: dict[str, float] = {}
_PHASE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Adds up each test file's time (setup, call and teardown) and each xdist worker's."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    _PHASE_SECONDS[f"{report.when:8s} {report.nodeid}"] = report.duration
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    _WORKER_SECONDS[worker] = _WORKER_SECONDS.get(worker, 0.0) + report.duration


def pytest_unconfigure(config):
    """Prints, after everything else, the slowest files and each worker's busy time: the last
    lines of a CI log then say where a slow run spent its minutes (a per-test list does not
    show a file of many middling tests, nor one worker idling while the other works)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if _WORKER or reporter is None or not _FILE_SECONDS:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:12]
    reporter.write_line("time per test file (setup + call + teardown), slowest first:")
    for path, seconds in slowest:
        reporter.write_line(f"  {seconds / 60:6.1f} min  {path}")
    reporter.write_line("slowest steps (a module fixture's setup counts in its file's first test):")
    for phase, seconds in sorted(_PHASE_SECONDS.items(), key=lambda item: -item[1])[:15]:
        reporter.write_line(f"  {seconds:6.0f} s  {phase[:150]}")
    busy = ", ".join(f"{worker} {seconds / 60:.1f} min" for worker, seconds in sorted(_WORKER_SECONDS.items()))
    reporter.write_line(f"busy time per worker: {busy}")
