"""A notebook opened by its URL starts its kernel without asking (hub/jupyter/course_sessions.py).

What it closes, reproduced on purpose: JupyterLab starts a notebook's kernel by itself only if
it holds the server's kernel specs when the notebook opens. It asks for them once as the page
loads (``GET /api/kernelspecs``); if that request fails (a busy node, a proxy that drops it),
its spec manager keeps none until its next poll a minute later, and the notebook opens with
"Select Kernel", "No Kernel" preselected. The browser here drops every answer to
``/api/kernelspecs``. Without the extension the dialog appears (checked too, so the test
knows it still reproduces the problem); with it the kernel is running before the page loads,
JupyterLab connects to it and never asks.

The two other pieces of hub/jupyter that act when a notebook opens are tried here too, on the
same kind of server: ``course_contents`` (a released notebook opens unmodified, though its
kernel reports other metadata than the release holds; without it, JupyterLab marks it
modified, checked too) and ``course_launch`` (the book's launch button opens the student's
fetched copy of a released assignment, the copy that is handed in).

A real JupyterLab server (the course environment's, with the hub's Jupyter settings from
hub/jupyter) on loopback, driven by Debian's Chromium; both are this test's children and are
ended with it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import eavesdrop
import hub_support
import pytest
from book_browser import CHROMIUM_ARGS, find_chromium
from hub_support import demo
from playwright.sync_api import expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "course-sessions"
TOKEN = "course-sessions-test"


@pytest.fixture
def jupyter_server(tmp_path):
    """Start ``jupyter lab`` with the hub's settings, with or without ``course_sessions``;
    ``start.root`` is then the new server's root folder (two notebooks in it)."""
    started = []

    def start(with_course_sessions: bool, *options: str, extra_env: dict | None = None) -> str:
        root = tmp_path / f"root-{len(started)}"
        root.mkdir()
        for name, kernel in (("chapter.ipynb", "python3"), ("odd-kernel.ipynb", "not-installed")):
            (root / name).write_text(json.dumps(notebook(kernel)))
        port = demo.free_port()
        switch = [] if with_course_sessions else ["--ServerApp.jpserver_extensions=course_sessions=False"]
        env = dict(os.environ, JUPYTER_CONFIG_PATH=f"{REPO / 'hub' / 'jupyter'}:{Path(sys.prefix) / 'etc' / 'jupyter'}",
                   JUPYTER_PATH=str(Path(sys.prefix) / "share" / "jupyter"),
                   PYTHONPATH=str(Path(__file__).resolve().parent),   # for read_only_authorizer below
                   **(extra_env or {}))
        log = (tmp_path / f"server-{len(started)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
             "--ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", *switch,
             *options],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=root)   # a hub's server starts in the home, its root: nbgrader fetches into the working folder
        started.append(proc)
        start.root = root
        url = f"http://127.0.0.1:{port}"
        demo._wait_for(lambda: answers(f"{url}/api/status?token={TOKEN}"), 60, "jupyter lab did not answer",
                       proc, Path(log.name))
        return url

    yield start
    for proc in started:
        demo._end(proc, grace=20)   # SIGTERM to its group, SIGKILL to what is left of it after 20 s


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def notebook(kernel: str) -> dict:
    """A notebook as the course releases them: one code cell, the kernel named in its metadata."""
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": "first", "metadata": {},
                       "outputs": [], "source": "import torch"}],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def sessions(url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{url}/api/sessions?token={TOKEN}", timeout=10) as answer:
        return {s["path"]: s["kernel"]["name"] for s in json.load(answer)}


def open_without_kernelspecs(url: str, notebook: str, shot: str):
    """Open ``notebook`` in Chromium, every request for /api/kernelspecs failing.

    Returns what the student sees once the notebook has settled: the dialog's title (or None)
    and whether the status bar shows a running kernel, idle.
    """
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})

            page.route("**/api/kernelspecs*", lambda route: route.abort("connectionreset"))
            page.goto(f"{url}/lab/tree/{notebook}?token={TOKEN}")
            expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
            # Settled: either a dialog asks, or the kernel is running and idle.
            dialog = page.locator(".jp-Dialog")
            # the status bar names the running kernel and its state ("python3 | Idle"; "No Kernel"
            # when there is none); the toolbar's execution indicator reads 'idle' with no kernel at all
            idle = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"))
            expect(dialog.or_(idle).first).to_be_visible(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / shot))
            title = dialog.locator(".jp-Dialog-header").first.inner_text().strip() if dialog.count() else None
            return title, idle.count() == 1
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_the_extension_a_lost_kernelspecs_answer_makes_jupyterlab_ask_for_a_kernel(jupyter_server):
    """The problem, reproduced: what a student met on a loaded node."""
    url = jupyter_server(with_course_sessions=False)
    title, idle = open_without_kernelspecs(url, "chapter.ipynb", "without-extension.png")
    assert title == "Select Kernel", f"no kernel dialog (but {title!r}): the test no longer reproduces the problem"
    assert not idle
    assert sessions(url) == {}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_notebook_opened_by_its_url_has_its_kernel_before_jupyterlab_asks(jupyter_server):
    url = jupyter_server(with_course_sessions=True)
    title, idle = open_without_kernelspecs(url, "chapter.ipynb", "with-extension.png")
    assert title is None, f"JupyterLab asked the student: {title!r}"
    assert idle, "the notebook's kernel is not running"
    assert sessions(url) == {"chapter.ipynb": "python3"}

    # A notebook naming a kernel this server lacks gets the server's default kernel; a path
    # that is no notebook starts nothing; opening the same notebook again starts no second kernel.
    for path in ("odd-kernel.ipynb", "missing.ipynb", "chapter.ipynb"):
        with urllib.request.urlopen(f"{url}/lab/tree/{path}?token={TOKEN}", timeout=30) as answer:
            assert answer.status == 200
    assert sessions(url) == {"chapter.ipynb": "python3", "odd-kernel.ipynb": "python3"}

    # The route still asks who is there: without the token, no session and no page.
    request = urllib.request.Request(f"{url}/lab/tree/odd-kernel.ipynb")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert "/login" in answer.url


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_user_who_may_not_run_kernels_starts_none_by_opening_a_notebook(jupyter_server):
    """A server whose authorizer lets a visitor read but not run (tests/hub/read_only_authorizer.py):
    opening a notebook's URL still shows JupyterLab's page, and starts no kernel."""
    url = jupyter_server(True, "--ServerApp.authorizer_class=read_only_authorizer.ReadOnly")
    with urllib.request.urlopen(f"{url}/lab/tree/chapter.ipynb?token={TOKEN}", timeout=30) as answer:
        assert answer.status == 200 and b"jupyter-config-data" in answer.read()
    with urllib.request.urlopen(f"{url}/api/sessions?token={TOKEN}", timeout=10) as answer:
        assert json.load(answer) == []


