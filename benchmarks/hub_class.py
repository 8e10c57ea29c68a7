"""A whole class at a deadline, on the course hub: can it take them all at once?

    python benchmarks/hub_class.py                  # 30 students (as root, like `make hub`)
    python benchmarks/hub_class.py --students 7     # tests/hub/test_hub_class.py runs 3

What happens, as it would in a lab session that ends with a hand-in:

1. **The course comes up**: hub/demo.py's ``course_hub`` (course prefix ``dlk``) with a private
   Slurm cluster sized for the class (every student can hold a server of the default profile
   at the same time, odd classes included: servers are dealt out to the nodes whole; see
   ``demo.cpus_per_node_for``), and a PostgreSQL gradebook, because
   ``autograde --slurm`` writes scores from many jobs at once (scripts/postgres_server.py).
   The instructor publishes chapter 0.
2. **N students log in**: on the hub's login page (PAM checks the Unix password), then through
   the hub's REST API, which gives each a token for the same password (``POST
   /hub/api/users/<name>/tokens`` with ``{"auth": ...}``). No browser: a token in the
   ``Authorization`` header is what the hub, the proxy and each student's server accept from
   a script.
3. **They press Start at once**: every ``POST /hub/api/users/<name>/server`` (the spawn form's
   default profile and time limit) leaves within milliseconds of the others, and each student
   follows their spawn's progress stream until the server is ready: the *spawn time*, sbatch
   to a server answering through the proxy.
4. **Each opens chapter 0 through the book's launch link**, as the browser would: the hub's
   ``user-redirect`` to nbgitpuller's page, nbgitpuller's pull (its event stream, which the
   page's JavaScript reads), then the notebook's URL, which the course's server extensions
   answer with the fetched assignment and a kernel already started for it
   (hub/jupyter/course_launch.py, course_sessions.py).
5. **Each runs one cell on two ranks** through the kernel's websocket, as JupyterLab sends it:
   ``%load_ext distlab``, then a ``%%distributed -n 2`` cell whose ranks report their rank and
   Slurm job: they must be an ``srun`` step of the student's own server job. The *first-cell
   time* is that cell's, from sending it to its result.
6. **The deadline**: everyone submits within the same minute, through nbgrader's CLI as their
   own Unix user (the command tests/hub/test_exchange.py's ``as_student`` runs), each hand-in in a
   process group of its own: half a correct notebook, half the blank release, each with a
   Markdown cell naming its author, so a submission filed under the wrong name is seen, not
   guessed. Once every hand-in's processes have ended, the deadline passes (``grade due ...
   now``) and the students log off (their servers stopped through the API): the cluster is
   sized for the class, so the grading jobs need the cores the servers held.
7. **The instructor**: ``python -m distlab.grade collect``, ``autograde --slurm``,
   ``feedback``, ``return``, exactly as the instructor's guide has them, as the course's
   instructor account (never root; hub/instructor_account.py).
8. **Every student fetches their feedback** (``nbgrader fetch_feedback`` as themselves), which
   must name them and show the score they earned.

Printed: spawn time (p50, p95, max), first-cell time, submissions collected against made (must
be equal), grades against expected (must be equal), feedback fetched, the hub process's CPU
seconds and resident memory, and this machine's memory (used before the class, its peak, and
so roughly how many students its memory holds). Exit status 1 when an invariant fails: every
student served, collected == made with none mis-attributed, every grade as expected, every
student's own feedback fetched. Target (printed, not enforced): p95 spawn at most 60 s here.

Run as root on the machine that runs ``make test`` (users, PAM, Slurm, as ``make hub``).

Why each hand-in ends before the deadline passes (a run of 30 once graded 13 students late by
the benchmark's own doing) is told where the hand-in is: benchmarks/hub_class_parts/hand_in.py.

The steps live in :mod:`hub_class_parts`, one job each (the student, the lab, the kernel's
websocket, the hand-in, the instructor, the meter, the report); this file plays them in order.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hub_class_parts  # noqa: F401 - importing the package puts tests/, hub/ and scripts/ on sys.path
import psutil

# isort: split
import accounts
import demo
import postgres_server
from hub_class_parts.hand_in import NBGRADER_TIMEOUT_S, fetch_feedback, stage, submission, submit
from hub_class_parts.instructor import collected, grades, instructor, instructor_env, now_utc
from hub_class_parts.lab import log_in, log_off, work_in_the_lab
from hub_class_parts.meter import Meter, wait_until_gone
from hub_class_parts.report import failures, percentiles, report
from hub_class_parts.student import FULL_MARKS, SLUG, Student  # noqa: F401 - tests/hub/test_hub_class.py reads FULL_MARKS here
from test_exchange import released_notebook

COURSE = "dlk"

# What each grading job asks for: one core, 2 GiB, 15 minutes, as tests/grade/test_grade_cluster.py
# asks (the private nodes' cores are this machine's); how many run at once is --grading-jobs.
GRADING_JOB = ("--cpus", "1", "--mem", "2048", "--time", "15")


def at_once(step: str, call, students: list[Student]) -> float:
    """``call(student)`` for every student at the same moment, each in a thread of its own; the
    seconds from the start until the last one is done. A call that raises is recorded as that
    student's error in ``step``; the others go on."""
    go = threading.Event()

    def one(student: Student) -> None:
        go.wait()
        try:
            call(student)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding, reported per student
            student.errors.append(f"{step}: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=len(students)) as pool:
        running = [pool.submit(one, s) for s in students]
        time.sleep(0.5)   # every thread is waiting at the start line
        start = time.monotonic()
        go.set()
        for done in running:
            done.result()
    return time.monotonic() - start


def class_at_a_deadline(hub: dict, db_url: str, options, meter: Meter, log: list[str]) -> dict:
    """Steps 2 to 8 of the module's docstring on a running course; the figures of each."""
    url, env, phases = hub["url"], instructor_env(hub, db_url), {}
    names = sorted((u for u in hub["passwords"] if "student" in u), key=lambda u: int(re.sub(r"\D", "", u)))
    students = [Student(n, hub["passwords"][n], correct=i % 2 == 0) for i, n in enumerate(names)]
    started = time.monotonic()
    phases["publish"] = instructor(hub, env, log, "publish", SLUG, "--due", demo.example_due_date())

    meter.phase = "class"
    cpu_before = meter.hub_cpu_s()
    phases["log in"] = at_once("log in", lambda s: log_in(url, s), students)
    phases["start, open, run a cell"] = at_once("lab", lambda s: work_in_the_lab(url, s, options.timeout), students)
    servers_memory = meter.used()

    release = released_notebook(hub)
    staged = {s.name: stage(submission(s, release)) for s in students}
    try:
        phases["submit"] = at_once("submit", lambda s: submit(hub, s, staged[s.name], options.nbgrader_timeout),
                                   students)
    finally:
        for path in staged.values():
            shutil.rmtree(path.parent, ignore_errors=True)
    hub_cpu_class = meter.hub_cpu_s() - cpu_before
    # The deadline passes once every hand-in's processes have ended (submit returns only then):
    # one still running would land after it and be graded late by the benchmark's own doing.
    unended = [s.name for s in students if not s.submit_ended]
    if unended:
        raise RuntimeError(f"the hand-ins of {unended} did not end: the deadline cannot pass under them")
    time.sleep(1.1)   # a due date has whole seconds: the last submission must fall before it
    phases["deadline"] = instructor(hub, env, log, "due", SLUG, now_utc())
    phases["servers stopped"] = at_once("log off", lambda s: log_off(url, s, options.timeout), students)

    meter.phase = "grading"
    phases["collect"] = instructor(hub, env, log, "collect", SLUG)
    phases["autograde --slurm"] = instructor(hub, env, log, "autograde", SLUG, "--slurm", *GRADING_JOB,
                                             "--max-parallel", str(options.grading_jobs))
    phases["feedback"] = instructor(hub, env, log, "feedback", SLUG)
    phases["return"] = instructor(hub, env, log, "return", SLUG)
    meter.phase = "feedback"
    phases["fetch feedback"] = at_once("feedback", lambda s: fetch_feedback(hub, s, options.nbgrader_timeout),
                                       students)
    phases["total"] = time.monotonic() - started

    made = sum(s.submitted for s in students)
    count, misfiled = collected(hub, students)
    scores = grades(db_url, students)
    as_expected = [s.name for s in students if scores[s.name] == (s.expected_score, 0.0)]
    times = [s.submitted_at for s in students if s.submitted_at]
    return {
        "students": len(students),
        "served": sum(s.spawn_s is not None for s in students),
        "refused": {s.name: s.errors[0] for s in students if s.spawn_s is None and s.errors},
        "login_s": percentiles([s.login_s for s in students if s.login_s is not None]),
        "spawn_s": percentiles([s.spawn_s for s in students if s.spawn_s is not None]),
        "open_s": percentiles([s.open_s for s in students if s.open_s is not None]),
        "load_ext_s": percentiles([s.load_ext_s for s in students if s.load_ext_s is not None]),
        "first_cell_s": percentiles([s.cell_s for s in students if s.cell_s is not None]),
        "cells_ok": sum(s.cell_ok for s in students),
        "reconnects": {s.name: s.reconnects for s in students if s.reconnects},
        "fetched_by_link": sum(s.fetched_by_link for s in students),
        "submissions_made": made,
        "submissions_collected": count,
        "misattributed": misfiled,
        "submit_spread_s": (max(times) - min(times)) if times else None,
        "submit_s": percentiles([s.submit_s for s in students if s.submit_s is not None]),
        "nbgrader_timeout_s": options.nbgrader_timeout,
        "grades_expected": len(students),
        "grades_as_expected": len(as_expected),
        "grades": scores,
        "feedback_fetched": sum(s.feedback_ok for s in students),
        "hub_cpu_class_s": hub_cpu_class,
        "memory_with_servers_bytes": servers_memory,
        "phases_s": phases,
        "errors": {s.name: s.errors for s in students if s.errors},
    }


def keep(folder: Path, hub_log: Path, instructor_log: list[str]) -> None:
    """Copy what explains a run into ``folder``: the hub's log, what the instructor's commands said."""
    folder.mkdir(parents=True, exist_ok=True)
    if hub_log.exists():
        shutil.copy(hub_log, folder / "hub.log")
    (folder / "instructor.log").write_text("\n".join(instructor_log))


def main(argv: list[str] | None = None) -> dict:
    """Run the class; print its figures; return them (``failures``: the invariants it broke)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30, help="class size (default: %(default)s)")
    parser.add_argument("--course", default=COURSE, help="account prefix (default: %(default)s)")
    parser.add_argument("--grading-jobs", type=int, default=os.cpu_count() or 1,
                        help="grading jobs at once, autograde's --max-parallel (default: this machine's cores)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds any one student's step may take")
    parser.add_argument("--nbgrader-timeout", type=float, default=NBGRADER_TIMEOUT_S,
                        help="seconds one student's nbgrader command may take; past it its process group is ended "
                             "and the step counts as failed (default: %(default)s)")
    parser.add_argument("--queue-timeout", type=int, default=120, help="the hub's queue timeout (demo's default)")
    parser.add_argument("--artifacts", type=Path, help="keep the hub's log and the instructor's output in this folder")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run it as root: the hub authenticates with PAM and submits jobs as the students")
    baseline = Meter.used()
    run_dir = Path(tempfile.mkdtemp(prefix=f"{options.course}-", dir="/tmp"))   # short: Slurm's sockets
    log: list[str] = []
    users: list[str] = []
    try:
        # The gradebook server listens where the grading jobs on the nodes reach this machine.
        with demo.course_hub(run_dir, options.course, students=options.students,
                             queue_timeout=options.queue_timeout) as hub, \
                postgres_server.running_postgres(Path(tempfile.mkdtemp(prefix="dlk-pg-", dir="/tmp")),
                                                 address=hub["cluster"]["network"]["controller_address"],
                                                 clients=hub["cluster"]["network"].get("subnet")) as db:
            users = list(hub["passwords"])
            hub_up = Meter.used()
            with Meter(hub["hub_pid"]) as meter:
                figures = class_at_a_deadline(hub, db.url, options, meter, log)
                figures.update(hub_cpu_s=meter.hub_cpu_s(), hub_rss_peak_bytes=meter.hub_rss_peak,
                               hub_rss_bytes=meter.hub.memory_info().rss, memory_peak_bytes=meter.peak_used)
        figures["left_behind"] = wait_until_gone(users, 30)
    finally:
        if options.artifacts:
            keep(options.artifacts, run_dir / "hub.log", log)
        accounts.remove_accounts(options.course)
        shutil.rmtree(run_dir, ignore_errors=True)
    figures.update(memory_baseline_bytes=baseline, memory_hub_up_bytes=hub_up,
                   memory_total_bytes=psutil.virtual_memory().total, cluster_cpus_per_node=demo.cpus_per_node_for(
                       options.students))
    figures["failures"] = failures(figures)
    report(figures)
    return figures


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
