"""The book build's kernels, forked from a template that imported torch (book/_ext/forked_kernels.py).

Each test drives real kernels through nbclient, as myst-nb does during the build: the kernel
must behave as one Jupyter started itself (environment, working directory, outputs, figures,
interrupts, death), start without importing torch again, and leave no process behind.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import nbformat
import psutil
import pytest
from grading_support import REPO
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

sys.path.insert(0, str(REPO / "book" / "_ext"))
import forked_kernels  # noqa: E402

from distlab.runtime.shared_pools import SharedPools  # noqa: E402


@pytest.fixture
def template(monkeypatch):
    monkeypatch.delenv("DISTLAB_BOOK_FORKED_KERNELS", raising=False)
    # as a build started in the background of a script does: SIGINT ignored, which the
    # template inherits; its kernels must still be interruptible
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pid = forked_kernels.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    folder = forked_kernels.TEMPLATE.folder
    try:
        yield pid
    finally:
        forked_kernels.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not folder.exists()


def notebook(*cells: str):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def notebook_with(cell):
    return nbformat.v4.new_notebook(cells=[cell])


def outputs(nb) -> list[str]:
    return ["".join(o.get("text", "")) or ",".join(sorted(o.get("data", {}))) for cell in nb.cells for o in cell.outputs]


def test_a_forked_kernel_runs_a_page_as_a_fresh_kernel_would(template, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_FORK_PROBE", "asked for")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # under pytest, ipykernel leaves a child's output uncaptured
    nb = notebook("import os, sys\n"
                  "print(os.getppid(), os.getpgid(0) == os.getpid(), os.getcwd(), os.environ['DISTLAB_FORK_PROBE'])\n"
                  "print('torch' in sys.modules)",   # before any cell imported it
                  "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()",
                  "import subprocess, time\nsubprocess.run(['echo', 'from a child process'])\ntime.sleep(0.5)",  # 0.2 s: ipykernel's flush
                  "def rank(): import torch.distributed as dist; return dist.get_rank()\n"
                  "import distlab; print(distlab.run(rank, nprocs=2))")
    NotebookClient(nb, kernel_name="python3", timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    probe, figure, child, ranks = (outputs(notebook_with(cell)) for cell in nb.cells)
    assert probe == [f"{template} True {tmp_path} asked for\nTrue\n"]   # the template's child, own session;
    assert "image/png" in figure[-1]                                  # torch came with the fork
    assert child == ["from a child process\n"]
    assert ranks == ["[0, 1]\n"]
    assert psutil.Process(template).children() == []              # the kernel ended and was reaped


def test_interrupting_a_forked_kernel_stops_the_cell_and_its_death_is_noticed(template, tmp_path):
    nb = notebook("import time; time.sleep(60)", "print('after')")
    client = NotebookClient(nb, kernel_name="python3", timeout=2, interrupt_on_timeout=True, allow_errors=True)
    started = time.monotonic()
    client.execute()
    assert time.monotonic() - started < 30
    assert nb.cells[0].outputs[0]["ename"] == "KeyboardInterrupt"    # what the interrupt raised in the cell
    assert outputs(notebook_with(nb.cells[1])) == ["after\n"]       # and the kernel went on
    nb = notebook("import os; os._exit(3)", "print('never')")
    started = time.monotonic()
    with pytest.raises(DeadKernelError):
        NotebookClient(nb, kernel_name="python3", timeout=30).execute()
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while psutil.Process(template).children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert psutil.Process(template).children() == []


def test_forked_kernels_borrow_the_builds_warm_ranks(template):
    with SharedPools([2], parents=[template]) as pools:
        nb = notebook("import distlab, os\n"
                      "def pid(): return os.getpid()\n"
                      "with distlab.Pool(nprocs=2) as pool:\n"
                      "    print(sorted(pool.run(pid)))")
        NotebookClient(nb, kernel_name="python3", timeout=60).execute()
        warm = sorted(p.pid for p in psutil.Process(pools.pools[2].job.agent.pid).children())
        assert outputs(nb) == [f"{warm}\n"]
        assert pools.calls() == 1


def test_switched_off_the_kernels_start_as_usual(monkeypatch):
    monkeypatch.setenv("DISTLAB_BOOK_FORKED_KERNELS", "0")
    assert forked_kernels.start() is None and forked_kernels.TEMPLATE is None
    nb = notebook("import os, sys; print(os.getppid(), 'torch' in sys.modules)")
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    assert outputs(nb) == [f"{os.getpid()} False\n"]  # a new Python, started by Jupyter from here


SOCKETS_PROBE = ("import os, psutil\n"
                 "from ipykernel.kernelapp import IPKernelApp\n"
                 "app = IPKernelApp.instance()\n"
                 "folder = os.path.dirname(app.connection_file)\n"
                 "tcp = [c.laddr for c in psutil.Process().net_connections('inet') if c.status == 'LISTEN']\n"
                 "print(app.transport, oct(os.stat(folder).st_mode & 0o777), os.path.dirname(app.ip) == folder, tcp)")
"""What a page's kernel reports of its own sockets: its transport, its folder's mode, whether
its sockets are in that folder, and the TCP ports it listens on."""


@pytest.mark.parametrize("forked", ["1", "0"])
def test_the_pages_kernels_listen_on_no_tcp_port(monkeypatch, forked):
    """Issue 44: a kernel on TCP can be listened to by any account on the machine; the book's
    kernels, forked or not, use Unix sockets in a folder only the build's account can enter."""
    monkeypatch.setenv("DISTLAB_BOOK_FORKED_KERNELS", forked)
    forked_kernels.start()
    try:
        nb = notebook(SOCKETS_PROBE)
        NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    finally:
        forked_kernels.stop()
    assert outputs(nb) == ["ipc 0o700 True []\n"]
