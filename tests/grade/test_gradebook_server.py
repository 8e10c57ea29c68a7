"""The gradebook on a real PostgreSQL server (scripts/postgres_server.py), through nbgrader's db_url.

A class graded by many jobs at once needs a database server; ``DISTLAB_GRADE_DB_URL`` points
every command at one. Here a private server (Debian's PostgreSQL, run as ``nobody`` in a
folder of the test) holds the gradebook of a small class of chapter 0: the scores, cell by
cell, are the ones sqlite grading gives the same students (tests/grade/test_grading.py), the
database password never reaches student code, a server that is down is one clear line
naming it, and grading again after it is back changes nothing but what was missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from grading_support import REPO, SLUG, Course, fresh_dir, solution_answers, with_answers
from test_grading import PARTIAL_ANSWERS, POINTS

sys.path.insert(0, str(REPO / "scripts"))
import postgres_server  # noqa: E402

PEEKING_ANSWERS = {  # correct answers, from code that also looks for the database password
    "task1-answer": "import os\n\ndef my_rank():\n    print('rank sees', os.environ.get('DISTLAB_GRADE_DB_URL'))\n"
                    "    return dist.get_rank()\n",
    "concepts-answer": "import os\nprint('kernel sees', os.environ.get('DISTLAB_GRADE_DB_URL'), "
                       "[k for k, v in os.environ.items() if 'psycopg:' in v])\n" + solution_answers(SLUG)["concepts-answer"],
}


def server_root() -> Path:
    """A folder the server's account can reach (pytest's tmp_path is private to root)."""
    return Path(tempfile.mkdtemp(prefix="distlab-pg-", dir="/tmp"))


@pytest.fixture(scope="module")
def postgres():
    with postgres_server.running_postgres(server_root()) as server:   # removes its folder too
        yield server


@pytest.fixture(scope="module")
def graded(postgres, tmp_path_factory):
    root = tmp_path_factory.mktemp("pg-class")
    course = Course(root / "work", db_url=postgres.url)
    release = course.release()
    incoming = fresh_dir(root / "incoming")
    correct = solution_answers(SLUG)
    course.submit(incoming, "full", with_answers(release, {**correct, **PEEKING_ANSWERS}))
    course.submit(incoming, "partial", with_answers(release, {**correct, **PARTIAL_ANSWERS}))
    course.submit(incoming, "empty", release.read_bytes())
    proc = course.grade("class", SLUG, "--from", str(incoming), "--to", str(root / "grades.csv"))
    assert proc.returncode == 0, course.log[-6000:]
    return course


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_server_runs_unprivileged_on_loopback_and_leaves_nothing_behind():
    root = server_root()
    with postgres_server.running_postgres(root) as server:
        postmaster = psutil.Process(server.process.pid)
        tree = [postmaster, *postmaster.children(recursive=True)]
        assert owners(tree) == {"nobody"}
        listening = {c.laddr for c in psutil.net_connections("inet") if c.pid == postmaster.pid
                     and c.status == psutil.CONN_LISTEN}
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}, listening
        with server.connect() as connection:
            assert connection.execute("select current_user").fetchone() == ("distlab",)
        import psycopg

        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host="127.0.0.1", port=server.port, user="distlab", password="guess",
                            dbname="gradebook", connect_timeout=5)
    time.sleep(0.2)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "a server process survived"
    assert not root.exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_class_graded_into_postgres_scores_exactly_as_with_sqlite(graded):
    scores = graded.scores()
    assert scores["full"] == POINTS
    assert scores["partial"] == {**{cell: 0.0 for cell in POINTS}, "task1-tests": 1.0}
    assert scores["empty"] == {cell: 0.0 for cell in POINTS}
    csv = (graded.work.parent / "grades.csv").read_text()
    assert csv.count(f"{SLUG},") == 3, csv


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_student_code_never_sees_the_database_password(graded, postgres):
    printed = graded.autograded_text()
    seen = [line.strip() for line in printed.splitlines() if " sees " in line]
    assert any("kernel sees None []" in line for line in seen), seen   # "full" looked, found nothing
    assert any("rank sees None" in line for line in seen), seen
    assert postgres.password not in printed and postgres.password not in graded.log


def autograde_until(course: Course, line_part: str, *students: str) -> subprocess.Popen:
    """Start ``autograde`` for ``students`` and return once its log shows ``line_part``."""
    args = [a for s in students for a in ("--student", s)]
    proc = subprocess.Popen([sys.executable, "-m", "distlab.grade", "autograde", SLUG, *args], cwd=REPO,
                            env=course.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    proc.seen = ""
    for line in proc.stdout:
        proc.seen += line
        if line_part in line:
            return proc
    raise AssertionError(f"autograde ended before {line_part!r}:\n{proc.seen[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_server_that_goes_down_is_named_and_grading_again_completes_without_duplicates(graded, postgres):
    before = graded.scores()
    from distlab.grade import config

    named = f"the gradebook database {config.shown_url(postgres.url)} does not answer"

    # Down before the command: one line, at once.
    postgres_server.stop(postgres)
    try:
        start = time.monotonic()
        down = graded.grade("autograde", SLUG, timeout=120)
        assert down.returncode == 1 and time.monotonic() - start < 60
        assert named in down.stdout, down.stdout[-3000:]
    finally:
        postgres_server.restart(postgres)

    # Down while grading: "partial" is saved, then the server stops before "empty".
    proc = autograde_until(graded, f"autograded/partial/{SLUG}/{SLUG}.ipynb", "partial", "empty")
    try:
        postgres_server.stop(postgres)
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        postgres_server.restart(postgres)
    output = proc.seen + rest
    assert proc.returncode != 0 and named in output, output[-4000:]
    assert "empty NOT GRADED" in output, output[-4000:]
    assert postgres.password not in output + graded.log

    # Back up: grading the missing student again completes; nobody is entered twice.
    again = graded.grade("autograde", SLUG, "--student", "empty", timeout=300)
    assert again.returncode == 0, graded.log[-4000:]
    assert graded.scores() == before
    with postgres.connect() as connection:
        rows = connection.execute("select count(*), count(distinct student_id) from submitted_assignment").fetchone()
    assert rows == (3, 3), f"submissions (rows, students) after grading again: {rows}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_student_is_saved_in_one_transaction(graded, postgres):
    """SaveAutoGradesAtOnce: a failure after some cells were written rolls the student back."""
    script = f"""
