"""A kernel's message over the grader's cap is refused unread (distlab.grade.boundary.kernel_messages).

The attack: one write of 100 MB in a cell arrives at the grader as one ZeroMQ message, read
whole into the nbgrader process before the cell's output cap cut it (342 MB at its peak for
100 MB). Here a real ipykernel (on private Unix sockets, as the grader starts it, without the
sandbox) runs that cell under nbclient, in a process of its own whose peak memory is measured;
once with jupyter_client's own client, once with the grader's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ATTACKS = {
    # one write, one flush: one message of one 100 MB part
    "one part": 'import sys\nsys.stdout.write("m" * (100 * 2**20))\nsys.stdout.flush()',
    # the kernel's own session and IOPub socket: one message of 40 parts of 4 MiB (160 MiB), each under the per-part cap
    "many parts": 'k = get_ipython().kernel\nsent = k.session.send(k.iopub_socket, "stream", '
                  '{"name": "stdout", "text": "many parts\\n"}, parent=k.get_parent("shell"), '
                  'buffers=[b"m" * (4 * 2**20)] * 40)',
    # what a notebook prints and shows, under the cap; then one part over it
    "ordinary": ['import sys\nsys.stdout.write("b" * (4 * 2**20))\nsys.stdout.flush()',
                 'from IPython.display import display\nclass Shown:\n    def _repr_html_(self):\n'
                 '        return "<b>shown</b>"\n    def __repr__(self):\n        return "\'shown\'"\ndisplay(Shown())',
                 'for i in range(200):\n    print(f"line {i}", flush=True)',
                 'import sys\nsys.stdout.write("m" * (6 * 2**20))\nsys.stdout.flush()'],
    # grader/hostile/kill_kernel.py: the kernel kills itself; the cells after it are not run there
    "killed": 'import os, signal\nos.kill(os.getpid(), signal.SIGKILL)',
    # grader/hostile/patch_builtins.py: the kernel can no longer reply to anything
    "no answer": 'import builtins\nbuiltins.isinstance = lambda *args: True',
}
CELL_TIMEOUT_S = {"no answer": 10}
"""The harness's per-cell time limit (nbgrader's Execute.timeout), where it is not 120 s."""

RUN = f"ATTACKS = {ATTACKS!r}\nCELL_TIMEOUT_S = {CELL_TIMEOUT_S}" + r'''
import json, sys, time
import nbformat
from nbclient.exceptions import DeadKernelError
from nbconvert.preprocessors import ExecutePreprocessor
from distlab.grade.boundary import kernel_messages, kernel_proxy
from distlab.grade.boundary.kernel_sockets import PrivateSocketsKernelManager

mode, attack = sys.argv[1], sys.argv[2]

class Manager(PrivateSocketsKernelManager):
    def __init__(self, **kw):
        super().__init__(**kw)
        if mode != "plain":
            self.client_factory = kernel_messages.CappedKernelClient

    async def _async_launch_kernel(self, kernel_cmd, **kw):   # as distlab.grade.pipeline.grading_kernel.GradingKernelManager
        await super()._async_launch_kernel(kernel_cmd, **kw)
        if mode == "proxied":
            kernel_proxy.interpose(self)

class Execute(ExecutePreprocessor):   # as distlab.grade.pipeline.nbplugins.KernelExecute (an nbgrader Execute)
    def preprocess_cell(self, cell, resources, index):
        start = time.monotonic()
        try:
            return self._run_cell(cell, resources, index)
        finally:
            seconds.append(time.monotonic() - start)

    async def _async_handle_timeout(self, timeout, cell=None):
        self.unanswered = True
        return await super()._async_handle_timeout(timeout, cell)

    def _run_cell(self, cell, resources, index):
        if dead:   # as KernelExecute once its kernel died: the cell is not run, its messages looked at
            kernel_messages.explain(cell, self.kc)
            return cell, resources
        self.unanswered = False
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            dead.append(index)
            return cell, resources
        except Exception as exc:
            if not kernel_messages.only_output_lost(exc, cell, self.kc, answered=not self.unanswered):
                if not self.unanswered:
                    raise
                dead.append(index)   # it stopped responding
            return cell, resources
        kernel_messages.explain(cell, self.kc)
        return cell, resources

cells = ATTACKS[attack] if isinstance(ATTACKS[attack], list) else [ATTACKS[attack]]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells + ['print("after", 6 * 7)']])
seconds, dead = [], []
Execute(kernel_manager_class=Manager, timeout=CELL_TIMEOUT_S.get(attack, 120), kernel_name="python3", raise_on_iopub_timeout=True,
        interrupt_on_timeout=True, error_on_timeout={"ename": "CellTimeoutError", "evalue": "", "traceback": []},
        ).preprocess(nb, {})   # nbgrader's settings
peak_kib = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
print(json.dumps({"peak_mb": peak_kib / 1024, "outputs": [c.outputs for c in nb.cells], "seconds": seconds,
                  "dead": dead}))
'''


def _run(mode: str, attack: str = "one part") -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, mode, attack], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_a_message_of_100_mb_is_refused_unread_and_the_next_cell_still_runs():
    from distlab.grade.boundary import kernel_messages

    plain, capped = _run("plain"), _run("capped")
    # jupyter_client's own client holds the 100 MB (more, while it decodes it); the capped one
    # never holds the message: what is left is Python, jupyter_client and nbclient (~100 MB)
    assert plain["peak_mb"] > 200, plain["peak_mb"]
    assert capped["peak_mb"] < plain["peak_mb"] / 2 and capped["peak_mb"] < 150, (capped["peak_mb"], plain["peak_mb"])
    first, second = capped["outputs"]
    assert [o["text"] for o in first] == [kernel_messages.NOTE], first
    assert second == [{"output_type": "stream", "name": "stdout", "text": "after 42\n"}], second
    assert "more than the grader reads" not in json.dumps(plain["outputs"])


@pytest.mark.timeout(600)
def test_a_message_of_many_parts_each_under_the_cap_is_refused_whole_and_the_next_cell_still_runs():
    """The attack: ZeroMQ's cap is per part, and a message is handed over only once all its parts
    are in, so 40 parts of 4 MiB were 160 MiB held in the grader's process. The proxy in front
    of the kernel (kernel_proxy) counts a message's parts together and drops it as it comes."""
    from distlab.grade.boundary import kernel_messages

    capped, proxied = _run("capped", "many parts"), _run("proxied", "many parts")
    # with the per-part cap alone, the whole message reached the cell (and the grader's memory)
    assert capped["peak_mb"] > 200, capped["peak_mb"]
    assert {"output_type": "stream", "name": "stdout", "text": "many parts\n"} in capped["outputs"][0]
    # through the proxy: never held (Python, jupyter_client and nbclient: ~100 MB), and said in the cell
    assert proxied["peak_mb"] < capped["peak_mb"] / 2 and proxied["peak_mb"] < 150, (proxied["peak_mb"], capped["peak_mb"])
    first, second = proxied["outputs"]
    assert [o["text"] for o in first] == [kernel_messages.NOTE], first
    assert second == [{"output_type": "stream", "name": "stdout", "text": "after 42\n"}], second


