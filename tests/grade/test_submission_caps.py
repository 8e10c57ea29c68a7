"""Caps on a whole submission at once (src/distlab/grade/boundary/cgroups.py): one control group for the
kernel and its ranks, one for the clean room and its ranks.

Per-process caps alone let a submission hold many times a process's cap (every process it
starts inherits its own), and count processes but not threads. The attacks here stay under
every per-process cap and are sized to be harmless on this 24 GiB machine if the group failed
(1 GB on each of four ranks; 3000 small threads); the grader runs with small group caps so
that they cross them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from grading_support import REPO, SLUG, Course, hand_in, honest_spec, hostile_builder, hostile_specs, hostile_student

from distlab.grade.boundary import cgroups

hostile = hostile_builder()
CAPS = hostile_specs("caps")
MEMORY_MB, TASKS, CPU_S = 2048, 512, 20
"""The caps the class is graded with: an honest chapter-0 notebook's clean room (four ranks)
holds about 1.2 GiB at its peak, its kernel less (the grader logs both, "held at most"). Its
kernel uses about 2 CPU-seconds with its ranks, its clean room 3 to 6, and the clean room of
``memory_in_many_ranks`` 9 (the log's "used ... CPU-s")."""
CELL_TIMEOUT_S = 300
"""Long enough for ``cpu_in_many_ranks``'s 32 CPU-seconds on a loaded 2-core machine, so that
what stops it is the CPU cap and not the cell's time limit."""


def test_this_machine_can_make_control_groups():
    # CI and this project's test machine run as root with cgroup v1's memory and pids
    # controllers: the caps below are tested for real there, never assumed.
    assert cgroups.available() is None, cgroups.available()


def test_a_group_ends_what_holds_too_much_refuses_tasks_past_its_cap_and_leaves_nothing():
    hold = "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(range(0, len(b), 4096)); print('held')"
    forks = ("import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
             "            os.close(1)\n            os.close(2)\n            time.sleep(30)\n            os._exit(0)\n"
             "        n += 1\n"
             "except OSError as error:\n    print('refused after', n)\n")
    with cgroups.SubmissionGroup("unit-test", memory_mb=200, tasks=40) as group:
        folders = list(group.folders)
        big = subprocess.run(group.wrap([sys.executable, "-c", hold]), capture_output=True, text=True, timeout=60)
        assert big.returncode == -9 and "held" not in big.stdout
        assert group.out_of_memory_kills() >= 1
        small = subprocess.run(group.wrap([sys.executable, "-c", "print('fits')"]), capture_output=True,
                               text=True, timeout=60)
        assert small.returncode == 0 and "fits" in small.stdout
        many = subprocess.run(group.wrap([sys.executable, "-c", forks]), capture_output=True, text=True, timeout=60)
        assert "refused after" in many.stdout, many.stdout + many.stderr
        assert len(group.pids()) >= 30, "the forked sleepers (their output closed) are still in the group"
    assert not any(folder.exists() for folder in folders), "the group outlived its block"


BURN = "import time\nwhile time.process_time() < 20:\n    pass\nprint('burned 20 s')"
"""A process that uses 20 s of CPU, far under a rank's own cap (600)."""


def test_a_group_ends_all_its_processes_once_together_they_used_its_cpu_time():
    with cgroups.SubmissionGroup("unit-test-cpu", memory_mb=500, tasks=40, cpu_s=4) as group:
        short = subprocess.run(group.wrap([sys.executable, "-c", "import time\nwhile time.process_time() < 1: pass"]),
                               timeout=60)
        assert short.returncode == 0 and not group.cpu_cap_reached
        assert group.cpu_seconds() >= 1.0, "the time of an ended process still counts"
        burners = [subprocess.Popen(group.wrap([sys.executable, "-c", BURN]), stdout=subprocess.PIPE, text=True)
                   for _ in range(3)]
        outputs = [burner.communicate(timeout=120)[0] for burner in burners]
        assert [burner.returncode for burner in burners] == [-9, -9, -9], outputs
        assert group.cpu_cap_reached and "burned" not in "".join(outputs)
        # Checked a few times a second: three busy processes overshoot by about 3/4 s at most
        # (a loaded machine runs them slower, so less).
        assert 4.0 < group.cpu_seconds() < 6.0, group.cpu_seconds()
    with cgroups.SubmissionGroup("unit-test-cpu-free", memory_mb=500, tasks=40, cpu_s=None) as free:
        done = subprocess.run(free.wrap([sys.executable, "-c", "import time\nwhile time.process_time() < 1: pass"]),
                              timeout=60)
        assert done.returncode == 0 and not free.cpu_cap_reached


DELEGATED_PROBE = r"""
import json, subprocess, sys
from distlab.grade.boundary import cgroups
why_not = cgroups.available()
found = {"why_not": why_not}
if why_not is None:
    hold = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(range(0, len(b), 4096)); print('held')"
    with cgroups.SubmissionGroup("delegated", memory_mb=100, tasks=64) as group:
        done = subprocess.run(group.wrap([sys.executable, "-c", hold]), capture_output=True, text=True, timeout=60)
        found.update(returncode=done.returncode, stdout=done.stdout, kills=group.out_of_memory_kills(),
                     folders=[str(f) for f in group.folders])
    burn = "import time\nwhile time.process_time() < 20:\n    pass"
    with cgroups.SubmissionGroup("delegated-cpu", memory_mb=100, tasks=64, cpu_s=1) as group:
        done = subprocess.run(group.wrap([sys.executable, "-c", burn]), capture_output=True, text=True, timeout=60)
        found.update(cpu_returncode=done.returncode, cpu_cap_reached=group.cpu_cap_reached)
print("FOUND " + json.dumps(found))
"""


@pytest.mark.timeout(300)
def test_an_account_root_delegated_groups_to_caps_its_submissions_without_root():
    """The grading commands run as the instructor's account, not root (hub/instructor_account.py),
    and only root may make control groups where the system put none for that account: without a
    delegated group the instructor's grading has per-process caps alone. Root delegates one
    (cgroups.delegate, as `make hub` does for its instructor), and the same account's grader then
    caps a submission: a process past the cap is ended."""
    sys.path.insert(0, str(REPO / "hub"))
    import instructor_account

    account = "nobody"
    run_dir = Path(tempfile.mkdtemp(prefix="dlcg-", dir="/tmp"))   # the account reaches the Python made there
    os.chmod(run_dir, 0o755)
    python, variables = instructor_account.runnable_python(Path(sys.prefix), run_dir)

    def probe(extra: dict) -> dict:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", **variables, "PYTHONPATH": str(REPO / "src"), **extra}
        done = subprocess.run([instructor_account.RUNUSER, "-u", account, "--", "env", "-i",
                               *[f"{k}={v}" for k, v in env.items()], str(python), "-c", DELEGATED_PROBE],
                              capture_output=True, text=True, timeout=120, cwd="/tmp")
        line = [line for line in done.stdout.splitlines() if line.startswith("FOUND ")]
        assert line, done.stdout[-2000:] + done.stderr[-2000:]
        return json.loads(line[0][len("FOUND "):])

    assert "may not create control groups" in probe({})["why_not"]
    folders = cgroups.delegate(account, f"distlab-grading-test-{os.getpid()}")
    try:
        assert folders, "this machine offers control groups (test_this_machine_can_make_control_groups)"
        found = probe({cgroups.PARENTS_VARIABLE: os.pathsep.join(map(str, folders))})
        assert found["why_not"] is None, found
        assert found["returncode"] == -9 and "held" not in found["stdout"] and found["kills"] >= 1, found
        assert found["cpu_returncode"] == -9 and found["cpu_cap_reached"], found
        assert all(any(f.startswith(str(d) + "/") for d in folders) for f in found["folders"]), found
    finally:
        cgroups.undelegate(folders)
        shutil.rmtree(run_dir, ignore_errors=True)
    assert not any(folder.exists() for folder in folders), "undelegate left a group behind"


def test_groups_left_by_a_killed_grader_are_removed_by_the_next_one_and_no_live_graders():
    dead = subprocess.Popen(["true"])
    dead.wait()
    roots = cgroups.group_roots()
    left = [root / f"{cgroups.PREFIX}-{dead.pid}-1-killed-grader" for root in roots]
    alive = [root / f"{cgroups.PREFIX}-{os.getpid()}-1-this-grader" for root in roots]
    for folder in left + alive:
        folder.mkdir()
    try:
        with cgroups.SubmissionGroup("next", memory_mb=100, tasks=10):
            pass
        assert not any(folder.exists() for folder in left)
        assert all(folder.exists() for folder in alive)
    finally:
        for folder in alive + left:
            if folder.exists():
                folder.rmdir()
        cgroups.remove_groups_of_dead_graders(roots)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_submissions_processes_are_capped_together_and_honest_students_are_not(tmp_path):
    course = Course(tmp_path / "work")
    hand_in(course, {"aa-control": honest_spec(), **{hostile_student(name): spec for name, spec in CAPS.items()}})
    graded = course.grade("autograde", SLUG, f"--SubmissionCaps.memory_mb={MEMORY_MB}",
                          f"--SubmissionCaps.tasks={TASKS}", f"--SubmissionCaps.cpu_s={CPU_S}",
                          f"--Execute.timeout={CELL_TIMEOUT_S}")
    assert graded.returncode == 0, course.log[-4000:]
    log = graded.stdout + graded.stderr
    assert "reached its memory cap" in log, log[-4000:]
    assert "reached its CPU cap" in log, log[-4000:]
    scores = course.scores()
    full = {cell: float(points) for cell, points in hostile.POINTS.items()}
    assert scores["aa-control"] == full, scores
    for name, spec in CAPS.items():
        student = hostile_student(name)
        assert scores[student] == hostile.expected_scores(spec), (name, scores[student])
        printed = outputs(next((course.work / "autograded" / student).rglob("*.ipynb")))
        for expected in spec.OUTPUT_CONTAINS:
            assert expected in printed, (name, expected, printed[-2000:])
        for absent in getattr(spec, "OUTPUT_LACKS", []):
            assert absent not in printed, (name, absent)
    # This grading's groups only (their names carry the student): another test's grader, killed
    # on purpose (test_grader_killed), leaves its groups for the next grader to sweep.
    students = ("aa-control", *(hostile_student(name) for name in CAPS))
    left = [p for p in cgroups.ROOT.glob(f"*/**/{cgroups.PREFIX}-*")
            if p.is_dir() and any(f"-{student}-" in p.name for student in students)]
    assert not left, f"a group was left behind: {left}"


def outputs(notebook) -> str:
    """What a graded notebook's cells printed (not their source, which names what they test for)."""
    text = []
    for cell in nbformat.read(notebook, as_version=4).cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", "") + output.get("evalue", "") + str(output.get("data", "")))
    return "\n".join(text)