# -- course_contents: opening a released notebook does not mark it modified -----------------

def released_by_another_python(root: Path) -> Path:
    """Chapter 0's release as an instructor's machine with another Python would write it: its
    ``language_info`` names that Python's version, its kernelspec that install's display name."""
    nb = json.loads((REPO / "notebooks" / "00-first-steps" / "00-first-steps.ipynb").read_text())
    nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.10.99", "mimetype": "text/x-python",
                                       "codemirror_mode": {"name": "ipython", "version": 3},
                                       "pygments_lexer": "ipython3", "nbconvert_exporter": "python",
                                       "file_extension": ".py"}
    path = root / "released.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


def modified_after_opening(url: str, notebook: str, shot: str) -> bool:
    """Open ``notebook`` in Chromium, wait until its kernel is idle and a little more: does
    JupyterLab mark it modified (the dirty mark on its tab)?"""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{url}/lab/tree/{notebook}?token={TOKEN}")
            expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
            hub_support.expect_kernel_idle(page)
            page.wait_for_timeout(3000)   # the kernel's metadata reaches the model just before Idle shows
            page.screenshot(path=str(ARTIFACTS / shot))
            return page.locator(".jp-mod-dirty").count() > 0
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_released_notebook_opens_unmodified_though_another_python_released_it(jupyter_server):
    # The problem, reproduced with Jupyter Server's own contents manager: JupyterLab writes the
    # kernel's metadata, which differs from the release's, and marks the notebook modified.
    plain = jupyter_server(True, "--ServerApp.contents_manager_class="
                                 "jupyter_server.services.contents.largefilemanager.AsyncLargeFileManager")
    released_by_another_python(jupyter_server.root)
    assert modified_after_opening(plain, "released.ipynb", "released-plain-contents-manager.png"), \
        "opening did not mark the notebook modified: the test no longer reproduces the problem"

    url = jupyter_server(True)   # the hub's settings: hub/jupyter/course_contents.py
    on_disk = released_by_another_python(jupyter_server.root).read_bytes()
    assert not modified_after_opening(url, "released.ipynb", "released-course-contents-manager.png"), \
        "opening the released notebook marked it modified"
    # What the server handed JupyterLab is what this server's kernel reports; the file is untouched.
    with urllib.request.urlopen(f"{url}/api/contents/released.ipynb?token={TOKEN}", timeout=30) as answer:
        metadata = json.load(answer)["content"]["metadata"]
    assert metadata["kernelspec"] == {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    assert metadata["language_info"]["version"] == platform.python_version()
    assert (jupyter_server.root / "released.ipynb").read_bytes() == on_disk


# -- course_launch: the launch button's notebook is the one handed in -------------------------

def opened(url: str, path: str) -> str:
    """The path JupyterLab's page ends up showing after ``/lab/tree/<path>`` (redirects followed)."""
    with urllib.request.urlopen(f"{url}/lab/tree/{path}?token={TOKEN}", timeout=60) as answer:
        assert answer.status == 200
        final = urllib.parse.urlparse(answer.url).path
    return final.removeprefix("/lab/tree/")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_launch_buttons_notebook_is_the_fetched_assignment_once_released(jupyter_server, tmp_path):
    """The launch button (nbgitpuller) opens <clone>/notebooks/<slug>/<slug>.ipynb. With an
    assignment <slug> released, the server fetches it (once) and opens ~/<slug>/<slug>.ipynb,
    the copy the Assignments tab submits; without one, the clone's notebook opens."""
    slug = "00-first-steps"
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    url = jupyter_server(True, extra_env={"DISTLAB_HUB_EXCHANGE": str(exchange)})
    home = jupyter_server.root
    clone = home / "distlab" / "notebooks" / slug
    clone.mkdir(parents=True)
    release = REPO / "notebooks" / slug / f"{slug}.ipynb"
    shutil.copy(release, clone)
    launched = f"distlab/notebooks/{slug}/{slug}.ipynb"

    assert opened(url, launched) == launched           # nothing released: the clone's copy
    assert not (home / slug).exists()

    outbound = exchange / "distlab" / "outbound" / slug   # the instructor releases it (nbgrader's layout)
    outbound.mkdir(parents=True)
    shutil.copy(release, outbound)
    (outbound / "data.txt").write_text("given\n")
    fetched = home / slug / f"{slug}.ipynb"
    assert opened(url, launched) == f"{slug}/{slug}.ipynb"   # fetched, as the Assignments tab does
    assert fetched.read_bytes() == release.read_bytes() and (home / slug / "data.txt").exists()
    assert sessions(url).get(f"{slug}/{slug}.ipynb") == "python3"   # its kernel started with the page

    fetched.write_text(fetched.read_text().replace("raise NotImplementedError", "return 42", 1))
    mine = fetched.read_bytes()
    assert opened(url, launched) == f"{slug}/{slug}.ipynb"   # again: the student's work, never overwritten
    assert fetched.read_bytes() == mine

    fetched.unlink()                                          # a notebook the student deleted comes back,
    (home / slug / "notes.txt").write_text("mine\n")          # nothing else of theirs changes
    assert opened(url, launched) == f"{slug}/{slug}.ipynb"
    assert fetched.read_bytes() == release.read_bytes() and (home / slug / "notes.txt").read_text() == "mine\n"

    # Only the launch button's notebook of a released assignment is redirected.
    shutil.copy(release, clone / "other.ipynb")
    assert opened(url, f"distlab/notebooks/{slug}/other.ipynb") == f"distlab/notebooks/{slug}/other.ipynb"
    (home / "distlab" / "notebooks" / "99-not-released").mkdir()
    shutil.copy(release, home / "distlab" / "notebooks" / "99-not-released" / "99-not-released.ipynb")
    assert opened(url, "distlab/notebooks/99-not-released/99-not-released.ipynb") == \
        "distlab/notebooks/99-not-released/99-not-released.ipynb"


# -- kernels on Unix sockets: another account on the node cannot listen in (issue 44) -------

@pytest.fixture
def server_of_another_account():
    """``jupyter lab`` with the hub's settings, run as the numbered account
    :data:`eavesdrop.VICTIM_UID` (a student's server on a shared node), its home and root a
    fresh folder of that account; yields ``(url, home)``."""
    home = Path(tempfile.mkdtemp(prefix="dl-v-", dir="/tmp"))   # short, as a home is
    os.chown(home, eavesdrop.VICTIM_UID, eavesdrop.VICTIM_UID)
    home.chmod(0o700)
    port = demo.free_port()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           "JUPYTER_CONFIG_PATH": f"{REPO / 'hub' / 'jupyter'}:{Path(sys.prefix) / 'etc' / 'jupyter'}",
           "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter")}
    log = home.parent / f"{home.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["setpriv", f"--reuid={eavesdrop.VICTIM_UID}", f"--regid={eavesdrop.VICTIM_UID}", "--clear-groups",
             eavesdrop.python_for_any_account(), "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={home}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=home, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        demo._wait_for(lambda: answers(f"{url}/api/status?token={TOKEN}"), 90, "jupyter lab did not answer", proc, log)
        yield url, home, log
    finally:
        demo._end(proc, grace=20)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "server-of-another-account.log")
        shutil.rmtree(home, ignore_errors=True)
        log.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_another_account_on_the_node_cannot_listen_to_a_students_kernel(server_of_another_account):
    """The attack of issue 44, on a server with the hub's settings: a second account scans
    /proc/net/tcp (and /proc/net/unix) for the student's listening sockets and subscribes to
    each, while the student's kernel prints. It must hear nothing, and find no kernel port."""
    from jupyter_client import BlockingKernelClient

    url, home, log = server_of_another_account
    request = urllib.request.Request(f"{url}/api/kernels?token={TOKEN}", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        kernel_id = json.load(answer)["id"]
    [connection_file] = list(home.glob(f".local/share/jupyter/runtime/kernel-{kernel_id}.json"))
    info = json.loads(connection_file.read_text())

    # The student (the owner: root here reads the connection file) runs a cell that prints.
    marker = f"secret-answer-{os.getpid()}"
    client = BlockingKernelClient()
    client.load_connection_info(info)
    # no heartbeat: on a loaded machine a kernel still starting misses its beats, and the
    # client would take it for dead; the wait for its first reply is bound all the same
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=180)
        client.execute(f"import time\nfor _ in range(60):\n    print({marker!r}, flush=True)\n    time.sleep(0.1)")
        heard = eavesdrop.eavesdrop(eavesdrop.VICTIM_UID, seconds=4)
        owner_heard = ""
        deadline = time.monotonic() + 30
        while marker not in owner_heard and time.monotonic() < deadline:
            msg = client.get_iopub_msg(timeout=30)
            owner_heard += msg["content"].get("text", "")
    finally:
        client.stop_channels()
    assert marker in owner_heard, "the kernel did not print: the attack was not tried"   # the positive twin
    server_port = int(url.rsplit(":", 1)[1])
    assert not [h for h in heard["heard"] if marker in h], heard["heard"][:3]
    assert [e for e in heard["endpoints"] if e.startswith("tcp://")] == [f"tcp://127.0.0.1:{server_port}"], heard
    # How: Unix sockets in Jupyter's runtime folder, which only the student can enter.
    runtime = connection_file.parent
    assert info["transport"] == "ipc" and Path(info["ip"]).parent == runtime, info
    assert runtime.stat().st_mode & 0o777 == 0o700 and runtime.stat().st_uid == eavesdrop.VICTIM_UID
    assert "Kernel is running over TCP without encryption" not in log.read_text()
