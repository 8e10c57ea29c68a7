"""The feedback page (hub/jupyter/course_feedback.py) in Chromium: no script of the notebook runs.

The page holds the student's notebook: its markdown and its outputs. A ``<script>`` there (or an
``onerror=`` attribute) ran when the page opened, in the student's server's origin. The page
is made here as ``feedback`` makes it (nbconvert with the course's template), served by a
Jupyter server with the course's extension, and opened in Chromium: the formula is typeset by
MathJax, and none of the notebook's scripts ran. The screenshot is
``artifacts/feedback-page/feedback.png``.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import nbgrader
from book_browser import CHROMIUM_ARGS, find_chromium
from nbconvert import HTMLExporter
from playwright.sync_api import expect, sync_playwright

from distlab.grade.pipeline import feedback

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "feedback-page"
SCRIPTS = {
    "markdown": "<script>window.ranFromMarkdown = true; document.title = 'owned';</script>",
    "output": "<script>window.ranFromOutput = true;</script>",
    "handler": "<img src='nowhere.png' onerror='window.ranFromHandler = true'>",
    "loaded": "<script src='../../../../../files/evil.js'></script>",
}


def _feedback_html() -> str:
    """A notebook with a formula and a student's scripts, through the course's feedback template."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## My notes\n\nThe mean is $\\bar{x} = \\frac{1}{N}\\sum_i x_i$.\n\n"
                                              + SCRIPTS["markdown"] + "\n" + SCRIPTS["loaded"]),
                nbformat.v4.new_code_cell("display(HTML(...))", outputs=[nbformat.v4.new_output(
                    "display_data", data={"text/html": SCRIPTS["output"] + SCRIPTS["handler"]})])]
    bootstrap = Path(nbgrader.__file__).parent / "server_extensions/formgrader/static/node_modules/bootstrap/dist/css"
    exporter = HTMLExporter(template_name=feedback.TEMPLATE_NAME, extra_template_basedirs=[str(feedback.TEMPLATES)],
                            extra_template_paths=[str(bootstrap)])   # as nbgrader's GenerateFeedback sets them
    body, _ = exporter.from_notebook_node(nb, resources={"nbgrader": {"notebook": "notes", "score": 3, "max_score": 6, "late_penalty": 0}})
    assert SCRIPTS["markdown"] in body and SCRIPTS["output"] in body   # the page does hold them
    return body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_script_of_the_notebook_runs_and_formulas_render(tmp_path):
    root = tmp_path / "home"
    page = root / "00-first-steps" / "feedback" / "2026-11-25 10:00:00.000000 UTC" / "notes.html"
    page.parent.mkdir(parents=True)
    page.write_text(_feedback_html())
    (root / "evil.js").write_text("window.ranFromFile = true;")
    token, port = secrets.token_hex(16), _free_port()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        'c.ServerApp.jpserver_extensions = {"course_feedback": True}\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "hub" / "jupyter"), os.environ.get("PYTHONPATH", "")]),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser", "--allow-root",
         f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}"],
        env=env, stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/course/feedback/00-first-steps/feedback/2026-11-25%2010:00:00.000000%20UTC/notes.html?token={token}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    policy = answer.headers["Content-Security-Policy"]
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
        assert "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";")[0], policy
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
            tab = browser.new_page()
            tab.goto(url)
            expect(tab.locator("mjx-container").first).to_be_visible(timeout=30_000)   # MathJax ran
            tab.wait_for_load_state("networkidle")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(ARTIFACTS / "feedback.png"))
            ran = tab.evaluate("[window.ranFromMarkdown, window.ranFromOutput, window.ranFromHandler, "
                               "window.ranFromFile, document.title]")
            browser.close()
        assert ran[:4] == [None, None, None, None], ran
        assert ran[4] == "notes"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
        server.wait(timeout=30)
