"""The course hub, end to end, in a real browser: JupyterHub + batchspawner on the private
two-node Slurm cluster, PAM accounts, configurable-http-proxy from npm, nbgitpuller.

One module-scoped hub (hub/demo.py's ``course_hub``: the same pieces `make hub` brings up,
with a test course prefix ``dlt``, a class of 3 and a 20 s queue timeout). Students drive
Debian's Chromium through Playwright; screenshots of every step go to artifacts/hub/. Nothing is mocked: PAM
checks real passwords, every server is a Slurm job of its student, the notebook's ranks are
`srun` steps of that job.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import hub_support
import psutil
import pytest
from book_browser import CHROMIUM_ARGS, find_chromium
from hub_support import accounts, demo
from playwright.sync_api import expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]

COURSE = hub_support.course_name("dlt")
ARTIFACTS = REPO / "artifacts" / "hub"
# The idle culler's timeout on this module's hub (the course's default is an hour), and how
# often servers and proxy report activity. Every other test keeps its server busy (an open
# JupyterLab polls the server every few seconds): were a server in use culled, they would fail.
IDLE_TIMEOUT, ACTIVITY_INTERVAL = 90, 10
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def hub():
    yield from hub_support.course_hub_for_a_module(COURSE, students=3, queue_timeout=20, artifacts=ARTIFACTS,
                                                   idle_timeout=IDLE_TIMEOUT, activity_interval=ACTIVITY_INTERVAL)


@pytest.fixture(scope="module")
def chromium():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def empty_queue_after_each_test(request):
    """Each test starts with no job on the course's cluster: a test that fails with a server
    still running would otherwise take the nodes from the tests after it. The cluster is
    this module's own, so every job in its queue was started by these tests."""
    yield
    if "hub" not in request.fixturenames:
        return
    hub = request.getfixturevalue("hub")
    jobs = [row[0] for row in squeue(hub, "--format=%i")]
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=20,
                       env=dict(os.environ, SLURM_CONF=hub["slurm_conf"]))
        deadline = time.monotonic() + 60
        while squeue(hub) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not squeue(hub), f"jobs {jobs} are still in the queue a minute after scancel"


def squeue(hub, *args: str) -> list[list[str]]:
    out = subprocess.run(["squeue", "--noheader", *args], capture_output=True, text=True, timeout=20,
                         env=dict(os.environ, SLURM_CONF=hub["slurm_conf"]))
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