import sys
sys.path.insert(0, {str(REPO / 'src')!r})
import nbformat
from distlab.grade.pipeline import nbplugins

nb = nbformat.read({str(graded.work / 'autograded' / 'full' / SLUG / f'{SLUG}.ipynb')!r}, as_version=4)
tests = [c for c in nb.cells if nbplugins.is_test_cell(c)]
for cell in tests:                      # every test passes: "partial" gets full marks, were it committed
    cell.outputs = []
resources = {{"nbgrader": {{"notebook": {SLUG!r}, "assignment": {SLUG!r}, "student": "partial",
                            "db_url": {postgres.url!r}}}}}
saver = nbplugins.SaveAutoGradesAtOnce()
calls = []
original = saver._add_score
def fail_on_the_third(cell, resources):
    calls.append(cell.metadata["nbgrader"]["grade_id"])
    if len(calls) == 3:
        raise RuntimeError("the job was killed here")
    original(cell, resources)
saver._add_score = fail_on_the_third
try:
    saver.preprocess(nb, resources)
except RuntimeError:
    print("stopped after", calls)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "stopped after" in proc.stdout, proc.stdout + proc.stderr
    assert graded.scores()["partial"] == {**{cell: 0.0 for cell in POINTS}, "task1-tests": 1.0}


# -- fast: no server needed ---------------------------------------------------------------------

def test_the_url_is_read_once_and_leaves_the_environment(monkeypatch):
    from distlab.grade import config

    url = "postgresql+psycopg://distlab:s3cret@127.0.0.1:1/gradebook"
    monkeypatch.setattr(config, "_db_url", None)
    monkeypatch.setenv(config.DB_URL_VARIABLE, url)
    assert config.db_url() == url
    assert config.DB_URL_VARIABLE not in os.environ        # children of this process never see it
    assert config.db_url() == url                          # ... and this process still knows it
    assert config.nbgrader_environment({})[config.DB_URL_VARIABLE] == url
    assert config.shown_url(url) == "postgresql+psycopg://distlab:***@127.0.0.1:1/gradebook"
    monkeypatch.setattr(config, "_db_url", None)
    assert config.db_url().startswith("sqlite:///") and config.nbgrader_environment({}) == {}


def test_a_gradebook_server_that_does_not_answer_is_one_line_naming_it(tmp_path):
    closed = postgres_server.free_port()                   # nothing listens there
    env = dict(os.environ, DISTLAB_GRADE_WORK=str(tmp_path),
               DISTLAB_GRADE_DB_URL=f"postgresql+psycopg://distlab:s3cret@127.0.0.1:{closed}/gradebook")
    proc = subprocess.run([sys.executable, "-m", "distlab.grade", "export"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert (f"export: the gradebook database postgresql+psycopg://distlab:***@127.0.0.1:{closed}/gradebook "
            "does not answer") in proc.stdout, proc.stdout + proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def owners(processes) -> set[str]:
    """The users ``processes`` run as; one that ended meanwhile (PostgreSQL starts short-lived
    helpers, e.g. its startup process) has no owner to report and is left out."""
    found = set()
    for proc in processes:
        try:
            found.add(proc.username())
        except psutil.NoSuchProcess:
            pass
    return found
