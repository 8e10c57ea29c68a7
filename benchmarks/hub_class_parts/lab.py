"""A student in the lab, through the course hub as a browser would go: log in, press Start and follow
the spawn, open chapter 0 through the book's launch link, run the first cells on two ranks in the
server's own Slurm job, and log off (steps 2 to 5 of benchmarks/hub_class.py's docstring)."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import demo
import requests
from course_spawner import DEFAULT_RUNTIME, PROFILES

from .kernel import KernelChannel, execute
from .student import SLUG, Student

LOAD_EXT = "%load_ext distlab\nimport os\nos.environ.get('SLURM_JOB_ID')"
DISTRIBUTED_CELL = ("%%distributed -n 2\nimport os\n"
                    "(rank, world_size, os.environ.get('SLURM_JOB_ID'), os.environ.get('SLURMD_NODENAME'))")


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