def log_in(chromium, hub, user: str, password: str, step: str):
    """A fresh browser profile on the hub's login page, the form filled in and sent."""
    page = chromium.new_context(viewport={"width": 1280, "height": 860}).new_page()
    page.set_default_timeout(30_000)
    page.goto(hub["url"] + "/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.screenshot(path=str(ARTIFACTS / f"{step}-login.png"))
    page.click("input[type=submit], button[type=submit]")
    return page


# `make hub`'s prerequisites (the course environment, Debian's packages, the proxy) are made by
# the time the tests run; -o keeps make from remaking any of them, so the recipe alone runs.
MADE = ["-o", ".venv/.installed", "-o", "system-deps", "-o", "hub/node_modules/.bin/configurable-http-proxy"]


def test_make_hub_prints_what_a_person_needs_and_sigterm_to_make_leaves_nothing_behind():
    """`make hub STUDENTS=5`, as a person runs it: up, sized for its class, the URL answers;
    then stopped as a script stops it (README): SIGTERM to make alone, which passes it on to
    demo.py. Nothing is left."""
    course, students = hub_support.course_name("dlu"), 5
    demo_cmd = [sys.executable, str(REPO / "hub" / "demo.py")]
    proc = subprocess.Popen(["make", "--no-print-directory", *MADE, "hub", f"STUDENTS={students}", f"COURSE={course}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 150
        while not any("Hub log:" in line for line in lines) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        printed = "".join(lines)
        assert "Hub log:" in printed, f"make hub did not come up:\n{printed}"
        url = re.search(r"hub is up: (http://127\.0\.0\.1:\d+)", printed).group(1)
        accounts_printed = re.findall(rf"^\s+({course}-\w+)\s+password (\S+)$", printed, re.M)
        assert sorted(user for user, _ in accounts_printed) == [f"{course}-instructor1"] + [
            f"{course}-student{i}" for i in range(1, students + 1)]
        # Five servers of the default profile (1 node, 2 cores), whole on a node: three on one,
        # two on the other. Each of the two nodes declares 6 CPUs (more than this machine has),
        # and Slurm takes them: the nodes are idle.
        assert demo.cpus_per_node_for(students) == 6
        assert f"Sized for {students} students" in printed and "each of the 2 nodes declares 6 CPUs" in printed
        slurm_conf = re.search(r"export SLURM_CONF=(\S+);", printed).group(1)
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %t"], capture_output=True, text=True, timeout=20,
                               env=dict(os.environ, SLURM_CONF=slurm_conf)).stdout.split("\n")
        assert sorted(line.split() for line in nodes if line) == [["distlab-n1", "6", "idle"], ["distlab-n2", "6", "idle"]]
        assert demo.launch_link(url) in printed
        assert re.search(r'distlab\.grade publish 00-first-steps --due "\d{4}-\d\d-\d\d 17:00:00 UTC"', printed), printed
        with urllib.request.urlopen(url + "/hub/login", timeout=10) as response:
            assert response.status == 200
        run_dir = Path(re.search(r"Hub log: (\S+)/hub\.log", printed).group(1))
        assert run_dir.is_dir()
        # This hub's culler, not any culler: another course's hub may start or end one meanwhile.
        its_cullers = cullers(below=proc.pid)
        assert its_cullers, "the hub runs no idle culler"
        # The instructor's printed steps, typed as printed: a login shell of the instructor's
        # account (not root), the course's variables, and `publish` from their own copy.
        become = re.search(rf"^\s+su - ({course}-instructor1)$", printed, re.M)
        source = re.search(r"^\s+(source \S+course-env\.sh)$", printed, re.M)
        publish = re.search(r"^\s+(python -m distlab\.grade publish 00-first-steps --due \"[^\"]+\")$", printed, re.M)
        assert become and source and publish, printed
        published = subprocess.run(["su", "-", become.group(1), "-c", f"{source.group(1)} && id -un && {publish.group(1)}"],
                                   capture_output=True, text=True, timeout=300)
        assert published.returncode == 0, published.stdout + published.stderr
        assert published.stdout.splitlines()[0] == become.group(1)
        released = run_dir / "exchange" / "distlab" / "outbound" / "00-first-steps" / "00-first-steps.ipynb"
        assert released.is_file() and released.stat().st_uid == pwd.getpwnam(become.group(1)).pw_uid

        demo_pid = int(re.search(r"\(process (\d+);", printed).group(1))
        assert psutil.Process(demo_pid).ppid() == proc.pid, "demo.py is not make's child"
        proc.send_signal(signal.SIGTERM)  # to make alone: it passes SIGTERM on to demo.py and waits
        assert proc.wait(timeout=90) == -signal.SIGTERM, "".join(lines)   # then ends as SIGTERM asked
        reader.join(timeout=10)
        assert "stopped. The accounts stay" in "".join(lines), "".join(lines)   # demo.py tore down in full
        assert not run_dir.exists(), "the run folder is left behind"
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if str(run_dir) in " ".join(p.info["cmdline"] or [])]
        assert not left, f"processes of the demo hub outlived it: {left}"
        assert not [pid for pid in its_cullers if is_culler(pid)], (
            "the hub's idle culler (a session of its own) outlived it")
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/hub/login", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        cleaned = subprocess.run([*demo_cmd, "clean", "--course", course], capture_output=True, text=True, timeout=60)
    assert f"removed {students + 1} account(s)" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert not accounts.course_accounts(course)


def test_make_hub_stopped_while_it_comes_up_ends_what_it_had_started():
    """SIGTERM to demo.py while its Slurm cluster is up but the hub is not yet: the start-up
    unwinds (demo.StopAsked), ending the cluster's daemons; the run folder goes, and nothing
    of this demo is left running. Before issue 50 the signal waited for the whole start-up."""
    course = hub_support.course_name("dlv")
    demo_cmd = [sys.executable, str(REPO / "hub" / "demo.py")]
    proc = subprocess.Popen([*demo_cmd, "up", "--course", course, "--students", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not re.search(r"coming up in (\S+) ", "".join(lines)) and time.monotonic() < deadline:
            time.sleep(0.2)
        run_dir = Path(re.search(r"coming up in (\S+) ", "".join(lines)).group(1))
        while not (run_dir / "c" / "ready.json").exists() and proc.poll() is None and time.monotonic() < deadline + 120:
            time.sleep(0.2)
        assert (run_dir / "c" / "ready.json").exists(), "".join(lines)   # the cluster is up ...
        assert "hub is up" not in "".join(lines)                        # ... the hub not yet
        daemons = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
        assert daemons, "no process of the demo's cluster runs"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, "".join(lines)
        reader.join(timeout=10)
        assert "stopped while coming up (SIGTERM)" in "".join(lines), "".join(lines)
        assert not run_dir.exists(), "the run folder is left behind"
        assert not [p.pid for p in daemons if alive_and_named(p, run_dir)], "the cluster's daemons outlived the stop"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        subprocess.run([*demo_cmd, "clean", "--course", course], capture_output=True, text=True, timeout=60)
    assert not accounts.course_accounts(course)


def alive_and_named(process: psutil.Process, folder: Path) -> bool:
    """Does ``process`` still run, with ``folder`` in its command line (not a new one with its pid)?"""
    try:
        return process.is_running() and str(folder) in " ".join(process.cmdline())
    except psutil.Error:
        return False


def is_culler(pid: int) -> bool:
    try:
        return any("jupyterhub_idle_culler" in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def cullers(below: int) -> set[int]:
    """The idle cullers among the descendants of process ``below``."""
    try:
        descendants = psutil.Process(below).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {process.pid for process in descendants if is_culler(process.pid)}


def test_a_proxy_left_by_a_hub_that_died_is_ended_and_no_other_process(tmp_path):
    """JupyterHub starts configurable-http-proxy in a session of its own and stops it only when
    it shuts down cleanly; a hub killed, or ended while still starting on a loaded machine, left
    the proxy running for good. demo.end_proxy ends it from the hub's pid file, and only if that
    pid is still the proxy with our API port (not a process that took the number since)."""
    def start_proxy(api_port: int) -> subprocess.Popen:
        proxy = subprocess.Popen([str(REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"),
                                  "--ip", "127.0.0.1", "--port", str(demo.free_port()), "--api-ip", "127.0.0.1",
                                  "--api-port", str(api_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)   # as JupyterHub starts it
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{api_port}/api/routes", timeout=2)
            except urllib.error.HTTPError:
                return proxy     # it answers (403: no token)
            except OSError:
                assert proxy.poll() is None and time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.2)
            else:
                return proxy

    pid_file = tmp_path / "proxy.pid"
    ours, theirs = demo.free_port(), demo.free_port()
    proxy, other_proxy = start_proxy(ours), start_proxy(theirs)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        for pid in (bystander.pid, other_proxy.pid):    # the file names a process that is not our proxy
            pid_file.write_text(f"{pid}\n")
            demo.end_proxy(pid_file, ours)
        assert bystander.poll() is None and other_proxy.poll() is None, "ended a process that was not ours"
        pid_file.write_text(f"{proxy.pid}\n")
        demo.end_proxy(pid_file, ours)
        assert proxy.wait(timeout=5) is not None
        demo.end_proxy(pid_file, ours)                  # again, with the proxy gone: nothing to do
        demo.end_proxy(tmp_path / "no-such.pid", ours)  # a hub that never started one
    finally:
        for proc in (proxy, other_proxy, bystander):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def test_wrong_password_and_unknown_user_are_refused_and_nothing_spawns(hub, chromium):
    student = f"{COURSE}-student1"
    for user, password in ((student, "not-" + hub["passwords"][student]), ("nobody-here", "x")):
        page = log_in(chromium, hub, user, password, "00-refused")
        expect(page.locator("body")).to_contain_text("Invalid username or password")
        assert "/hub/login" in page.url
        page.screenshot(path=str(ARTIFACTS / f"00-refused-{user}.png"))
        page.context.close()
    assert squeue(hub) == [], "a refused login started a job"
    # The hub's start and the refusals: no warning but those a person caused (the refusals'
    # "Failed login"); the proxy logged "404 GET /hub/login" while demo.py asked too early.
    log = Path(hub["log"]).read_text()
    assert "Failed login for 'nobody-here'" in log
    assert hub_support.uncaused_warnings(log) == [], log[-3000:]


def test_the_hub_log_is_root_s_alone(hub):
    """At DEBUG the hub's log holds every server's API token; at any level, who did what."""
    log = Path(hub["log"])
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.stat().st_uid == 0
    student = f"{COURSE}-student1"
    peek = subprocess.run(["/usr/sbin/runuser", "-u", student, "--", "cat", str(log)],
                          capture_output=True, text=True, timeout=30)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr and not peek.stdout


def test_a_student_opens_chapter_0_from_the_book_and_runs_ranks_on_two_nodes(hub, chromium):
    student, other = f"{COURSE}-student1", f"{COURSE}-student2"
    hub_log_at_start = len(Path(hub["log"]).read_bytes())
    page = log_in(chromium, hub, student, hub["passwords"][student], "01")

    # The spawn form: two profiles; pick the two-node one.
    expect(page.locator("text=2 nodes, 1 task each")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "02-spawn-form.png"))
    page.check("input[name=profile][value='2x1']")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{student}/lab"), timeout=120_000)
    expect(page.locator(".jp-LabShell")).to_be_visible(timeout=60_000)  # JupyterLab, not an error page
    page.screenshot(path=str(ARTIFACTS / "03-server-running.png"))

    # The server is a Slurm job of the student, on two nodes; its log is in a hidden folder of
    # the student's home: the home's file browser shows nothing the student did not make.
    jobs = squeue(hub, "--format=%i %u %T %D")
    assert len(jobs) == 1 and jobs[0][1:] == [student, "RUNNING", "2"], jobs
    job = jobs[0][0]
    home = Path(f"/home/{student}")
    server_log_file = hub_support.job_log(student, job)
    assert server_log_file.exists() and server_log_file.stat().st_uid == home.stat().st_uid
    assert [p.name for p in home.iterdir() if not p.name.startswith(".")] == [], "the job left files in view"
    assert "Spawner.db is deprecated" not in Path(hub["log"]).read_text(), "a warning no operator can act on"

    # The book's launch button for chapter 0: nbgitpuller clones the course into the home. This
    # course has released no assignment (tests/hub/test_exchange.py has): the clone's notebook opens.
    page.goto(demo.launch_link(hub["url"]))
    page.wait_for_url(re.compile(r"/lab/tree/distlab/notebooks/00-first-steps/00-first-steps\.ipynb"),
                      timeout=120_000)
    notebook = page.locator(".jp-NotebookPanel:visible")
    expect(notebook.locator(".jp-Cell").first).to_be_visible(timeout=60_000)
    hub_support.expect_kernel_idle(page)  # started with the page: no "Select Kernel" (hub/jupyter/course_sessions.py)
    assert not page.locator(".jp-Dialog").count(), page.locator(".jp-Dialog").first.inner_text()
    # Opening it changed nothing: the notebook's metadata is already what this kernel (the hub's
    # Python) reports (hub/jupyter/course_contents.py), so JupyterLab has nothing to mark modified.
    hub_support.expect_unmodified(page)
    server_log = server_log_file.read_text()
    assert ("course_sessions: started kernel 'python3' for distlab/notebooks/00-first-steps/00-first-steps.ipynb"
            in server_log), server_log[-3000:]
    page.screenshot(path=str(ARTIFACTS / "04-chapter-0-opened.png"))
    assert (home / "distlab" / "notebooks" / "00-first-steps" / "00-first-steps.ipynb").exists()
    assert (home / "distlab").stat().st_uid == (home).stat().st_uid, "the clone is not the student's"

    # Run the notebook's first code cell, then a cell on two ranks: each reports its node.
    first = notebook.locator(".jp-CodeCell").first
    hub_support.run_cell(page, first)
    expect(first.locator(".jp-InputArea-prompt")).to_contain_text("[1]", timeout=90_000)
    page.keyboard.press("Escape")
    page.keyboard.press("a")  # a new cell above the one now selected
    page.keyboard.press("Enter")
    page.keyboard.insert_text("%load_ext distlab")
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Escape")
    page.keyboard.press("a")
    page.keyboard.press("Enter")
    torchrun_folders = set(Path("/tmp").glob("torchelastic_*"))
    page.keyboard.insert_text('%%distributed -n 2\nimport os\nprint("runs on", os.environ["SLURMD_NODENAME"])')
    page.keyboard.press("Shift+Enter")
    # Wait for what is asserted: the cell has finished and both ranks' lines are in its output
    # (each rank prints when it gets there; the first line shown says nothing of the second).
    ranks_cell = notebook.locator(".jp-CodeCell", has_text="%%distributed -n 2")
    expect(ranks_cell.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=120_000)
    output = ranks_cell.locator(".jp-OutputArea")
    for rank in (0, 1):
        expect(output).to_contain_text(re.compile(rf"\[rank {rank}\][^\n]*runs on \S+"))
    text = output.inner_text()
    page.screenshot(path=str(ARTIFACTS / "05-ranks-on-two-nodes.png"))
    nodes = dict(re.findall(r"\[rank (\d)\][^\n]*runs on (\S+)", text))
    assert set(nodes) == {"0", "1"} and len(set(nodes.values())) == 2, text
    # torchrun, on each node, left no log folder in the node's /tmp (it never removes one)
    left = [p for p in set(Path("/tmp").glob("torchelastic_*")) - torchrun_folders
            if p.stat().st_uid == home.stat().st_uid]
    assert not left, left

    # The server listens where the demo tells it: on its node's network, which on the namespaced
    # cluster is the node's own namespace with the private bridge as its only network (0.0.0.0
    # there); on the loopback-only cluster, the loopback.
    listening = {address for p in psutil.process_iter(["cmdline", "username"])
                 if p.info["username"] == student and "jupyterhub-singleuser" in " ".join(p.info["cmdline"] or [])
                 for address in hub_support.listening_addresses(p.pid)}
    namespaced = hub["cluster"]["network"]["mode"] == "namespaces"
    assert listening == ({"0.0.0.0"} if namespaced else {"127.0.0.1"}), listening

    # From inside this server, another student's home cannot be read.
    page.keyboard.press("Escape")
    page.keyboard.press("a")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(f'import os\nos.listdir("/home/{other}")')
    page.keyboard.press("Shift+Enter")
    expect(notebook.locator(".jp-OutputArea-output", has_text="PermissionError").first).to_be_visible(timeout=30_000)

    # Save, follow the launch link again: nbgitpuller pulls and keeps the student's edits.
    page.keyboard.press("Control+s")
    expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=20_000)
    page.goto(demo.launch_link(hub["url"]))
    page.wait_for_url(re.compile(r"/lab/tree/distlab/notebooks/00-first-steps/00-first-steps\.ipynb"),
                      timeout=120_000)
    expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
    saved = (home / "distlab" / "notebooks" / "00-first-steps" / "00-first-steps.ipynb").read_text()
    assert "%%distributed -n 2" in saved, "following the launch link again lost the student's edits"

    # Quiet logs: a spawn, the launch link, a notebook and its ranks left no warning in the hub's
    # log nor in the job's that no person caused (e.g. "Rolling back dirty objects" from
    # batchspawner, "'extra_template_paths' was found in both NotebookApp and ServerApp" from
    # Notebook 7's configuration shim, "is slow to start" for every Slurm job).
    hub_log = Path(hub["log"]).read_bytes()[hub_log_at_start:].decode(errors="replace")
    assert "Rolling back dirty objects" not in hub_log and "is slow to start" not in hub_log, hub_log[-3000:]
    assert hub_support.uncaused_warnings(hub_log) == [], hub_log[-3000:]
    server_log = server_log_file.read_text()
    assert "extra_template_paths" not in server_log, server_log[-3000:]
    assert hub_support.uncaused_warnings(server_log) == [], server_log[-3000:]

    # Another student can neither open this server through the hub ...
    intruder = log_in(chromium, hub, other, hub["passwords"][other], "06")
    intruder.wait_for_url(re.compile(r"/hub/spawn"))
    response = intruder.goto(f"{hub['url']}/user/{student}/lab")
    expect(intruder.locator("body")).to_contain_text(f"You do not have permission to access Server at /user/{student}/")
    intruder.screenshot(path=str(ARTIFACTS / "06-other-student-refused.png"))
    assert response.status == 403 and not intruder.locator(".jp-LabShell").count()
    intruder.context.close()
    # ... nor read this student's files from a process of theirs (the other direction was
    # tried from inside this student's server above).
    peek = subprocess.run(["/usr/sbin/runuser", "-u", other, "--", "ls", str(home)],
                          capture_output=True, text=True, timeout=20)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr

    # Stop the server from the hub's control panel: the job ends.
    page.goto(hub["url"] + "/hub/home")
    page.click("#stop")
    expect(page.locator("#stop")).to_be_hidden(timeout=60_000)
    expect(page.locator("#start")).to_have_text(re.compile(r"^\s*Start My Server\s*$"))
    page.screenshot(path=str(ARTIFACTS / "07-server-stopped.png"))
    deadline = time.monotonic() + 30
    while squeue(hub) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert squeue(hub) == [], "the server's job is still in the queue after Stop"
    assert (home / "distlab" / "notebooks").is_dir(), "stopping the server lost the student's files"
    page.context.close()


def scontrol(hub, *args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=20,
                   env=dict(os.environ, SLURM_CONF=hub["slurm_conf"]))


def test_a_server_on_the_second_node_is_reached_through_the_proxy_at_that_nodes_address(hub, chromium):
    """The proxy reaches each server at its node's address (Slurm's NodeAddr), never at a
    loopback: on the namespaced cluster (scripts/cluster_network.py) node 2's 127.0.0.1 is node 2's
    own, and its name need not resolve on the hub's machine."""
    env = dict(os.environ, SLURM_CONF=hub["slurm_conf"])
    address = hub["cluster"]["network"]["addresses"]["distlab-n2"]
    cpus = subprocess.run(["sinfo", "-h", "-N", "-n", "distlab-n1", "-o", "%c"], capture_output=True, text=True,
                          timeout=20, env=env, check=True).stdout.split()[0]
    subprocess.run(["sbatch", "--parsable", "--output=/dev/null", "--nodelist=distlab-n1", "--nodes=1",
                    f"--ntasks={cpus}", "--wrap=sleep 600"], check=True, capture_output=True, timeout=30, env=env,
                   cwd="/tmp")  # node 1 is full: the student's server can start on node 2 only
    student = f"{COURSE}-student3"
    page = log_in(chromium, hub, student, hub["passwords"][student], "05")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{student}/lab"), timeout=120_000)
    expect(page.locator(".jp-LabShell")).to_be_visible(timeout=60_000)  # JupyterLab, through the proxy
    page.screenshot(path=str(ARTIFACTS / "05-server-on-node-2.png"))
    assert [row[1] for row in squeue(hub, "--format=%u %N") if row[0] == student] == ["distlab-n2"]
    status = page.request.get(f"{hub['url']}/user/{student}/api/status")  # the server's own API, proxied
    assert status.ok and "started" in status.json(), status.text()
    route = re.search(rf"Adding user {student} to proxy /user/{student}/ => (\S+)", Path(hub["log"]).read_text())
    assert route and route.group(1).startswith(f"http://{address}:"), route and route.group(0)
    page.goto(hub["url"] + "/hub/home")
    page.click("#stop")
    deadline = time.monotonic() + 60
    while [row for row in squeue(hub, "--format=%u") if row[0] == student] and time.monotonic() < deadline:
        time.sleep(0.5)
    page.context.close()


def test_a_job_that_cannot_start_is_cancelled_and_the_student_told_why(hub, chromium):
    """Partition down: the job waits, the queue timeout (20 s here) cancels it, the spawn page says why."""
    student = f"{COURSE}-student2"
    scontrol(hub, "update", f"PartitionName={hub['cluster']['partition']}", "State=DOWN")
    try:
        page = log_in(chromium, hub, student, hub["passwords"][student], "08")
        page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
        # The bar says why the job waits and where it is in the queue.
        expect(page.locator("body")).to_contain_text("pending in the queue (reason: PartitionDown): 1 of 1 waiting",
                                                     timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "08-spawn-pending-partition-down.png"))
        expect(page.locator("body")).to_contain_text("Your server could not start", timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "09-spawn-failed-partition-down.png"))
        message = page.locator("body").inner_text()
        assert "PartitionDown" in message and "has been cancelled" in message, message
        assert "400 SpawnRefused" not in message, message  # the student reads the sentence, not the class
        # An expected refusal is one line of the hub's log, not an "Unhandled error" with a traceback.
        log = Path(hub["log"]).read_text()
        assert re.search(rf"Not starting {student}'s server .*PartitionDown", log), log[-3000:]
        assert f"Unhandled error starting {student}'s server" not in log, log[-3000:]
        assert squeue(hub) == [], "the refused job is still in the queue"
        page.context.close()
    finally:
        scontrol(hub, "update", f"PartitionName={hub['cluster']['partition']}", "State=UP")


def test_a_refusal_names_every_profile_that_would_start_now():
    """The advice comes from the cores each node has free, not from the profiles' sizes: one
    core free on each of two nodes starts "2 nodes, 1 task each" (and "1 node, 1 task"), never
    "1 node, 2 tasks", though all three need no more than the two cores free."""
    from course_spawner import PROFILES, cores, idle_cores, refusal_advice

    assert min(cores(p) for p in PROFILES.values()) == 1, "the hub offers a one-core profile for a full cluster"
    one_free_on_each = refusal_advice("Resources", 2, PROFILES, [1, 1])
    assert one_free_on_each.endswith("would start now: 2 nodes, 1 task each; 1 node, 1 task."), one_free_on_each
    assert "1 node, 2 tasks" not in one_free_on_each
    assert refusal_advice("Resources", 2, PROFILES, [2, 0]).endswith("would start now: 1 node, 2 tasks; 1 node, 1 task.")
    assert refusal_advice("Resources", 2, PROFILES, [3, 2]).endswith(
        "would start now: 1 node, 2 tasks; 2 nodes, 1 task each; 1 node, 1 task.")
    full = refusal_advice("Resources", 1, PROFILES, [0, 0])
    assert "would start now" not in full and "try again in a few minutes" in full
    # Slurm did not say what is free: the smaller profiles, if there are any.
    assert "pick a smaller profile (1 node, 1 task)." in refusal_advice("Resources", 2, PROFILES, None)
    assert "try again in a few minutes" in refusal_advice("Resources", 1, PROFILES, None)
    assert refusal_advice("PartitionDown", 2, PROFILES, [4, 4]) == (
        "The partition is down: try again later or ask your instructor.")
    # sinfo's %C is allocated/idle/other/total; a node down or drained has its cores in "other".
    assert idle_cores("distlab-n1 3/1/0/4\ndistlab-n2 0/0/4/4\n") == [1, 0]


def test_a_slurm_query_that_fails_or_hangs_gives_no_answer_and_leaves_no_process_behind():
    """The spawner's one way to ask Slurm (``sinfo`` for the free cores, ``squeue`` for the
    queue): what it printed, or None when it could not start, failed or took too long; a
    command past its timeout is killed, not left running beside the hub."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from course_spawner import slurm_answer

    def answer(cmd: list[str], **timeout) -> str | None:
        # A thread of its own: Playwright's sync API (this module's browser) holds this thread's event loop.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, slurm_answer(cmd, **timeout)).result()

    assert answer(["echo", "distlab-n1 0/2/0/2"]) == "distlab-n1 0/2/0/2\n"
    assert answer(["false"]) is None
    assert answer(["/nonexistent/sinfo"]) is None
    start = time.monotonic()
    assert answer(["sleep", "60"], timeout=1) is None
    assert time.monotonic() - start < 30
    sleeping = [p for p in psutil.Process().children() if p.name() == "sleep" and p.status() != psutil.STATUS_ZOMBIE]
    assert not sleeping, f"the query that timed out is still running: {sleeping}"


def test_every_student_of_any_class_fits_the_demo_cluster_with_the_default_profile():
    """`make hub STUDENTS=N` for every N up to 40, odd ones included: Slurm deals the class's
    servers out to the nodes whole (the first node with room first, as select/cons_tres
    does with equal nodes), and every one starts. Before issue 50 a class of 3 got 3 CPUs a
    node: two servers ran and the third fitted on neither node."""
    from course_spawner import PROFILES, fits

    default, nodes = next(iter(PROFILES.values())), len(demo.slurm_cluster.NODES)
    per_node_of_a_job = default["tasks_per_node"] * default["cpus_per_task"]

    def all_start(students: int, declared: int) -> bool:
        free = [declared] * nodes
        for _ in range(students):
            if not fits(default, free):
                return False
            for i in [i for i in range(nodes) if free[i] >= per_node_of_a_job][:default["nodes"]]:
                free[i] -= per_node_of_a_job
        return True

    assert demo.cpus_per_node_needed(3, default, nodes) == 4
    assert not all_start(3, 3), "the sizing before issue 50 (3 CPUs a node for 3 students) is not caught"
    for students in range(1, 41):
        declared = demo.cpus_per_node_needed(students, default, nodes)
        assert all_start(students, declared), f"{students} students, {declared} CPUs a node: one waits"
        # and no more than that: a server's cores less on each node and someone would wait
        assert not all_start(students, declared - per_node_of_a_job), (students, declared)


def test_a_class_of_three_holds_three_servers_and_a_refusal_offers_two_nodes(hub, chromium):
    """The module's hub is a class of 3 (an odd class): three jobs of the default profile's
    shape, one per student, all run at once. Then only one core is left free on each node:
    the default profile waits ("Resources"), and the refusal names the profiles that would
    start, "2 nodes, 1 task each" first."""
    students = sorted(user for user in hub["passwords"] if "student" in user)
    assert len(students) == 3
    env = dict(os.environ, SLURM_CONF=hub["slurm_conf"])
    default = next(iter(demo.PROFILES.values()))
    for student in students:       # as each student, the shape the spawner asks for
        subprocess.run(["/usr/sbin/runuser", "-u", student, "--", "sbatch", "--parsable", "--output=/dev/null",
                        f"--nodes={default['nodes']}", f"--ntasks-per-node={default['tasks_per_node']}",
                        f"--cpus-per-task={default['cpus_per_task']}", "--wrap=sleep 600"],
                       check=True, capture_output=True, timeout=30, env=env, cwd="/tmp")
    deadline = time.monotonic() + 60
    while sorted(row[1] for row in squeue(hub, "--format=%i %T")) != ["RUNNING"] * 3 and time.monotonic() < deadline:
        time.sleep(1)
    rows = squeue(hub, "--format=%i %T %r")
    assert sorted(row[1] for row in rows) == ["RUNNING"] * 3, f"a student of three waits: {rows}"
    subprocess.run(["scancel", *[row[0] for row in rows]], check=True, capture_output=True, timeout=30, env=env)
    deadline = time.monotonic() + 60
    while squeue(hub) and time.monotonic() < deadline:
        time.sleep(0.5)

    # Hold all but one core of each node (root's jobs): one core free on each.
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c"], capture_output=True, text=True, timeout=20,
                           env=env, check=True).stdout.split("\n")
    for node, cpus in (line.split() for line in nodes if line.strip()):
        subprocess.run(["sbatch", "--parsable", "--output=/dev/null", f"--nodelist={node}", "--nodes=1",
                        f"--ntasks={int(cpus) - 1}", "--wrap=sleep 600"], check=True, capture_output=True,
                       timeout=30, env=env, cwd="/tmp")
    student = students[2]
    page = log_in(chromium, hub, student, hub["passwords"][student], "13")
    page.check("input[name=profile][value='1x2']")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    expect(page.locator("body")).to_contain_text("Your server could not start", timeout=120_000)
    page.screenshot(path=str(ARTIFACTS / "13-refused-two-nodes-offered.png"))
    message = page.locator("body").inner_text()
    assert "Slurm's reason: Resources" in message, message
    assert "these profiles would start now: 2 nodes, 1 task each; 1 node, 1 task." in message, message
    page.context.close()


def test_a_server_past_its_time_limit_is_noticed_and_can_start_again(hub, chromium):
    """Slurm ends the job at its --time limit (cut to 1 minute here); within a minute of that
    the hub shows the server stopped and offers a new start; the student's files stay."""
    student = f"{COURSE}-student2"
    page = log_in(chromium, hub, student, hub["passwords"][student], "10")
    page.check("input[name=profile][value='1x2']")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    expect(page.locator(".jp-LabShell")).to_be_visible(timeout=120_000)
    kept = Path(f"/home/{student}/my-work.txt")
    subprocess.run(["/usr/sbin/runuser", "-u", student, "--", "sh", "-c", f"echo mine > {kept}"], check=True)
    (job, user, nodes, limit), = [row[:4] for row in squeue(hub, "--format=%i %u %D %l")]
    assert (user, nodes, limit) == (student, "1", "2:00:00"), "the default is not a lab session's 2 hours"
    # JupyterLab warns 5 minutes before the limit: cut it to 4 minutes from the job's start.
    warning = page.get_by_text(re.compile(r"Your server ends in about \d minutes? \(at \d\d:\d\d\)"))
    expect(warning).to_have_count(0)
    scontrol(hub, "update", f"JobId={job}", "TimeLimit=4")
    expect(warning).to_be_visible(timeout=75_000)  # the page asks every 30 s, the server caches 15 s
    expect(page.get_by_text(re.compile(r"its time limit\. Save your notebooks: files stay, kernels end\.$"))).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "10-time-limit-warning.png"))
    scontrol(hub, "update", f"JobId={job}", "TimeLimit=1")  # the shortest limit Slurm has
    deadline = time.monotonic() + 120
    while squeue(hub) and time.monotonic() < deadline:
        time.sleep(1)
    assert not squeue(hub), "Slurm did not end the job at its time limit"
    ended = time.monotonic()
    page.goto(hub["url"] + "/hub/home")
    offered = re.compile(r"^\s*Start My Server\s*$")

    def offers_a_start() -> bool:
        return not page.locator("#stop").is_visible() and bool(offered.match(page.locator("#start").inner_text()))

    while not offers_a_start() and time.monotonic() - ended < 60:
        time.sleep(2)
        page.reload()
    noticed = time.monotonic() - ended
    page.screenshot(path=str(ARTIFACTS / "10-time-limit-reached-start-again.png"))
    assert offers_a_start(), "the hub still shows the server as running a minute after its job ended"
    print(f"the hub noticed the job's end after {noticed:.0f} s")
    assert kept.read_text() == "mine\n"
    page.context.close()


