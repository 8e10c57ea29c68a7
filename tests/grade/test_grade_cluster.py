"""Grading a class on the private two-node Slurm cluster (`autograde --slurm`, distlab.grade.course.cluster).

Real components only: Debian's Slurm (scripts/slurm_cluster.py), Debian's PostgreSQL for the
gradebook (scripts/postgres_server.py), submitit submitting the job array, and in every job
the grader of one machine (kernel, clean room, sandbox).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from grading_support import REPO, SLUG, Course, fresh_dir, solution_answers, with_answers
from test_grading import PARTIAL_ANSWERS, POINTS
from test_slurm import _client, _job_processes

from distlab.grade.course import cluster as grade_cluster

sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "grader" / "hostile"))
import build as hostile  # noqa: E402
import postgres_server  # noqa: E402
import slurm_cluster  # noqa: E402

SLURM = ("--slurm", "--cpus", "1", "--mem", "2048", "--time", "10")
"""What each job asks for here: the private nodes have 2 cores each (the same 2 of this machine)."""
HOSTILE = ("write_gradebook", "kill_parents", "malformed_notebook")
"""Three hostile submissions that end quickly (those that hang are test_hostile's); the malformed
one cannot be graded at all, on the cluster as on one machine: it fails twice and is named."""
MALFORMED = "hostile-2"


def _squeue(*args: str) -> list[str]:
    return _client(["squeue", "--noheader", *args]).split("\n")[:-1]


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: slurmstepd's socket paths must fit 107 bytes
    try:
        with slurm_cluster.running_cluster(root / "cluster") as info:
            with pytest.MonkeyPatch.context() as mp:
                for name in list(os.environ):
                    if name.startswith(("SLURM_", "DISTLAB_SLURM_")):
                        mp.delenv(name)
                mp.setenv("SLURM_CONF", info["slurm_conf"])
                yield info
    except slurm_cluster.ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def postgres(cluster):
    """The gradebook server, where the nodes reach this machine: on the namespaced cluster the
    controller's address on the bridge (a job's 127.0.0.1 is its own node)."""
    network = cluster["network"]
    address = network["controller_address"]
    clients = network.get("subnet")
    with postgres_server.running_postgres(Path(tempfile.mkdtemp(prefix="distlab-pg-", dir="/tmp")),
                                          address=address, clients=clients) as server:
        yield server


def database(server, name: str) -> str:
    """A fresh database on the server; its URL."""
    with server.connect() as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + "/" + name


def submissions_per_student(server, url: str) -> dict:
    with server.connect(database=url.rsplit("/", 1)[1]) as connection:
        rows = connection.execute("SELECT student_id, count(*) FROM submitted_assignment GROUP BY student_id").fetchall()
    return dict(rows)


@pytest.fixture(scope="module")
def class_of_twelve(cluster, postgres, tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-class")
    url = database(postgres, "class12")
    course = Course(root / "work", db_url=url)
    release = course.release()
    incoming = fresh_dir(root / "incoming")
    correct = solution_answers(SLUG)
    expected = {}
    specs = hostile.specs()
    for i in range(3):
        course.submit(incoming, f"correct-{i}", with_answers(release, correct))
        expected[f"correct-{i}"] = dict(POINTS)
        course.submit(incoming, f"blank-{i}", release.read_bytes())
        expected[f"blank-{i}"] = {cell: 0.0 for cell in POINTS}
        course.submit(incoming, f"partial-{i}", with_answers(release, {**correct, **PARTIAL_ANSWERS}))
        expected[f"partial-{i}"] = {**{cell: 0.0 for cell in POINTS}, "task1-tests": 1.0}
        name = HOSTILE[i]
        course.submit(incoming, f"hostile-{i}", hostile.build(specs[name], str(release)))
        expected[f"hostile-{i}"] = hostile.expected_scores(specs[name])
    assert course.grade("collect", SLUG, "--from", str(incoming)).returncode == 0, course.log
    # Graded as an instructor would, except that one array task is cancelled while it grades.
    log = root / "autograde.log"
    run = start_grading(course, log)
    try:
        running = _wait_for_running(run, log)
        time.sleep(3)  # mid-grade: its kernel or clean room is at work
        subprocess.run(["scancel", running[0]], check=True, timeout=15)
        run.wait(timeout=1500)
    finally:
        _end(run)
    return {"course": course, "code": run.returncode, "output": log.read_text(), "expected": expected, "url": url,
            "cancelled": running[0]}


def start_grading(course: Course, log: Path, *args: str) -> subprocess.Popen:
    """``autograde SLUG --slurm ARGS`` in a process group of its own, its output into ``log``."""
    def as_in_a_terminal():
        # A command started from a terminal gets Ctrl-C; one started in the background of a
        # script (this test run, launched with `&`) inherits SIGINT ignored: undo that.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "distlab.grade", "autograde", SLUG, *SLURM, *args], cwd=REPO,
                                env=course.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=as_in_a_terminal)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_class_graded_on_the_cluster_scores_cell_by_cell_as_on_one_machine(class_of_twelve, cluster, postgres):
    """The expected scores are the ones serial grading gives these submissions (test_grading,
    test_gradebook_server and test_hostile check those on one machine)."""
    course, output = class_of_twelve["course"], class_of_twelve["output"]
    assert class_of_twelve["code"] == 1, output[-8000:]  # one student could not be graded
    scores = {student: {cell: float(score or 0.0) for cell, score in cells.items()}  # not graded: 0
              for student, cells in course.scores().items()}
    expected = class_of_twelve["expected"]
    assert {s: scores.get(s, dict.fromkeys(POINTS, 0.0)) for s in expected} == expected, output[-8000:]
    assert "11 graded, 1 not graded" in output
    # Both nodes graded, and wrote to the gradebook server at the address they reach it by.
    assert {"distlab-n1", "distlab-n2"} <= set(re.findall(r"s on (distlab-n[12])\)", output)), output[-3000:]
    assert "loopback address" not in output
    assert re.search(rf"{MALFORMED} NOT GRADED \(scores 0 on the cells not graded\), twice: .*not appear to be JSON",
                     output), output[-3000:]
    assert f"{MALFORMED}: not graded (" in output
    # the cancelled task: its student was graded again, and counts like the others. Where the
    # cluster tracks a job's processes by control group, scancel's signal reaches every one of
    # them, submitit's own included, and the job leaves no result; by session (linuxproc) it
    # reaches the grader, which reports the signal.
    tracked_by_cgroup = "ProctrackType=proctrack/cgroup" in Path(cluster["slurm_conf"]).read_text()
    why = (r"ended CANCELLED without a result \(log: [^)]+\)" if tracked_by_cgroup
           else r"ended CANCELLED: the grader was killed by SIGTERM on distlab-n[12]")
    assert re.search(rf"not graded \(its job {class_of_twelve['cancelled']} {why}\); trying once more",
                     output), output[-3000:]
    for student in expected:  # each score printed as it landed
        if student != MALFORMED:
            assert re.search(rf"  {student}: [0-9.]+ / 6 \([0-9.]+ s on distlab-n[12]\)", output), student
    assert "done=11, failed=1" in output  # the progress bar's last state
    jobs = course.work / "slurm" / SLUG
    logs = list(jobs.glob("*/*_log.out"))
    assert len(logs) >= 13  # every job's log stays (12, one retried, one twice)
    assert not [log for log in logs if "Warning" in log.read_text(errors="replace")]  # submitit's pkg_resources
    assert not list(jobs.rglob("*_submitted.pkl"))  # the pickled calls, with the database password, do not
    assert set(submissions_per_student(postgres, class_of_twelve["url"]).values()) <= {1}
    assert _job_processes(cluster) == []
    assert _squeue() == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_cancels_every_job_of_the_run_and_graded_students_keep_their_grades(class_of_twelve, cluster,
                                                                                     postgres, tmp_path):
    course = class_of_twelve["course"]
    before = course.scores()
    log = tmp_path / "interrupted.log"
    students = ["correct-0", "correct-1", "blank-0", "partial-0"]
    run = start_grading(course, log, "--regrade", *(f"--student={s}" for s in students))
    try:
        _wait_for_running(run, log)
        run.send_signal(signal.SIGINT)  # what Ctrl-C in the instructor's terminal sends
        assert run.wait(timeout=300) == 130, log.read_text()[-6000:]
    finally:
        _end(run)
    text = log.read_text()
    assert "interrupted: cancelling" in text and re.search(r"cancelled; the \d+ students graded so far", text), text[-4000:]
    assert _squeue() == []
    assert _job_processes(cluster) == []
    assert course.scores() == before  # a regrade cut short leaves the previous grades, whole
    assert set(submissions_per_student(postgres, class_of_twelve["url"]).values()) <= {1}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_running_it_again_grades_only_who_is_missing(class_of_twelve, postgres):
    course = class_of_twelve["course"]
    again = course.grade("autograde", SLUG, *SLURM)
    assert "11 of 12 students already graded; grading the other 1" in again.stdout, course.log[-3000:]
    assert f"{MALFORMED} NOT GRADED" in again.stdout and "0 graded, 1 not graded" in again.stdout
    assert set(submissions_per_student(postgres, class_of_twelve["url"]).values()) <= {1}
    assert _squeue() == []


def _wait_for_running(proc: subprocess.Popen, log: Path, timeout: float = 300) -> list[str]:
    """The ids of this run's array tasks once one of them runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        running = [line.split()[0] for line in _squeue("--array", "--states=RUNNING", "--format=%i %j")
                   if f"grade-{SLUG}" in line]
        if running:
            return running
        time.sleep(0.5)
    raise AssertionError("no grading job started:\n" + log.read_text()[-4000:])


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_an_sqlite_gradebook_is_refused_at_once_with_how_to_set_the_server(tmp_path):
    course = Course(tmp_path / "work")
    done = course.grade("autograde", SLUG, "--slurm")  # refused before anything else, release included
    assert done.returncode == 2
    assert "the gradebook is an sqlite file" in done.stdout and "DISTLAB_GRADE_DB_URL" in done.stdout
    assert "Grading on the cluster" in done.stdout


