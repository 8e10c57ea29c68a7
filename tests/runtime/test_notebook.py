"""distlab in a real Jupyter kernel: run and %%distributed under nbclient, interrupts, a killed kernel."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import nbformat
import pytest
from conftest import wait_until_gone
from jupyter_client import KernelManager
from nbclient import NotebookClient


def execute(cells: list[tuple[str, list[str]]]):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in cells]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return nb


def text_of(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "".join(parts)


# Five launches of two ranks each: about 25 s on a quiet machine, over 120 s (the suite's default
# bound) on CI's two cores shared with another worker. Each launch still has its own 60 s
# DistTimeout and each cell nbclient's 120 s, so a hang fails there, well inside this bound.
@pytest.mark.timeout(600)
def test_run_and_the_cell_magic_in_a_notebook():
    nb = execute([
        ("import distlab, torch, torch.distributed as dist\n%load_ext distlab", []),
        ("def who():\n    print('I am', dist.get_rank())\n    return dist.get_rank()\ndistlab.run(who, nprocs=2)", []),
        ("scale = 3", []),
        ("%%distributed -n 2 --out values\n"
         "t = torch.ones(1) * (rank + scale)\n"
         "print('world', world_size)\n"
         "dist.all_reduce(t)\n"
         "t.item()", []),
        ("values", []),
        ("%%distributed -n 2\nx = 1", []),
        ("%%distributed -n 2\nif rank == 1:\n    raise KeyError('missing on one')", ["raises-exception"]),
        ("import threading\nlock = threading.Lock()", []),
        ("%%distributed -n 2\nlock.locked()", ["raises-exception"]),
    ])
    cells = nb.cells
    assert "[rank 0] I am 0" in text_of(cells[1]) and "[rank 1] I am 1" in text_of(cells[1])
    assert "[0, 1]" in text_of(cells[1])
    assert "[rank 0] world 2" in text_of(cells[3]) and "[7.0, 7.0]" in text_of(cells[3])
    assert "[7.0, 7.0]" in text_of(cells[4])
    assert not [o for o in cells[5].outputs if o.output_type == "execute_result"]  # no value, no Out
    error = text_of(cells[6])
    assert error.startswith("RankError: rank 1 raised KeyError") and "<distributed cell>" in error
    assert "raise KeyError('missing on one')" in error  # the cell's source line in the traceback
    assert "NotPicklableError" in text_of(cells[8]) and "`lock`" in text_of(cells[8])


SLEEPER = """
import os, time, distlab
def sleeper(folder):
    import torch.distributed as dist
    with open(os.path.join(folder, f"pids-{dist.get_rank()}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    time.sleep(300)
"""


def wait_for_pids(folder, n, seconds=180) -> list[int]:  # distlab's own start limit (DISTLAB_START_TIMEOUT)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        files = sorted(folder.glob("pids-*"))
        if len(files) == n and all(f.read_text() for f in files):
            pids = [int(p) for f in files for p in f.read_text().split()]
            for f in files:
                f.unlink()
            return sorted(set(pids))
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def cell_output(kc, msg_id: str) -> list[str]:
    """What the kernel published for one cell so far: streams, errors, its status."""
    seen = []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=2)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing more
            return seen
        if msg["parent_header"].get("msg_id") == msg_id:
            content = msg["content"]
            seen.append(content.get("text") or content.get("evalue") or content.get("execution_state") or "")


def wait_until_the_kernel_accepts_cells(kc, tries: int = 50) -> None:
    """After a cell's error, ipykernel aborts the execute requests that reach it before it has
    finished "aborting the queue": a request sent right after the error reply can come back
    "aborted" without running (on a loaded machine the kernel is slow to clear that state; CI
    saw the next cell end at once, with no output). Send an empty cell until one really runs."""
    for _ in range(tries):
        msg_id = kc.execute("pass")
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        if reply["content"]["status"] == "ok":
            return
        time.sleep(0.2)
    raise AssertionError(f"the kernel still aborted cells after {tries} tries")


@contextlib.contextmanager
def kernel():
    """A running IPython kernel and a client talking to it; shut down at the end if it still lives."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        if km.is_alive():
            km.shutdown_kernel(now=True)


@pytest.mark.slow
# Two rank starts, each allowed distlab's 180 s start limit (wait_for_pids): on a loaded 2-core
# machine (CI runs the hub's browser tests beside this) the default 120 s cut the second start.
@pytest.mark.timeout(480)
def test_interrupt_and_a_killed_kernel_leave_no_process(tmp_path):
    with kernel() as (km, kc):
        kc.execute(SLEEPER)
        # 1. Interrupt (the notebook's stop button): KeyboardInterrupt, and the ranks are gone.
        msg_id = kc.execute(f"distlab.run(sleeper, {str(tmp_path)!r}, nprocs=2, timeout=200)")
        pids = wait_for_pids(tmp_path, 2)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert not wait_until_gone(pids, 5.0), "ranks survived an interrupt"
        wait_until_the_kernel_accepts_cells(kc)
        # 2. The kernel is SIGKILLed mid-run: torchrun and the workers die with it.
        msg_id = kc.execute(f"distlab.run(sleeper, {str(tmp_path)!r}, nprocs=2, timeout=200)")
        try:
            pids = wait_for_pids(tmp_path, 2)
        except AssertionError as error:   # seen once in a loaded make test: say what the cell did
            raise AssertionError(f"{error}; the cell printed: {cell_output(kc, msg_id)!r}") from None
        kc.stop_channels()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        assert not wait_until_gone(pids, 5.0), "ranks survived their kernel"


@pytest.mark.slow
def test_a_notebook_with_a_warm_pool_survives_a_deadlocked_cell():
    pids = "%%distributed -n 4\nimport os\nos.getpid()"   # which processes serve the cell
    cells = [("import distlab, time\n%load_ext distlab", []), ("%distributed start -n 4", []), (pids, [])]
    cells += [(f"%%distributed -n 4\nt = torch.ones(1) * {i}\ndist.all_reduce(t)\nt.item()", [])
              for i in range(20)]
    cells += [(pids, []),
              ("%%distributed -n 4 --timeout 3\nif rank == 0:\n    dist.recv(torch.zeros(1), src=1)\n"
               "else:\n    time.sleep(60)", ["raises-exception"]),
              ("%%distributed -n 4\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", []),
              ("%distributed status", []), ("%distributed stop", [])]
    nb = execute(cells)
    out = [text_of(c) for c in nb.cells]
    assert "4 ranks ready" in out[1]
    for i in range(20):
        assert f"[{4.0 * i}, {4.0 * i}, {4.0 * i}, {4.0 * i}]" in out[3 + i]
    # Warm: the same four processes served all 20 cells (a cold launch per cell would start new
    # ones, ~7 s each for 4 ranks here; speed itself is benchmarks/launch.py's to measure).
    assert out[2] == out[23] and out[2].count(",") == 3, (out[2], out[23])
    assert out[24].startswith("DistTimeout") and "rank 0: blocked in recv(float32[1], from rank 1" in out[24]
    assert "starting fresh ranks for this pool (the previous call timed out" in out[25]
    assert "[4.0, 4.0, 4.0, 4.0]" in out[25]
    assert "active pools: 4 ranks" in out[26] and "pools stopped" in out[27]


@pytest.mark.slow
def test_a_killed_kernel_takes_its_pool_with_it(tmp_path):
    with kernel() as (km, kc):
        kc.execute(SLEEPER.replace("time.sleep(300)", "") + "\ndistlab.start_pool(2)\n"
                   f"distlab.run(sleeper, {str(tmp_path)!r}, nprocs=2)")
        pids = wait_for_pids(tmp_path, 2)
        kc.stop_channels()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        assert not wait_until_gone(pids, 5.0), "pool ranks survived their kernel"


@pytest.mark.slow
def test_a_cell_out_of_time_says_in_one_line_how_to_give_it_more_and_shows_no_runtime_frames():
    """A ``%%distributed`` cell may run 10 minutes unless the notebook or the cell says
    otherwise; one that runs out ends with the message alone, its first line saying how to give
    the cell more time (the cell's own first line, changed), not with frames of the runtime's
    watcher."""
    magics = "get_ipython().find_cell_magic('distributed').__self__"
    nb = execute([
        (f"import distlab\n%load_ext distlab\n{magics}.timeout", []),
        ("%distributed --timeout 2", []),
        (f"{magics}.timeout", []),
        ("%%distributed -n 2 --out x\nimport time\ntime.sleep(60)", ["raises-exception"]),
        ("%%distributed -n 2 --timeout=1\nimport time\ntime.sleep(60)", ["raises-exception"]),
    ])
    out = [text_of(c) for c in nb.cells]
    assert out[0].strip() == "600.0", out[0]           # the default, before the notebook changes it
    assert "cells now run for up to 2 s" in out[1] and out[2].strip() == "2.0", out[1:3]
    for cell, limit, first_line in ((nb.cells[3], 2, "%%distributed -n 2 --out x --timeout 60"),
                                    (nb.cells[4], 1, "%%distributed -n 2 --timeout 60")):
        error, = [o for o in cell.outputs if o.output_type == "error"]
        assert error.ename == "DistTimeout"
        assert error.evalue.split("\n")[0] == (
            f"the run did not finish within {limit} s. To give it more time, make the cell's first line "
            f"`{first_line}`, or run `%distributed --timeout 60` once for every cell of this notebook."), error.evalue
        assert "rank 0: " in error.evalue and "rank 1: " in error.evalue
        shown = "\n".join(error.traceback)
        assert "watcher" not in shown and "distlab/runtime" not in shown and "File " not in shown, shown
