"""A grader killed mid-autograde leaves nothing behind: nbgrader, its clean room and the clean
room's ranks end within 5 s (each dies with its parent, instead of grading on unseen)."""

from __future__ import annotations

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


def _ranks(procs) -> list[psutil.Process]:
    """The rank processes among ``procs``: torchrun's run the worker module; the fork
    launcher's (the clean room's) are forked from their agent, without an exec, and name
    themselves ``distlab-rank<k>``."""
    found = []
    for proc in procs:
        try:
            if "distlab.runtime.worker" in " ".join(proc.cmdline()) or proc.name().startswith("distlab-rank"):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killing_the_grade_command_mid_test_ends_nbgrader_its_clean_room_and_ranks(tmp_path):
    course = Course(tmp_path / "work")
    hand_in(course, {"looper": hostile.specs()["infinite_loop"]})  # task 1 never returns: the kill lands mid-test
    grader = subprocess.Popen([sys.executable, "-m", "distlab.grade", "autograde", SLUG], cwd=REPO,
                              env=course.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        ranks: list[psutil.Process] = []
        while not ranks:
            assert grader.poll() is None, "the autograde ended before its clean room started ranks"
            assert time.monotonic() < deadline, "no clean room with ranks appeared within 180 s"
            rooms = named(descendants(grader.pid), "distlab.grade.boundary.cleanroom")
            ranks = [p for room in rooms for p in _ranks(descendants(room.pid))]
            time.sleep(0.2)
        room = rooms[0]
        nbgrader = room.parent()
        assert "nbgrader" in " ".join(nbgrader.cmdline())
        started = [nbgrader, room] + descendants(room.pid)
        # As `kill -9` or a closed terminal would: the command the instructor started, alone.
        # (Before nbgrader died with it, nbgrader, its clean room and its ranks graded on.)
        psutil.Process(grader.pid).send_signal(signal.SIGKILL)
        gone, alive = psutil.wait_procs(started, timeout=5)
        assert not alive, "still running 5 s after the grade command was killed: " + "; ".join(
            f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running())
    finally:
        for proc in descendants(grader.pid):
            try:
                proc.kill()
            except psutil.Error:
                pass
        if grader.poll() is None:
            grader.kill()
        grader.wait(timeout=30)
    left = groups_left_by(nbgrader.pid)
    assert not left, f"the killed grader's control groups outlived it: {left}"
