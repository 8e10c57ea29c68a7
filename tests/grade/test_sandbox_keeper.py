"""The sandbox's keeper (distlab.grade.boundary.sandbox_keeper), on its own: it ends as its command
ended, and when its grader lets go or dies (SIGKILL included) everything below it goes, a
process that left for a session of its own too. The grading tests take it through nbgrader
(test_grader_killed_kernel); these take seconds."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest
from process_support import descendants

from distlab.grade.boundary import sandbox_keeper

BOUND_S = 5.0
"""A SIGKILLed process goes within milliseconds; the rest is for a loaded machine."""

DETACHED = "setsid sleep 1000 & exec sleep 1000"
"""A command with a process that leaves its session (as torchrun's workers do) and one that stays."""


def _keep(command: list[str]) -> tuple[subprocess.Popen, sandbox_keeper.Leash]:
    leash = sandbox_keeper.Leash()
    try:
        proc = subprocess.Popen(sandbox_keeper.wrap(command, leash.read_fd), start_new_session=True,
                                **leash.popen_options())
    finally:
        leash.started()
    return proc, leash


def _below_once_started(proc: subprocess.Popen, count: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while len(below := descendants(proc.pid)) < count:
        assert time.monotonic() < deadline, f"the keeper's command did not start {count} processes within 60 s"
        time.sleep(0.05)
    return below


@pytest.mark.parametrize(("command", "ended"), [("exit 3", 3), ("kill -KILL $$", -9), ("kill -TERM $$", -15)])
def test_the_keeper_ends_as_its_command_ended(command, ended):
    proc, leash = _keep(["sh", "-c", command])
    try:
        assert proc.wait(timeout=60) == ended
    finally:
        leash.close()


def test_when_the_grader_lets_go_everything_below_the_keeper_goes():
    proc, leash = _keep(["sh", "-c", DETACHED])
    below = _below_once_started(proc, 2)
    leash.close()
    _, alive = psutil.wait_procs(below + [psutil.Process(proc.pid)], timeout=BOUND_S)
    assert not alive, f"still running {BOUND_S:g} s after the grader let go: {alive}"
    proc.wait(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_keeper_ended_by_a_signal_ends_its_command_first_and_dies_by_that_signal(sig):
    proc, leash = _keep(["sh", "-c", DETACHED])
    try:
        below = _below_once_started(proc, 2)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
        _, alive = psutil.wait_procs(below, timeout=BOUND_S)
        assert not alive, f"still running {BOUND_S:g} s after its keeper got signal {sig}: {alive}"
    finally:
        leash.close()


GRADER = f"""
import subprocess, sys, time
from distlab.grade.boundary import sandbox_keeper
leash = sandbox_keeper.Leash()
subprocess.Popen(sandbox_keeper.wrap(["sh", "-c", {DETACHED!r}], leash.read_fd), start_new_session=True,
                 **leash.popen_options())
leash.started()
time.sleep(1000)
"""


def test_a_grader_killed_by_sigkill_takes_everything_below_its_keeper_with_it():
    grader = subprocess.Popen([sys.executable, "-c", GRADER])
    below: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(below := descendants(grader.pid)) < 3:   # the keeper and its two sleeps
            assert time.monotonic() < deadline, "the stand-in grader's keeper did not start its command within 60 s"
            time.sleep(0.05)
        grader.kill()   # no handler of the grader's runs: only the pipe's end tells the keeper
        _, alive = psutil.wait_procs(below, timeout=BOUND_S)
        assert not alive, f"still running {BOUND_S:g} s after the grader was killed: {alive}"
    finally:
        for proc in below + descendants(grader.pid):
            try:
                proc.kill()
            except psutil.Error:
                pass
        grader.kill()
        grader.wait(timeout=10)
