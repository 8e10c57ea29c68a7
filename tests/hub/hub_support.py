"""The demo course hub for a test module (tests/hub/test_hub.py, tests/hub/test_exchange.py).

hub/demo.py's ``course_hub`` with the module's own course prefix, so two modules running at
once (pytest-xdist) never share accounts, cluster or ports. Leaving it copies the hub's log to
the module's artifacts, removes the course's accounts and the run folder.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import expect

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hub"))
import accounts  # noqa: E402
import demo  # noqa: E402
import instructor_account  # noqa: E402, F401 (the hub tests take it from here)

TAG_VARIABLE = "DISTLAB_TEST_COURSE_TAG"


def course_name(prefix: str) -> str:
    """A test's course prefix, with ``$DISTLAB_TEST_COURSE_TAG`` appended: ``make test-repeat``
    sets it, so that its hubs (accounts ``dltr-student1``...) run beside a ``make test``'s
    (``dlt-student1``...) without sharing an account."""
    tag = os.environ.get(TAG_VARIABLE, "")
    assert re.fullmatch(r"[a-z0-9]{0,4}", tag), f"{TAG_VARIABLE}={tag!r}: up to 4 lower-case letters or digits"
    return prefix + tag


def course_hub_for_a_module(course: str, students: int, queue_timeout: int, artifacts: Path, **options):
    """A generator for a module-scoped fixture (``yield from`` it): yields course_hub's dict.
    ``options`` go to course_hub as they are (idle_timeout, activity_interval)."""
    artifacts.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{course}-", dir="/tmp"))  # short: Slurm's sockets live below
    try:
        with demo.course_hub(run_dir, course, students=students, queue_timeout=queue_timeout, **options) as info:
            yield info
    except (demo.HubError, demo.slurm_cluster.ClusterError) as exc:
        pytest.fail(str(exc), pytrace=False)
    finally:
        if (run_dir / "hub.log").exists():
            shutil.copy(run_dir / "hub.log", artifacts / "hub.log")
        for job_log in Path("/home").glob(f"{course}-*/{JOB_LOGS}/*.log"):  # before the homes go
            shutil.copy(job_log, artifacts / f"job-{job_log.parent.parent.name}-{job_log.name}")
        accounts.remove_accounts(course)
        shutil.rmtree(run_dir, ignore_errors=True)


JOB_LOGS = ".jupyterhub-slurm"  # in a student's home: each server job's log (hub/slurm-job.sh)


def job_log(student: str, job: str) -> Path:
    return Path(f"/home/{student}") / JOB_LOGS / f"{job}.log"


# A log line at warning level or above: JupyterHub's and Jupyter server's "[W ...", "[E ...",
# "[C ..." and configurable-http-proxy's "warn" and "error" (coloured), Python's warnings.
_WARNING = re.compile(r"^\[[WEC] \d{4}-|\[ConfigProxy\] (?:\x1b\[\d+m)?(?:warn|error)|\w+Warning: ", re.M)

# Warnings a person caused, with the person: they may appear in a log; nothing else may.
CAUSED_BY_A_PERSON = {
    "Running JupyterHub without SSL": "the operator (the demo listens on 127.0.0.1 only)",
    "Event loop was unresponsive": "whoever loaded the machine (tests beside a book build)",
    "Failed login for": "someone who typed a wrong password or user name",
    "PAM Authentication failed": "the same person, as PAM saw it",
    "403 POST /hub/login": "the same person, as the hub answered them",
    # The proxy logs a peer that drops a connection mid-request (a closed browser tab, a server
    # whose job ended) as an "Uncaught Exception" and carries on serving: jupyterhub#3355.
    "read ECONNRESET": "whoever closed a page or ended a server while the proxy still spoke to it",
    # The same for the other direction: a page left (following a link elsewhere) while the proxy
    # still wrote to its websocket, logged the same way (http-proxy-3#51, under the proxy 5.2).
    "write EPIPE": "whoever left a page while the proxy still wrote to its websocket",
}


def uncaused_warnings(text: str) -> list[str]:
    """The warning lines of a log (hub, proxy, a server's job) no person's action explains."""
    lines = [line for line in text.splitlines() if _WARNING.search(line)]
    return [line for line in lines if not any(known in line for known in CAUSED_BY_A_PERSON)]


def run_cell(page, cell, tries: int = 3) -> None:
    """Run a JupyterLab ``cell`` and wait until it has finished (its prompt shows a number).

    Shift+Enter is pressed again if JupyterLab took no notice (a click that lands while the
    notebook is still loading selects nothing); after ``tries`` ignored presses it fails.
    """
    prompt = cell.locator(".jp-InputArea-prompt")
    for _ in range(tries):
        answer_known_dialogs(page)
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            expect(prompt).not_to_have_text(re.compile(r"^\[ \]:$"), timeout=10_000)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError(f"the cell did not start running after {tries} tries")
    expect(prompt).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=120_000)


def expect_kernel_idle(page, timeout: float = 60_000) -> None:
    """Wait until the open notebook's kernel is running and idle, as JupyterLab's status bar
    says ("python3 | Idle"). The toolbar's execution indicator is no proof: it reads 'idle'
    with no kernel at all."""
    status = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"))
    expect(status).to_be_visible(timeout=timeout)


def expect_unmodified(page, settle_s: float = 3) -> None:
    """The open notebook shows no unsaved change (no dirty mark on its tab) ``settle_s`` seconds
    after its kernel is idle (call :func:`expect_kernel_idle` first). JupyterLab writes the
    kernel's metadata into the notebook once the kernel's info has arrived, before its status
    bar reads Idle; the wait leaves room for the model's change to reach the tab."""
    page.wait_for_timeout(settle_s * 1000)
    marked = page.locator(".jp-mod-dirty")   # on the document's tab (and its title) while modified
    assert marked.count() == 0, f"opening the notebook marked it modified: {marked.first.inner_text()!r}"


# JupyterLab dialogs a loaded machine can raise while a notebook opens, and the answer a
# student gives each: a request that timed out shows "Server Connection Error" (dismiss: the
# next request goes through); a notebook opened from inside JupyterLab (the Assignments tab)
# while the kernel specs are missing shows "Select Kernel" (accept the preselected kernel).
# A notebook opened by its URL (the launch link) never asks: the server has started its kernel
# before the page loads (hub/jupyter/course_sessions.py), and test_hub asserts no dialog there.
KNOWN_DIALOGS = {"Select Kernel": ".jp-mod-accept", "Server Connection Error": ".jp-mod-reject, .jp-mod-accept"}


def answer_known_dialogs(page) -> None:
    """Answer a known dialog (see KNOWN_DIALOGS) that covers the notebook; fail with the
    text of any other, which would otherwise only show as a click that never lands."""
    dialog = page.locator(".jp-Dialog")
    if not dialog.count():
        return
    title = dialog.locator(".jp-Dialog-header").first.inner_text().strip()
    text = dialog.first.inner_text()
    print(f"JupyterLab showed a dialog {title!r}: {text!r}")
    if title not in KNOWN_DIALOGS:
        raise AssertionError(f"JupyterLab shows a dialog {title!r} over the notebook: {text!r}")
    dialog.locator(KNOWN_DIALOGS[title]).first.click()
    expect(dialog).to_have_count(0, timeout=10_000)


def listening_addresses(pid: int) -> set[str]:
    """The IPv4 addresses process ``pid`` listens on, read from its own network namespace's
    ``/proc/PID/net/tcp`` (psutil reads this process's namespace, where a node's sockets do not show)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue   # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = set()
    for line in table:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:   # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(fields[1].split(":")[0])[::-1]))
    return found
