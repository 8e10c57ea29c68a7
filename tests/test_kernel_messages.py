"""A kernel's message over the grader's cap is refused unread (distlab.grade.kernel_messages).

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

RUN = r'''
import json, sys
import nbformat
from nbconvert.preprocessors import ExecutePreprocessor
from distlab.grade import kernel_messages
from distlab.grade.kernel_sockets import PrivateSocketsKernelManager

capped = sys.argv[1] == "capped"

class Manager(PrivateSocketsKernelManager):
    def __init__(self, **kw):
        super().__init__(**kw)
        if capped:
            self.client_factory = kernel_messages.CappedKernelClient

class Execute(ExecutePreprocessor):   # as distlab.grade.nbplugins.KernelExecute (an nbgrader Execute)
    def preprocess_cell(self, cell, resources, index):
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except Exception as exc:
            if not kernel_messages.only_output_lost(exc, cell, self.kc):
                raise
            return cell, resources
        kernel_messages.explain(cell, self.kc)
        return cell, resources

nb = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell('import sys\nsys.stdout.write("m" * (100 * 2**20))\nsys.stdout.flush()'),
    nbformat.v4.new_code_cell('print("after", 6 * 7)')])
Execute(kernel_manager_class=Manager, timeout=120, kernel_name="python3",
        raise_on_iopub_timeout=True).preprocess(nb, {})   # nbgrader's setting
peak_kib = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
print(json.dumps({"peak_mb": peak_kib / 1024, "outputs": [c.outputs for c in nb.cells]}))
'''


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_a_message_of_100_mb_is_refused_unread_and_the_next_cell_still_runs():
    from distlab.grade import kernel_messages

    plain, capped = _run("plain"), _run("capped")
    # jupyter_client's own client holds the 100 MB (more, while it decodes it); the capped one
    # never holds the message: what is left is Python, jupyter_client and nbclient (~100 MB)
    assert plain["peak_mb"] > 200, plain["peak_mb"]
    assert capped["peak_mb"] < plain["peak_mb"] / 2 and capped["peak_mb"] < 150, (capped["peak_mb"], plain["peak_mb"])
    first, second = capped["outputs"]
    assert [o["text"] for o in first] == [kernel_messages.NOTE], first
    assert second == [{"output_type": "stream", "name": "stdout", "text": "after 42\n"}], second
    assert "more than the grader reads" not in json.dumps(plain["outputs"])
