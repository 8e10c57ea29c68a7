"""A whole class at a deadline, on the course hub: can it take them all at once?

    python benchmarks/hub_class.py                  # 30 students (as root, like `make hub`)
    python benchmarks/hub_class.py --students 7     # tests/test_hub_class.py runs 3

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
   own Unix user (the command tests/test_exchange.py's ``as_student`` runs), each hand-in in a
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

import argparse
import ast
import contextlib
import datetime
import json
import math
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
import requests
import websocket

REPO = Path(__file__).resolve().parent.parent
for folder in ("tests", "hub", "scripts"):
    sys.path.insert(0, str(REPO / folder))
import accounts  # noqa: E402
import demo  # noqa: E402
import grading_support  # noqa: E402
import instructor_account  # noqa: E402
import postgres_server  # noqa: E402
from course_spawner import DEFAULT_RUNTIME, PROFILES  # noqa: E402
from process_support import GUARDIAN, run_in_own_group  # noqa: E402
from test_exchange import released_notebook  # noqa: E402

COURSE = "dlk"
SLUG = grading_support.SLUG
FULL_MARKS = 6.0
SPAWN_TARGET_S = 60.0
# How long one student's nbgrader command (fetch and submit; fetch_feedback) may take. 30 hand-ins
# at once on 2 cores, with the 30 servers still up and the machine loaded by other work, were
# stamped by nbgrader 118 to 135 s after they started (run n30b); alone, `nbgrader submit` takes
# 3 to 4 s of CPU, and 4 hand-ins at once took 9 to 11 s. 600 s is over four times the slowest.
# Past it the command's whole process group is ended and the hand-in counts as failed
# (--nbgrader-timeout).
NBGRADER_TIMEOUT_S = 600.0
GIB = 1024 ** 3
MIB = 1024 ** 2
# What each grading job asks for: one core, 2 GiB, 15 minutes, as tests/test_grade_cluster.py
# asks (the private nodes' cores are this machine's); how many run at once is --grading-jobs.
GRADING_JOB = ("--cpus", "1", "--mem", "2048", "--time", "15")
LOAD_EXT = "%load_ext distlab\nimport os\nos.environ.get('SLURM_JOB_ID')"
DISTRIBUTED_CELL = ("%%distributed -n 2\nimport os\n"
                    "(rank, world_size, os.environ.get('SLURM_JOB_ID'), os.environ.get('SLURMD_NODENAME'))")


# -- one student ----------------------------------------------------------------------------------

@dataclass
class Student:
    """A simulated student: what they did and how long each step took (None: not reached)."""
    name: str
    password: str
    correct: bool                      # hands in the solution (else the blank release)
    api: requests.Session = field(default_factory=requests.Session, repr=False)
    login_s: float | None = None
    spawn_s: float | None = None
    open_s: float | None = None        # launch link: nbgitpuller, fetch, the notebook's kernel
    load_ext_s: float | None = None    # kernel ready and distlab imported
    cell_s: float | None = None        # the %%distributed -n 2 cell
    cell_ok: bool = False
    reconnects: int = 0                # kernel websockets that dropped or did not open in time
    fetched_by_link: bool = False
    submitted: bool = False
    submitted_at: float | None = None
    submit_s: float | None = None     # the hand-in's nbgrader commands, start to the end of their group
    submit_ended: bool = False         # no process of the hand-in was left running
    feedback_ok: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def marker(self) -> str:
        """The line their notebook carries, so that whoever reads a submission knows its author."""
        return f"Handed in by {self.name} for the hub-class benchmark."

    @property
    def expected_score(self) -> float:
        return FULL_MARKS if self.correct else 0.0


def percentiles(values: list[float]) -> dict:
    """p50, p95 (nearest rank: the value 95% of the class did not exceed) and max; {} if none."""
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}


def event_stream(response: requests.Response):
    """The JSON events of a server-sent event stream (``data: {...}`` lines), as they arrive."""
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            yield json.loads(line[len("data:"):])


def log_in(hub_url: str, student: Student) -> None:
    """Log in on the hub's login page (PAM checks the password; the hub learns the user), then
    ask the hub's API for a token with the same password, used from now on.

    The token API alone would not do for a first log-in: it authenticates the password but
    answers 403 for a user the hub has never seen, and the login page is what adds them.
    """
    start = time.monotonic()
    with requests.Session() as browser:
        page = browser.get(f"{hub_url}/hub/login", timeout=120)
        page.raise_for_status()
        xsrf = re.search(r'name="_xsrf" value="([^"]*)"', page.text)
        form = {"username": student.name, "password": student.password, "_xsrf": xsrf.group(1) if xsrf else ""}
        answer = browser.post(f"{hub_url}/hub/login", data=form, allow_redirects=False, timeout=120)
        if answer.status_code != 302:
            raise RuntimeError(f"the login page refused the password: {answer.status_code}")
    answer = requests.post(f"{hub_url}/hub/api/users/{student.name}/tokens", timeout=120,
                           json={"auth": {"username": student.name, "password": student.password},
                                 "note": "benchmarks/hub_class.py", "expires_in": 4 * 3600})
    answer.raise_for_status()
    student.api.headers["Authorization"] = f"token {answer.json()['token']}"
    student.login_s = time.monotonic() - start


def spawn(hub_url: str, student: Student, timeout: float) -> None:
    """Press Start (the spawn form's default profile and time limit); follow the spawn's progress
    until the server is ready. A refusal raises, with the hub's message."""
    options = {"profile": next(iter(PROFILES)), "runtime": DEFAULT_RUNTIME}
    start = time.monotonic()
    answer = student.api.post(f"{hub_url}/hub/api/users/{student.name}/server", json=options, timeout=timeout)
    if answer.status_code not in (201, 202):
        raise RuntimeError(f"spawn refused: {answer.status_code} {answer.text[:300]}")
    with student.api.get(f"{hub_url}/hub/api/users/{student.name}/server/progress", stream=True,
                         timeout=(30, timeout)) as progress:
        progress.raise_for_status()
        for event in event_stream(progress):
            if event.get("failed"):
                raise RuntimeError(f"spawn failed: {event.get('message')}")
            if event.get("ready"):
                break
        else:
            raise RuntimeError("the spawn's progress stream ended without 'ready'")
    student.spawn_s = time.monotonic() - start


def open_chapter(hub_url: str, student: Student) -> str:
    """Follow the book's launch link as the browser does; return the notebook's path on the server.

    The link's page is nbgitpuller's; its JavaScript reads the pull's event stream, then goes
    to the notebook's URL, which the course's server answers with a redirect to the fetched
    assignment, its kernel started (hub/jupyter/course_launch.py, course_sessions.py).
    """
    start = time.monotonic()
    link = demo.launch_link(hub_url)
    page = student.api.get(link, timeout=120)
    page.raise_for_status()
    query = {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}
    server = f"{hub_url}/user/{student.name}/"
    pull = {"repo": query["repo"], "branch": query["branch"], "targetpath": query["repo"].rstrip("/").split("/")[-1]}
    with student.api.get(server + "git-pull/api", params=pull, stream=True, timeout=(30, 300)) as events:
        events.raise_for_status()
        phases = [event for event in event_stream(events) if event.get("phase") in ("finished", "error")]
    if not phases or phases[-1]["phase"] != "finished":
        raise RuntimeError(f"nbgitpuller did not finish: {phases[-1] if phases else 'no final event'}")
    notebook = student.api.get(server + query["urlpath"], timeout=120)
    notebook.raise_for_status()
    opened = urlsplit(notebook.url).path.split("/lab/tree/", 1)[-1]
    if opened != f"{SLUG}/{SLUG}.ipynb":
        raise RuntimeError(f"the launch link opened {opened!r}, not the fetched assignment")
    student.fetched_by_link = Path(f"/home/{student.name}/{SLUG}/{SLUG}.ipynb").is_file()
    student.open_s = time.monotonic() - start
    return opened


def kernel_of(hub_url: str, student: Student, path: str) -> str:
    """The id of the kernel the server started for the notebook at ``path`` (its session's)."""
    sessions = student.api.get(f"{hub_url}/user/{student.name}/api/sessions", timeout=60)
    sessions.raise_for_status()
    for session in sessions.json():
        if session.get("path") == path:
            return session["kernel"]["id"]
    raise RuntimeError(f"no kernel was started for {path}")


class KernelChannel:
    """A kernel's websocket as JupyterLab holds it: one session id for the notebook's tab, and a
    new connection under the same id whenever one drops or does not open in time.

    The server keeps the kernel's messages for a session whose socket dropped and replays them
    when it comes back (jupyter_server's buffering, keyed by ``session_id``), so a busy machine
    that resets a connection mid-cell loses no reply: the browser reconnects, and so does this.
    ``reconnects`` counts how often that happened.
    """

    def __init__(self, url: str, authorization: str, deadline: float):
        self.session = uuid.uuid4().hex
        self.url, self.header = f"{url}?session_id={self.session}", [f"Authorization: {authorization}"]
        self.deadline, self.reconnects, self.socket = deadline, 0, None

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the kernel did not answer in time")
        return left

    def connected(self) -> websocket.WebSocket:
        while self.socket is None:
            try:
                self.socket = websocket.create_connection(self.url, header=self.header, timeout=min(120, self.left()))
            except (websocket.WebSocketException, OSError):
                self.reconnects += 1
                time.sleep(min(2, self.left()))
        return self.socket

    def dropped(self) -> None:
        with contextlib.suppress(Exception):
            self.socket.close()
        self.socket, self.reconnects = None, self.reconnects + 1

    def send(self, text: str) -> None:
        while True:
            try:
                return self.connected().send(text)
            except (websocket.WebSocketException, OSError):
                self.dropped()

    def receive(self) -> str | bytes:
        while True:
            socket = self.connected()
            socket.settimeout(self.left())
            try:
                return socket.recv()
            except websocket.WebSocketTimeoutException:
                self.left()          # raises once the deadline has passed; else the socket is stuck
                self.dropped()
            except (websocket.WebSocketException, OSError):
                self.dropped()

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()


def execute(channel: KernelChannel, code: str) -> str:
    """Run ``code`` in the kernel as JupyterLab sends a cell (an ``execute_request`` on the shell
    channel); wait for its reply and for the kernel to be idle again; return the value it showed
    (``text/plain``). An error in the cell raises, with the kernel's error name and message."""
    msg_id = uuid.uuid4().hex
    channel.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": channel.session,
                   "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    shown, reply, idle = "", None, False
    while reply is None or not idle:
        raw = channel.receive()
        if not isinstance(raw, str):
            continue                       # a binary frame: a message with buffers, not ours
        message = json.loads(raw)
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["header"]["msg_type"], message["content"]
        if kind == "execute_result":
            shown = content["data"].get("text/plain", "")
        elif kind == "execute_reply":
            reply = content
        elif kind == "status" and content.get("execution_state") == "idle":
            idle = True
    if reply.get("status") != "ok":
        raise RuntimeError(f"the cell failed: {reply.get('ename')}: {reply.get('evalue')}")
    return shown


def run_first_cells(hub_url: str, student: Student, path: str, timeout: float) -> None:
    """``%load_ext distlab``, then one ``%%distributed -n 2`` cell: its two ranks must be a step of
    the server's own Slurm job (the same job id as the kernel's)."""
    kernel = kernel_of(hub_url, student, path)
    ws_url = hub_url.replace("http", "ws", 1) + f"/user/{student.name}/api/kernels/{kernel}/channels"
    channel = KernelChannel(ws_url, student.api.headers["Authorization"], time.monotonic() + timeout)
    try:
        start = time.monotonic()
        job = ast.literal_eval(execute(channel, LOAD_EXT))
        student.load_ext_s = time.monotonic() - start
        start = time.monotonic()
        ranks = ast.literal_eval(execute(channel, DISTRIBUTED_CELL))
        student.cell_s = time.monotonic() - start
    finally:
        channel.close()
        student.reconnects = channel.reconnects
    if not job or [r[:3] for r in ranks] != [(0, 2, job), (1, 2, job)]:
        raise RuntimeError(f"the ranks were not a step of the server's job {job}: {ranks}")
    student.cell_ok = True


def work_in_the_lab(hub_url: str, student: Student, timeout: float) -> None:
    """One student's session up to the deadline: Start, open chapter 0, run a cell. A step that
    fails ends it (the student still hands in: nbgrader's CLI needs no server)."""
    spawn(hub_url, student, timeout)
    path = open_chapter(hub_url, student)
    run_first_cells(hub_url, student, path, timeout)


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
    tests/test_exchange.py's ``as_student`` runs, here run by :func:`as_student_in_own_group`."""
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
    student's own Unix user (tests/test_exchange.py's ``submit_cli``, which this follows), in a
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


