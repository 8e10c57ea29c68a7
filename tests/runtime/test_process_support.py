"""The tests' own process handling: what a test starts ends with it, even when it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from process_support import alive_with_marker


def _with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_a_command_run_in_its_own_group_ends_with_a_killed_test_process():
    """`make book` under a test killed by SIGTERM (CI's limit, `timeout`): no `finally` runs in
    the test process, and the build's grandchildren once built on for twenty minutes."""
    marker = f"distlab-guardian-test-{os.getpid()}"
    grandchild = f"import subprocess, sys; subprocess.call([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])"
    test_process = subprocess.Popen([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from process_support import run_in_own_group\n"
        f"run_in_own_group([sys.executable, '-c', {grandchild!r}, {marker!r}], timeout=300)\n")])
    try:
        deadline = time.monotonic() + 30
        # The process the command started (a command line holding the marker and the sleep).
        while not [p for p in _with_marker(marker) if "time.sleep(300)" in " ".join(p.cmdline())
                   and "subprocess" not in " ".join(p.cmdline())]:
            assert time.monotonic() < deadline, "the command did not start its process"
            time.sleep(0.1)
        test_process.send_signal(signal.SIGTERM)
        test_process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [" ".join(p.cmdline()) for p in _with_marker(marker)]
        assert not left, f"outlived the killed test process: {left}"
    finally:
        if test_process.poll() is None:
            test_process.kill()
            test_process.wait()
        alive_with_marker(marker)
