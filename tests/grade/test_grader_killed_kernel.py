"""A grader ended while its grading kernel starts or runs a cell leaves nothing of that kernel behind.

The kernel runs inside its sandbox (``bwrap``, then the kernel in the sandbox's own process
ids), which jupyter_client starts in a session of its own: a signal to the grader's process
group does not reach it. Here the grader grades a notebook whose answer cell sleeps in the
kernel (grader/hostile/hang_at_top_level.py, with a cell timeout longer than the test), and is
ended the ways a person ends it: SIGTERM or SIGINT to its process group (a terminal's Ctrl-C, a
test run's teardown), SIGKILL to the grade command alone (``kill -9``), SIGKILL or SIGTERM to the
nbgrader process between the grade command and the kernel, and SIGTERM to the
process group of a test process that started it as tests/grade/grading_support.py does; and
once more by SIGKILL while the kernel's sandbox is still on its way (the control group's shell
or the capped folders' launcher runs, bwrap has not yet asked to die with its parent). Each time
nbgrader and every process of the sandbox must be gone within :data:`BOUND_S`.

Before the sandbox had a keeper (distlab.grade.boundary.sandbox_keeper) the last case failed in both
runs: bwrap and the kernel inside it ran on, re-parented to init in a session of their own, as
one was found an hour after a test run was ended. The other cases passed: once bwrap runs, its
parent-death signal holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from grading_support import REPO, SLUG, Course, groups_left_by, hand_in
from process_support import descendants, named

sys.path.insert(0, str(REPO / "grader" / "hostile"))
import build as hostile  # noqa: E402

BOUND_S = 15.0
"""How long the sandbox may take to go. A process killed by its parent's death goes within
milliseconds; a grader that ends on SIGINT or SIGTERM may first ask its kernel to shut down,
which jupyter_client gives 5 s before it kills; the rest is for a loaded machine."""

TEST_PROCESS = "import sys; from process_support import run_in_own_group; run_in_own_group(sys.argv[1:], 900)"
"""A stand-in for the pytest process of tests/grade/test_hostile_rooms.py: it starts the grade
command through grading_support's own launcher (a guardian in a process group of its own)."""

ENDINGS = {
    "SIGTERM to the grader's process group": ("grader", "in a cell", lambda root, nbgrader: os.killpg(root, signal.SIGTERM)),
    "SIGINT to the grader's process group": ("grader", "in a cell", lambda root, nbgrader: os.killpg(root, signal.SIGINT)),
    "SIGKILL to the grader alone": ("grader", "in a cell", lambda root, nbgrader: os.kill(root, signal.SIGKILL)),
    "SIGKILL to nbgrader alone": ("grader", "in a cell", lambda root, nbgrader: os.kill(nbgrader, signal.SIGKILL)),
    "SIGTERM to nbgrader alone": ("grader", "in a cell", lambda root, nbgrader: os.kill(nbgrader, signal.SIGTERM)),
    "SIGTERM to a test process's group": ("test process", "in a cell",
                                          lambda root, nbgrader: os.killpg(root, signal.SIGTERM)),
    "SIGKILL to the grader as its kernel starts": ("grader", "starting",
                                                   lambda root, nbgrader: os.kill(root, signal.SIGKILL)),
}


def _sleeping(proc: psutil.Process) -> bool:
    """Whether a thread of ``proc`` is in a sleep call (the answer cell's ``time.sleep``)."""
    try:
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{task}/wchan") as wchan:
                if "nanosleep" in wchan.read():
                    return True
    except OSError:
        pass
    return False


def _kernel_launcher(root: int, deadline: float, ready) -> tuple[psutil.Process, list[psutil.Process]]:
    """nbgrader's child that runs the grading kernel (the sandbox, and whatever the grader puts in
    front of it), below ``root``, and what runs below it, once ``ready(below)`` holds."""
    while True:
        assert psutil.pid_exists(root), "the grade command ended before its kernel got where the test ends it"
        assert time.monotonic() < deadline, "no grading kernel got where the test ends it within 240 s"
        for nbgrader in named(descendants(root), "distlab.grade.pipeline.nbgrader_app"):
            for launcher in named(nbgrader.children(), "distlab.grade.boundary.kernel"):
                below = descendants(launcher.pid)
                if ready(below):
                    return launcher, below
        time.sleep(0.005)


WHEN = {
    "starting": lambda below: not below,   # nothing started below it yet: the sandbox is on its way
    "in a cell": lambda below: any(_sleeping(proc) for proc in below),
}


def _left(started: list[psutil.Process], group: int) -> list[psutil.Process]:
    """What is still running of ``started`` and of the process group ``group``."""
    _, alive = psutil.wait_procs(started, timeout=BOUND_S)
    in_group = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == group and proc.status() != psutil.STATUS_ZOMBIE:
                in_group.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return list({proc.pid: proc for proc in alive + in_group}.values())


def _describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"{proc.pid} (parent {proc.ppid()}, session {os.getsid(proc.pid)}) "
                         f"{' '.join(proc.cmdline())[-160:]}")
        except (psutil.Error, ProcessLookupError):
            continue
    return "; ".join(lines)


def _end_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_grader_ended_mid_cell_takes_its_kernel_sandbox_with_it(tmp_path, ending):
    launched_by, when, end = ENDINGS[ending]
    course = Course(tmp_path / "work")
    hand_in(course, {"sleeper": hostile.specs()["hang_at_top_level"]})
    command = [sys.executable, "-m", "distlab.grade", "autograde", SLUG, "--Execute.timeout=900"]
    env = course.env()
    if launched_by == "test process":
        command = [sys.executable, "-c", TEST_PROCESS, *command]
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "runtime"), env.get("PYTHONPATH", "")])
    root = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    started: list[psutil.Process] = []
    try:
        launcher, below = _kernel_launcher(root.pid, time.monotonic() + 240, WHEN[when])
        nbgrader = launcher.parent()
        started = [nbgrader, launcher, *below]
        group = os.getpgid(launcher.pid)
        end(root.pid, nbgrader.pid)
        if when == "starting":   # what the sandbox starts after the grader is gone
            time.sleep(BOUND_S)
            started += descendants(launcher.pid)
        left = _left(started, group)
        assert not left, f"still running {BOUND_S:g} s after {ending}: {_describe(left)}"
    finally:
        _end_all(started + descendants(root.pid))
        if root.poll() is None:
            root.kill()
        root.wait(timeout=30)
    left_groups = groups_left_by(nbgrader.pid)
    assert not left_groups, f"the ended grader's control groups outlived it: {left_groups}"