def log_off(hub_url: str, student: Student, timeout: float) -> None:
    """Stop the student's server (its Slurm job is cancelled) and wait until the hub says so."""
    try:
        student.api.delete(f"{hub_url}/hub/api/users/{student.name}/server", timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = student.api.get(f"{hub_url}/hub/api/users/{student.name}", timeout=60).json()
            if not model.get("servers"):
                return
            time.sleep(1)
        student.errors.append(f"log off: the server was still listed after {timeout:g} s")
    except requests.RequestException as exc:
        student.errors.append(f"log off: {exc}")


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


# -- the instructor --------------------------------------------------------------------------------

def instructor_env(hub: dict, db_url: str) -> dict:
    """What ``python -m distlab.grade`` needs besides the instructor account's own environment
    (course_hub's ``instructor``: work folder, exchange, private cluster): the shared gradebook."""
    return {"DISTLAB_GRADE_DB_URL": db_url}


def instructor(hub: dict, env: dict, log: list[str], *args: str, timeout: float = 3600) -> float:
    """``python -m distlab.grade ARGS`` as the course's instructor account (never root), from
    their own copy of the course (hub/instructor_account.py); its seconds. Fails loudly."""
    start = time.monotonic()
    teacher = hub["instructor"]
    done = run_in_own_group(instructor_account.command(teacher, *args, env=env), timeout, cwd=teacher["course"])
    seconds = time.monotonic() - start
    log.append(f"$ grade {' '.join(args)}  ({seconds:.1f} s, exit {done.returncode})\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise RuntimeError(f"`grade {' '.join(args)}` failed (exit {done.returncode}):\n{log[-1][-3000:]}")
    return seconds


def now_utc() -> str:
    """Now, spelled as nbgrader reads a due date."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def collected(hub: dict, students: list[Student]) -> tuple[int, list[str]]:
    """How many submissions the instructor collected, and those filed under a name that did not
    write them (their marker names someone else) or that hold no marker at all."""
    work = Path(hub["grading"])
    found = sorted((work / "submitted").glob(f"*/{SLUG}/{SLUG}.ipynb"))
    wrong = [p.parts[-3] for p in found if authors(p.read_text()) != [p.parts[-3]]]
    return len(found), wrong


def authors(text: str) -> list[str]:
    """The students a notebook or feedback page names as its author (their markers in it)."""
    return re.findall(r"Handed in by (\S+) for the hub-class benchmark", text)


def grades(db_url: str, students: list[Student]) -> dict[str, tuple]:
    """``{student: (score, late penalty)}`` from the gradebook; a missing one is (None, None)."""
    from nbgrader.api import Gradebook, MissingEntry

    found = {}
    with Gradebook(db_url) as gradebook:
        for student in students:
            try:
                graded = gradebook.find_submission(SLUG, student.name)
                found[student.name] = (graded.score, graded.late_submission_penalty)
            except MissingEntry:
                found[student.name] = (None, None)
    return found


# -- what the machine does meanwhile ---------------------------------------------------------------

class Meter:
    """Samples this machine's memory in use (MemTotal - MemAvailable) and the hub's resident
    memory every ``interval`` seconds, keeping the peak of each per phase of the run."""

    def __init__(self, hub_pid: int, interval: float = 0.5):
        self.hub = psutil.Process(hub_pid)
        self.interval, self.phase = interval, "start"
        self.peak_used: dict[str, int] = {}
        self.hub_rss_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = {k: int(v.split()[0]) for k, v in info.items() if k in ("MemTotal", "MemAvailable")}
        return (kib["MemTotal"] - kib["MemAvailable"]) * 1024

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            used = self.used()
            self.peak_used[self.phase] = max(self.peak_used.get(self.phase, 0), used)
            with contextlib.suppress(psutil.Error):
                self.hub_rss_peak = max(self.hub_rss_peak, self.hub.memory_info().rss)

    def hub_cpu_s(self) -> float:
        times = self.hub.cpu_times()
        return times.user + times.system

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def processes_of(users: list[str]) -> list[psutil.Process]:
    """Live processes run by any of ``users`` (what the course left behind, if anything)."""
    uids = set()
    for user in users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def wait_until_gone(users: list[str], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := processes_of(users)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]


# -- the run ----------------------------------------------------------------------------------------

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


def failures(figures: dict) -> list[str]:
    """The invariants the run broke (empty: none)."""
    n, broken = figures["students"], []
    if figures["served"] != n:
        broken.append(f"served {figures['served']} of {n}")
    if figures["cells_ok"] != n:
        broken.append(f"the %%distributed cell ran right for {figures['cells_ok']} of {n}")
    if figures["submissions_made"] != n:
        broken.append(f"{figures['submissions_made']} of {n} submissions made")
    if figures["submissions_collected"] != figures["submissions_made"]:
        broken.append(f"collected {figures['submissions_collected']}, made {figures['submissions_made']}")
    if figures["misattributed"]:
        broken.append(f"mis-attributed: {figures['misattributed']}")
    if figures["grades_as_expected"] != figures["grades_expected"]:
        broken.append(f"grades as expected {figures['grades_as_expected']} of {figures['grades_expected']}")
    if figures["feedback_fetched"] != n:
        broken.append(f"{figures['feedback_fetched']} of {n} fetched their own feedback")
    if figures["left_behind"]:
        broken.append(f"{len(figures['left_behind'])} process(es) of the course left behind")
    return broken


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


def seconds(figure: dict) -> str:
    if not figure:
        return "-"
    return f"p50 {figure['p50']:.1f} s  p95 {figure['p95']:.1f} s  max {figure['max']:.1f} s  (n={figure['n']})"


def report(f: dict) -> None:
    """Print the figures, one line each, as the issue asks for them."""
    n, total = f["students"], f["memory_total_bytes"]
    declared = f["cluster_cpus_per_node"]
    print(f"\nhub_class: a class of {n} at a deadline, {SLUG}; this machine: {os.cpu_count()} cores, "
          f"{total / GIB:.1f} GiB; cluster: 2 nodes x {declared or os.cpu_count()} CPUs"
          + (" declared (the servers share the real cores)" if declared else ""))
    print(f"served            {f['served']} of {n}" + (f"; refused: {f['refused']}" if f["refused"] else ""))
    print(f"log-in (API)      {seconds(f['login_s'])}")
    spawn = f["spawn_s"]
    verdict = "meets" if spawn and spawn["p95"] <= SPAWN_TARGET_S else "MISSES"
    print(f"spawn             {seconds(spawn)}   target p95 <= {SPAWN_TARGET_S:.0f} s: {verdict}")
    print(f"chapter opened    {seconds(f['open_s'])}   (launch link; {f['fetched_by_link']} fetched by it)")
    print(f"%load_ext distlab {seconds(f['load_ext_s'])}")
    print(f"first cell        {seconds(f['first_cell_s'])}   (%%distributed -n 2 in the server's job: "
          f"{f['cells_ok']} of {n} right; kernel websockets reopened: {sum(f['reconnects'].values())}, "
          f"by {len(f['reconnects'])} students)")
    spread = f"{f['submit_spread_s']:.1f} s" if f["submit_spread_s"] is not None else "-"
    print(f"submissions       made {f['submissions_made']}, collected {f['submissions_collected']} (must be equal); "
          f"mis-attributed {len(f['misattributed'])}; all handed in within {spread}")
    print(f"submit            {seconds(f['submit_s'])}   (fetch and submit as the student, all at once; "
          f"ended at {f['nbgrader_timeout_s']:g} s)")
    print(f"grades            {f['grades_as_expected']} of {f['grades_expected']} as expected "
          f"({(n + 1) // 2} correct: {FULL_MARKS:g}, {n // 2} blank: 0)")
    print(f"feedback          {f['feedback_fetched']} of {n} fetched their own")
    print(f"hub process       CPU {f['hub_cpu_s']:.1f} s in all ({f['hub_cpu_class_s']:.1f} s from log-in to the "
          f"last submission); RSS {f['hub_rss_bytes'] / MIB:.0f} MiB, peak {f['hub_rss_peak_bytes'] / MIB:.0f} MiB")
    peaks = f["memory_peak_bytes"]
    class_peak = peaks.get("class", 0)
    per_student = (class_peak - f["memory_hub_up_bytes"]) / n
    holds = int((total - f["memory_hub_up_bytes"]) / per_student) if per_student > 0 else 0
    print(f"memory            in use before {f['memory_baseline_bytes'] / GIB:.1f} GiB, hub up "
          f"{f['memory_hub_up_bytes'] / GIB:.1f} GiB, all servers up {f['memory_with_servers_bytes'] / GIB:.1f} GiB; "
          f"peak {class_peak / GIB:.1f} GiB in class, {peaks.get('grading', 0) / GIB:.1f} GiB grading "
          f"(of {total / GIB:.1f} GiB)")
    print(f"                  about {per_student / GIB:.2f} GiB per student at the peak: this machine's memory "
          f"holds about {holds} such students")
    print("phases            " + ", ".join(f"{k} {v:.0f} s" for k, v in f["phases_s"].items()))
    print(f"left behind       {len(f['left_behind'])} process(es)")
    for name, errors in f["errors"].items():
        print(f"  {name}: {'; '.join(errors)[:400]}")
    print("result            " + ("all invariants hold" if not f["failures"] else "FAILED: " + "; ".join(f["failures"])))


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
