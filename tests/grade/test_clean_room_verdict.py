"""A clean room's verdict counts only if the clean room exited with status 0.

That is the grader's last defence against a forged verdict (CleanRoomTests.run_clean_room): a
clean room that student code got to (killed, or made to exit early) may have written anything
on its verdict pipe first. grader/hostile/forge_verdict.py no longer reaches it, because each
graded rank has process ids of its own and cannot find the clean room to kill it; so here the
clean room itself is the forger: a stand-in, run by the real run_clean_room inside the real
sandbox and keeper, that writes "every test passed" on the verdict pipe and then exits with a
code, or kills itself. Exit 0 is the control: the same verdict, taken as it is, so the other
cases fail because of the exit status alone.
"""

from __future__ import annotations

import sys

import pytest

from distlab.grade.pipeline.nbplugins import CleanRoomTests

TESTS = ("task1-tests", "task2-tests")

FORGER = r"""
import json, os, signal, sys
verdict = {test: {"passed": True, "outputs": [], "seconds": 0} for test in sys.argv[3:]}
with os.fdopen(int(sys.argv[1]), "w") as pipe:
    json.dump(verdict, pipe)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[2]))
"""


class ForgingCleanRoom(CleanRoomTests):
    """Runs the forger instead of distlab.grade.boundary.cleanroom (everything around it is the grader's)."""

    ending = "0"

    def clean_room_command(self, verdict_fd: int) -> list[str]:
        return [sys.executable, "-c", FORGER, str(verdict_fd), self.ending, *TESTS]


def _run(ending: str) -> tuple[dict, str | None]:
    room = ForgingCleanRoom(test_timeout_s=30)
    room.ending = ending
    job = {"cells": [], "trusted_cells": [], "test_cells": [{"grade_id": t, "source": ""} for t in TESTS]}
    return room.run_clean_room(job, len(TESTS))


def test_a_clean_room_that_exits_0_has_its_verdict_taken():
    verdicts, problem = _run("0")
    assert problem is None
    assert sorted(verdicts) == sorted(TESTS) and all(v["passed"] for v in verdicts.values())


@pytest.mark.parametrize(("ending", "said"), [("3", "code 3"), ("1", "code 1"),
                                              ("killed", "code 137")])   # bwrap: 128 + the signal
def test_a_passing_verdict_from_a_clean_room_that_did_not_exit_0_does_not_count(ending, said):
    verdicts, problem = _run(ending)
    assert verdicts == {}, f"a clean room that ended '{ending}' had its forged verdict taken: {verdicts}"
    assert problem is not None and said in problem and "does not count" in problem, problem