@pytest.mark.timeout(600)
def test_ordinary_outputs_pass_the_proxy_whole_and_a_message_of_one_large_part_is_refused_there():
    """Through the proxy, output up to the cap arrives as the kernel sent it (a 4 MiB write, a
    display with several parts, 200 small messages), and one part over the cap is dropped by
    the proxy, without the connection the per-part cap used to drop (the cell's idle status
    arrives: no wait for it)."""
    from distlab.grade.boundary import kernel_messages

    proxied = _run("proxied", "ordinary")
    big, display, many, over = proxied["outputs"][:4]
    assert "".join(o["text"] for o in big) == "b" * (4 * 2**20), [len(o.get("text", "")) for o in big]
    assert display[0]["data"]["text/plain"] == "'shown'" and display[0]["data"]["text/html"] == "<b>shown</b>"
    assert "".join(o["text"] for o in many) == "".join(f"line {i}\n" for i in range(200))
    assert [o["text"] for o in over] == [kernel_messages.NOTE], over
    # nbclient waits 4 s (its iopub_timeout) for an idle status that never comes; it came
    assert proxied["seconds"][3] < 4, proxied["seconds"]


@pytest.mark.timeout(600)
def test_once_the_kernel_is_gone_no_cell_waits_to_connect_to_it_again():
    """grader/hostile/kill_kernel.py: the kernel died, its connections with it. The grader's
    channels connect again after a dropped connection (a refused message drops one), and the
    proxy waited for the kernel's sockets as if the kernel were still starting: each cell after
    the kernel's death waited RECONNECT_SECONDS per channel (40 s for the one cell here), and
    counted each dropped connection as a refused message (a false note in the cell; in a
    markdown cell, an invalid notebook). A kernel socket that worked once and now refuses
    means the kernel is gone: no wait, no note."""
    from distlab.grade.boundary import kernel_messages

    for mode in ("proxied", "capped"):   # through the proxy, as the grader runs; and straight to the kernel
        run = _run(mode, "killed")
        assert run["dead"] == [0], run
        assert run["outputs"][1] == [], run["outputs"]
        assert run["seconds"][1] < kernel_messages.RECONNECT_SECONDS / 2, (mode, run["seconds"])


@pytest.mark.timeout(600)
def test_a_cell_the_kernel_never_answers_costs_its_time_limit_not_a_wait_for_a_refusal_too():
    """grader/hostile/patch_builtins.py: the kernel cannot reply. Past the time limit nbclient
    makes the reply up and waits 4 s for output that never comes; the grader then waited
    LATE_REFUSAL_SECONDS (30 s) more for a refused message, which had had the whole time limit
    to arrive: it looks once, without waiting."""
    from distlab.grade.boundary import kernel_messages

    run = _run("proxied", "no answer")
    assert run["dead"] == [0], run
    assert kernel_messages.NOTE not in json.dumps(run["outputs"]), run["outputs"]
    # time limit + nbclient's iopub_timeout (4 s) + slack for a loaded machine, under the old 30 s more
    assert run["seconds"][0] < CELL_TIMEOUT_S["no answer"] + 4 + kernel_messages.LATE_REFUSAL_SECONDS / 2, run["seconds"]