@pytest.mark.timeout(600)
def test_an_idle_server_is_culled_and_its_slurm_job_ends(hub, chromium):
    """jupyterhub-idle-culler (a service of the hub) stops a server nobody has used for the idle
    timeout (90 s on this module's hub): the student closed the tab and walked away. Stopping
    cancels the Slurm job, so its cores go back to the queue; the student's files stay.
    Not before the timeout: the job still runs most of the timeout after the tab closed."""
    student = f"{COURSE}-student1"
    page = log_in(chromium, hub, student, hub["passwords"][student], "11")
    page.check("input[name=profile][value='1x2']")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    expect(page.locator(".jp-LabShell")).to_be_visible(timeout=120_000)
    (job, user), = [row[:2] for row in squeue(hub, "--format=%i %u")]
    assert user == student
    kept = Path(f"/home/{student}/notes.txt")
    subprocess.run(["/usr/sbin/runuser", "-u", student, "--", "sh", "-c", f"echo kept > {kept}"], check=True)
    page.context.close()   # no tab open: nothing asks the server anything any more
    closed = time.monotonic()

    time.sleep(IDLE_TIMEOUT - 2 * ACTIVITY_INTERVAL)
    assert squeue(hub, "--format=%i") == [[job]], "the server was ended before its idle timeout"
    cull_every = max(10, min(300, IDLE_TIMEOUT // 6))   # hub/jupyterhub_config.py's rule
    bound = IDLE_TIMEOUT + cull_every + ACTIVITY_INTERVAL + 90   # + stopping a job on a loaded machine
    while squeue(hub) and time.monotonic() - closed < bound:
        time.sleep(2)
    waited = time.monotonic() - closed
    assert not squeue(hub), f"the idle server's job still runs {waited:.0f} s after its tab closed"
    print(f"the idle server's job ended {waited:.0f} s after its tab closed (idle timeout {IDLE_TIMEOUT} s)")
    log = Path(hub["log"]).read_text()
    assert re.search(rf"Culling server {student} \(inactive for", log), log[-3000:]
    assert kept.read_text() == "kept\n", "culling lost the student's files"

    page = log_in(chromium, hub, student, hub["passwords"][student], "12")   # back after the break
    expect(page.locator("form#spawn_form")).to_be_visible(timeout=60_000)    # a new start is offered
    page.screenshot(path=str(ARTIFACTS / "12-after-idle-cull-spawn-again.png"))
    page.context.close()


def test_after_a_release_the_launch_link_leaves_one_tab_hands_in_no_checkpoint_and_squeue_names_the_student(
        hub, chromium):
    """Last in this module: it releases chapter 0 (the tests above open the clone's copy).

    A student opened chapter 0 through its launch link before the release, so JupyterLab saved
    the clone's tab in their workspace. After the release the same link opens the fetched copy,
    and JupyterLab restored the clone's tab beside it: two tabs named 00-first-steps.ipynb.
    Now the clone's tab is closed first (hub/jupyter/course_workspaces.py): one tab, the copy
    handed in. That copy's hand-in (nbgrader submit in the server job's own environment) leaves
    JupyterLab's checkpoint out and warns of nothing; and `squeue` there names the student whole.
    """
    student, slug = f"{COURSE}-student3", "00-first-steps"
    clone = f"distlab/notebooks/{slug}/{slug}.ipynb"
    home = Path(f"/home/{student}")
    page = log_in(chromium, hub, student, hub["passwords"][student], "14")
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    expect(page.locator(".jp-LabShell")).to_be_visible(timeout=120_000)

    page.goto(demo.launch_link(hub["url"]))
    page.wait_for_url(re.compile(rf"/lab/tree/{re.escape(clone)}"), timeout=120_000)
    expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
    hub_support.expect_kernel_idle(page)

    def saved_tabs() -> str:
        return "".join(f.read_text() for f in (home / ".jupyter" / "lab" / "workspaces").glob("*.jupyterlab-workspace"))

    deadline = time.monotonic() + 30
    while f'"notebook:{clone}"' not in saved_tabs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert f'"notebook:{clone}"' in saved_tabs(), "JupyterLab did not save the clone's tab: nothing to restore"
    page.screenshot(path=str(ARTIFACTS / "14-clone-tab-before-release.png"))

    teacher = hub["instructor"]
    published = subprocess.run(hub_support.instructor_account.command(teacher, "publish", slug), cwd=teacher["course"],
                               capture_output=True, text=True, timeout=400)
    assert published.returncode == 0, published.stdout + published.stderr

    page.goto(demo.launch_link(hub["url"]))
    page.wait_for_url(re.compile(rf"/lab/tree/{slug}/{slug}\.ipynb"), timeout=120_000)
    expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
    hub_support.expect_kernel_idle(page)
    page.wait_for_timeout(3000)    # every tab JupyterLab restores is there by now
    tabs = page.locator("#jp-main-dock-panel .lm-TabBar-tab").filter(has_text=f"{slug}.ipynb")
    page.screenshot(path=str(ARTIFACTS / "15-one-tab-after-release.png"))
    expect(tabs).to_have_count(1)
    assert f"Path: {slug}/{slug}.ipynb" in (tabs.first.get_attribute("title") or ""), tabs.first.get_attribute("title")
    assert f'"notebook:{clone}"' not in saved_tabs()

    # Save (JupyterLab keeps a checkpoint beside the notebook), then hand in as the server would.
    page.locator(".jp-NotebookPanel:visible .jp-Cell").first.click()
    page.keyboard.press("Control+s")
    checkpoint = home / slug / ".ipynb_checkpoints" / f"{slug}-checkpoint.ipynb"
    deadline = time.monotonic() + 30
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert checkpoint.exists(), "JupyterLab kept no checkpoint: the hand-in below would prove nothing"
    server, = [p for p in psutil.process_iter(["cmdline", "username"]) if p.info["username"] == student
               and "jupyterhub-singleuser" in " ".join(p.info["cmdline"] or [])]
    job_env = server.environ()
    assert job_env.get("SQUEUE_FORMAT"), "the server's job has no SQUEUE_FORMAT"

    def in_the_job(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/sbin/runuser", "-u", student, "--", "env", "-i",
                               *[f"{k}={v}" for k, v in job_env.items()], "bash", "-c", f"cd ~ && {command}"],
                              capture_output=True, text=True, timeout=120)

    submitted = in_the_job(f"python -m nbgrader submit {slug}")
    assert submitted.returncode == 0 and "Submitted as" in submitted.stderr, submitted.stderr
    assert "EXTRA" not in submitted.stderr and "Possible missing" not in submitted.stderr, submitted.stderr
    handed_in, = Path(hub["exchange"]).glob(f"distlab/inbound/{student}+{slug}+*")
    assert (handed_in / f"{slug}.ipynb").is_file()
    assert not list(handed_in.rglob(".ipynb_checkpoints")), sorted(p.name for p in handed_in.iterdir())

    # squeue, as the student types it in the server's terminal: their job, their whole name.
    listed = in_the_job("squeue").stdout
    job = job_env["SLURM_JOB_ID"]
    row, = [line.split() for line in listed.splitlines() if line.split()[:1] == [job]]
    assert student in row, listed
    page.context.close()