def test_a_gradebook_named_by_a_loopback_address_is_a_warning_that_says_why(monkeypatch):
    """Each node has a 127.0.0.1 of its own: the jobs would dial themselves, not the server."""
    said = []
    for url, warned in (("postgresql+psycopg://u:secret@127.0.0.1:5432/g", True),
                        ("postgresql+psycopg://u:secret@localhost:5432/g", True),
                        ("postgresql+psycopg://u:secret@198.18.7.1:5432/g", False)):
        said.clear()
        monkeypatch.setattr(grade_cluster.config, "db_url", lambda url=url: url)
        assert grade_cluster.gradebook_is_shared(SLUG, said.append)
        assert any("is a loopback address" in line and "cluster's network" in line for line in said) == warned, said
        assert not any("secret" in line for line in said)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jobs_slurm_cannot_run_are_one_line_saying_what_to_check(class_of_twelve):
    """The nodes have 2 cores; the default --cpus 4 (one per rank) is more than any has."""
    course = class_of_twelve["course"]
    refused = course.grade("autograde", SLUG, "--slurm", "--regrade", "--student", "correct-0")
    assert refused.returncode == 2, course.log[-3000:]
    assert re.search(r"Slurm refused the jobs \(.*Requested node configuration is not available.*\); check --partition, "
                     r"--cpus", refused.stdout), refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    assert _squeue() == []
