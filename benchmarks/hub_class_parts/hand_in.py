"""The hand-in and the feedback of benchmarks/hub_class.py: nbgrader's CLI as the student's own Unix
user, each command in a process group of its own that has ended, as a whole, when the call returns.

**Why a hand-in ends before the deadline passes** (the run of 30 that graded 13 students late).
On a machine loaded by other work, the 30 hand-ins took longer than the 120 s that
``as_student`` gave each (``subprocess.run``'s timeout). That timeout killed ``runuser``
only: bash and ``nbgrader submit`` below it, in the same process group, ran on. The benchmark
took the 30 TimeoutExpired as the end of the step, and moved the due date to "now" while the
hand-ins were still being written: 22 of them landed 0.7 to 14 s after it (their nbgrader
timestamps), so nbgrader counted them late. The 13 of those with the correct notebook lost
their 6 points to the late penalty ("Late submission penalty: 6.0" in the feedback step: the
13 grades that differed from the expected ones; a blank notebook has no points to lose); 30
were collected, yet 0 counted as made. That was the benchmark's own doing, not the exchange's: a
student who submits before the deadline is on time however long the exchange then takes.
Now each hand-in runs in a process group of its own that is ended as a whole, by its id, when
it runs out of time (``--nbgrader-timeout``, 600 s: over four times the slowest hand-in seen
under load), ``submit`` returns only when no process of the group is left, and the deadline
passes only after every hand-in has returned. A hand-in that fails or runs out of time is
still reported as not made, and the invariants stay as strict: made, collected, every grade
exactly as expected with no late penalty. The report gives the hand-ins' times (p50, p95, max).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grading_support
import psutil
from process_support import GUARDIAN

from . import REPO
from .student import SLUG, Student, authors

# How long one student's nbgrader command (fetch and submit; fetch_feedback) may take. 30 hand-ins
# at once on 2 cores, with the 30 servers still up and the machine loaded by other work, were
# stamped by nbgrader 118 to 135 s after they started (run n30b); alone, `nbgrader submit` takes
# 3 to 4 s of CPU, and 4 hand-ins at once took 9 to 11 s. 600 s is over four times the slowest.
# Past it the command's whole process group is ended and the hand-in counts as failed
# (--nbgrader-timeout).
NBGRADER_TIMEOUT_S = 600.0


def submission(student: Student, release: Path) -> bytes:
    """The notebook the student hands in: the solution or the blank release, with their marker."""
    import nbformat

    source = grading_support.with_answers(release, grading_support.solution_answers(SLUG)) if student.correct \
        else release.read_bytes()
    notebook = nbformat.reads(source.decode(), as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell(student.marker))
    return nbformat.writes(notebook).encode()


def stage(notebook: bytes) -> Path:
    """Put the notebook the student will hand in where they can read it; return its path."""
    staged = Path(tempfile.mkdtemp(dir="/tmp", prefix="dlk-nb-"))
    os.chmod(staged, 0o755)
    (staged / "answer.ipynb").write_bytes(notebook)
    os.chmod(staged / "answer.ipynb", 0o644)
    return staged / "answer.ipynb"


def student_command(hub: dict, user: str, script: str) -> list[str]:
    """A shell ``script`` run by ``user`` with the environment their server's job has: what
    tests/hub/test_exchange.py's ``as_student`` runs, here run by :func:`as_student_in_own_group`."""
    job_env = {"HOME": f"/home/{user}", "USER": user, "LOGNAME": user,
               "PATH": f"{Path(hub['server_python']).parent}:/usr/bin:/bin",
               "JUPYTER_CONFIG_PATH": f"{REPO / 'hub' / 'jupyter'}:{Path(sys.prefix) / 'etc' / 'jupyter'}",
               "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter"),
               "DISTLAB_HUB_EXCHANGE": str(hub["exchange"])}
    return ["/usr/sbin/runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in job_env.items()],
            "bash", "-c", f"cd ~ && {script}"]


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still there (a zombie counts as ended)."""
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
    return False


def as_student_in_own_group(hub: dict, user: str, script: str, timeout: float) -> tuple[subprocess.CompletedProcess, bool]:
    """Run :func:`student_command` in a process group of its own; return what it printed and
    whether it ran out of ``timeout``. Either way the whole group (runuser, bash, nbgrader) is
    ended, by its id, and this returns only once no process of it is left: nothing of the
    command can still write to the exchange afterwards.

    ``runuser -u`` keeps its command in its own process group (it does not call ``setsid``), so
    the group holds everything the command started. ``subprocess.run``'s timeout, which this
    replaces, killed only runuser: bash and nbgrader ran on (see the module's docstring).
    :data:`process_support.GUARDIAN` leads the group and ends it if this process dies.
    """
    proc = subprocess.Popen([sys.executable, "-c", GUARDIAN, *student_command(hub, user, script)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = "", ""
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if timed_out:
            out, err = proc.communicate()
        proc.wait()
    gone = time.monotonic() + 60
    while group_alive(proc.pid):   # SIGKILL is acted on when each process next runs
        if time.monotonic() > gone:
            raise RuntimeError(f"{user}'s command {script!r}: process group {proc.pid} outlived SIGKILL by 60 s")
        time.sleep(0.2)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), timed_out


def submit(hub: dict, student: Student, notebook: Path, timeout: float) -> None:
    """At the deadline: fetch (unless the launch link did) and submit with nbgrader's CLI, as the
    student's own Unix user (tests/hub/test_exchange.py's ``submit_cli``, which this follows), in a
    process group that has ended when this returns. A hand-in that failed or ran out of time is
    recorded as not made."""
    start = time.monotonic()
    done, timed_out = as_student_in_own_group(
        hub, student.name, f"(test -d {SLUG} || python -m nbgrader fetch_assignment {SLUG}) && "
                           f"cp {notebook} {SLUG}/{SLUG}.ipynb && python -m nbgrader submit {SLUG}", timeout)
    student.submit_s, student.submit_ended = time.monotonic() - start, True
    student.submitted_at = time.time()
    student.submitted = not timed_out and done.returncode == 0 and "Submitted as" in done.stdout + done.stderr
    if timed_out:
        student.errors.append(f"submit: still running after {timeout:g} s; its process group was ended, "
                              f"so it was not handed in: {(done.stdout + done.stderr)[-300:]}")
    elif not student.submitted:
        student.errors.append(f"submit: exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}")


def fetch_feedback(hub: dict, student: Student, timeout: float) -> None:
    """``nbgrader fetch_feedback`` as the student (in a process group of its own, as ``submit``);
    their feedback must name them, no one else, and show the score they earned."""
    done, timed_out = as_student_in_own_group(hub, student.name, f"python -m nbgrader fetch_feedback {SLUG}", timeout)
    pages = sorted(Path(f"/home/{student.name}/{SLUG}/feedback").glob(f"*/{SLUG}.html"))
    if timed_out:
        student.errors.append(f"feedback: still running after {timeout:g} s; its process group was ended")
        return
    if done.returncode != 0 or not pages:
        student.errors.append(f"feedback: exit {done.returncode}, {len(pages)} page(s): {done.stderr[-300:]}")
        return
    text = re.sub(r"<[^>]+>", " ", pages[-1].read_text(errors="replace"))
    score = re.search(r"Score:\s*([0-9.]+)\s*/\s*([0-9.]+)", text)
    named = authors(text)
    student.feedback_ok = named == [student.name] and score is not None and float(score.group(1)) == student.expected_score
    if not student.feedback_ok:
        student.errors.append(f"feedback: {score.group(0) if score else 'no score'}, names {named}")
