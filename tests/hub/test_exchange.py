"""Hand-in and feedback through the course hub: nbgrader's exchange, end to end.

The demo hub (hub/demo.py's ``course_hub``, course prefix ``dle``) with six students. The
instructor (their own unprivileged account, from their own copy of the course, as on the demo
machine: root starts the hub and the sandbox, nothing more) publishes chapter 0 with
``python -m distlab.grade``;
student 1 works in a browser (the book's launch button opens the assignment, fetched for them
into the folder the Assignments tab submits from; answer, run on their Slurm allocation, submit
from the Assignments tab; later fetch the feedback and read the score); the others use nbgrader's CLI as their
own Unix users: one correct (submitted twice, the latest counts), one blank, one hostile, one
malformed, one late. The instructor collects, autogrades with distlab's hardened grader,
makes feedback and returns it. Then: the grades, that no hidden test reaches any feedback, and
that the students cannot see each other's work nor the instructor's files.
"""

from __future__ import annotations

import datetime
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grading_support as grading
import hub_support
import nbformat
import pytest
from book_browser import CHROMIUM_ARGS, find_chromium
from hub_support import demo, instructor_account
from playwright.sync_api import expect, sync_playwright
from process_support import run_in_own_group

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "grader" / "hostile"))
import build as hostile  # noqa: E402

from distlab.grade.pipeline import feedback as feedback_pages  # noqa: E402

COURSE = hub_support.course_name("dle")
FORMULA = r"$\sum_{r=0}^{N-1} g_r / N$"   # typed by the browser student into a Markdown cell
SLUG = grading.SLUG
ARTIFACTS = REPO / "artifacts" / "exchange"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a hang guard: under load average 15 the flow took over 600 s


@pytest.fixture(scope="module")
def course():
    yield from hub_support.course_hub_for_a_module(COURSE, students=6, queue_timeout=30, artifacts=ARTIFACTS)


def instructor(course, *args: str) -> subprocess.CompletedProcess:
    """``python -m distlab.grade ARGS`` as the instructor runs it on the hub machine: as the
    course's instructor account, never root (hub/instructor_account.py)."""
    teacher = course["instructor"]
    proc = subprocess.run(instructor_account.command(teacher, *args), cwd=teacher["course"], capture_output=True,
                          text=True, timeout=400)
    (ARTIFACTS / "instructor.log").open("a").write(f"$ grade {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
    return proc


def as_student(course, user: str, script: str, **env: str) -> subprocess.CompletedProcess:
    """A shell ``script`` run by ``user`` with the environment their server's job has."""
    job_env = {"HOME": f"/home/{user}", "USER": user, "LOGNAME": user,
               "PATH": f"{Path(course['server_python']).parent}:/usr/bin:/bin",
               "JUPYTER_CONFIG_PATH": f"{REPO / 'hub' / 'jupyter'}:{Path(sys.prefix) / 'etc' / 'jupyter'}",
               "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter"),
               "DISTLAB_HUB_EXCHANGE": str(course["exchange"]), **env}
    # In a process group of its own, ended whatever happens: runuser keeps its command in our
    # group, and subprocess.run's timeout would kill runuser alone, leaving an nbgrader submit
    # running on (benchmarks/hub_class.py measured it landing after the deadline).
    return run_in_own_group(["/usr/sbin/runuser", "-u", user, "--", "env", "-i",
                             *[f"{k}={v}" for k, v in job_env.items()], "bash", "-c", f"cd ~ && {script}"], 120)


def submit_cli(course, user: str, notebook: bytes, options: str = "") -> None:
    """Fetch, replace the notebook with ``notebook``, submit: the nbgrader CLI, as ``user``."""
    staged = Path(tempfile.mkdtemp(dir="/tmp", prefix="dlex-nb-"))
    os.chmod(staged, 0o755)
    (staged / "answer.ipynb").write_bytes(notebook)
    os.chmod(staged / "answer.ipynb", 0o644)
    try:
        proc = as_student(course, user, f"(test -d {SLUG} || python -m nbgrader fetch_assignment {SLUG}) && "
                                        f"cp {staged}/answer.ipynb {SLUG}/{SLUG}.ipynb && "
                                        f"python -m nbgrader submit {SLUG} {options}")
        assert proc.returncode == 0 and "Submitted as" in proc.stderr + proc.stdout, proc.stderr
    finally:
        shutil.rmtree(staged)


def student_uids(course) -> set[int]:
    return {pwd.getpwnam(user).pw_uid for user in course["passwords"] if "student" in user}


def released_notebook(course) -> Path:
    return Path(course["exchange"]) / "distlab" / "outbound" / SLUG / f"{SLUG}.ipynb"


def open_assignments(page) -> None:
    page.click("text=Nbgrader")
    page.click(".lm-Menu-itemLabel >> text=Assignment List")
    expect(page.locator("#released_assignments_list")).to_be_attached()


def test_a_class_hands_in_through_the_exchange_and_reads_its_feedback(course):
    students = sorted(u for u in course["passwords"] if "student" in u)
    browser_student, correct, blank, hostile_student, malformed, late = students
    assert instructor(course, "publish", SLUG).returncode == 0, (ARTIFACTS / "instructor.log").read_text()

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS)
        page = chromium.new_page(viewport={"width": 1280, "height": 860})
        page.set_default_timeout(60_000)

        # -- Student 1, in the browser: log in, start a server (a Slurm job), then follow the
        # book's launch button for the chapter (an nbgitpuller link: it clones the course).
        page.goto(course["url"] + "/hub/login")
        page.fill("input[name=username]", browser_student)
        page.fill("input[name=password]", course["passwords"][browser_student])
        page.click("input[type=submit], button[type=submit]")
        page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
        expect(page.locator(".jp-LabShell")).to_be_visible(timeout=120_000)
        page.goto(demo.launch_link(course["url"], f"notebooks/{SLUG}/{SLUG}.ipynb"))
        # The button opens the assignment as the Assignments tab fetches it (~/<slug>/<slug>.ipynb,
        # fetched by hub/jupyter/course_launch.py), not the clone's copy, which is never handed in.
        page.wait_for_url(re.compile(rf"/user/{browser_student}/lab/tree/{SLUG}/{SLUG}\.ipynb"), timeout=120_000)
        home = Path(f"/home/{browser_student}")
        fetched_copy = home / SLUG / f"{SLUG}.ipynb"
        assert fetched_copy.is_file() and fetched_copy.stat().st_uid == home.stat().st_uid
        assert (home / "distlab" / "notebooks" / SLUG / f"{SLUG}.ipynb").is_file(), "nbgitpuller did not clone"
        notebook = page.locator(".jp-NotebookPanel:visible")
        expect(notebook.locator(".jp-CodeCell").first).to_be_visible(timeout=60_000)
        hub_support.expect_kernel_idle(page)
        # Opening it changed nothing: the hub's kernel (the server's Python) reported other
        # metadata than the release holds, and JupyterLab marked the notebook modified.
        hub_support.expect_unmodified(page)
        page.screenshot(path=str(ARTIFACTS / "01-launch-button-opened.png"))

        # Answer task 1, run its test on the allocation, save.
        answer = notebook.locator(".jp-CodeCell", has_text="def my_rank():")
        answer.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+a")
        page.keyboard.insert_text('def my_rank():\n    """My global rank."""\n    return dist.get_rank()')
        cells = notebook.locator(".jp-CodeCell")
        hub_support.run_cell(page, cells.nth(0))                                          # imports
        hub_support.run_cell(page, answer)                                                # the answer
        # A note of the student's own, with a formula: the feedback page shows it typeset.
        page.keyboard.press("Escape")
        page.keyboard.press("b")        # a new cell below the answer ...
        page.keyboard.press("m")        # ... as Markdown
        page.keyboard.press("Enter")
        page.keyboard.insert_text(f"My note: {FORMULA}")
        page.keyboard.press("Shift+Enter")
        task1_tests = notebook.locator(".jp-CodeCell", has_text="# Task 1 tests")
        hub_support.run_cell(page, task1_tests)                                           # 4 ranks, srun
        assert not task1_tests.locator(".jp-OutputArea-output[data-mime-type*='error']").count()
        page.keyboard.press("Control+s")
        expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "02-answered-and-tested.png"))
        assert "return dist.get_rank()" in fetched_copy.read_text()

        # The Assignments tab lists the assignment as fetched (nothing left to fetch), its
        # notebook being the one just saved.
        open_assignments(page)
        expect(page.locator(f"#released_assignments_list .list_item:has-text('{SLUG}')")).to_have_count(0)
        fetched = page.locator(f"#fetched_assignments_list .list_item:has-text('{SLUG}')").first
        expect(fetched.locator("button:has-text('Submit')")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "03-assignments-fetched.png"))

        # Validate from the Assignments tab (nbgrader runs the notebook: tasks 2 and 3 still fail).
        page.click(".lm-TabBar-tab:has-text('Assignments')")
        page.click("#refresh_assignments_list")
        fetched.locator("a.assignment-notebooks-link").click()
        fetched.locator(".nested_list_item button:has-text('Validate')").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("NotImplementedError", timeout=180_000)
        page.screenshot(path=str(ARTIFACTS / "04-validated.png"))
        dialog.locator("button").last.click()

        # Submit from the Assignments tab.
        page.screenshot(path=str(ARTIFACTS / "05-before-submit.png"))
        fetched.locator("button:has-text('Submit')").click()
        expect(page.locator(f"#submitted_assignments_list .list_item:has-text('{SLUG}')").first).to_be_visible()

        # -- The other students, through nbgrader's CLI as their own Unix users.
        release = released_notebook(course)
        solved = grading.with_answers(release, grading.solution_answers(SLUG))
        submit_cli(course, correct, release.read_bytes())      # a first, blank try ...
        submit_cli(course, correct, solved)                    # ... then the real one: the latest counts
        submit_cli(course, blank, release.read_bytes())
        submit_cli(course, hostile_student, hostile.build(hostile.specs()["patch_checks"], str(release)))
        submit_cli(course, malformed, hostile.build(hostile.specs()["malformed_notebook"], str(release)))
        # An impostor: the blank student hands in the solution under the correct student's name.
        # (nbgrader's --student option names the submitter; nothing stops a student from using it)
        submit_cli(course, blank, solved, options=f"--student={correct}")
        # The deadline passes; then the late student submits a correct notebook.
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        assert instructor(course, "due", SLUG, now).returncode == 0
        submit_cli(course, late, solved)

        # -- Students kept apart, while the submissions sit in the exchange.
        inbound = Path(course["exchange"]) / "distlab" / "inbound"
        mine = sorted(p.name for p in inbound.iterdir() if p.name.startswith(f"{correct}+"))
        assert len(mine) == 3, mine  # two of the student's own, one by the impostor: all kept
        peek = as_student(course, blank, f"ls {inbound}")
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
        teacher = course["instructor"]
        for private in (REPO / "solutions", REPO / "grader", REPO / ".git", course["grading"], teacher["course"]):
            peek = as_student(course, blank, f"ls {private}")
            assert peek.returncode != 0 and "Permission denied" in peek.stderr, private

        # -- The instructor: collect, autograde (clean room), feedback, return.
        collected = instructor(course, "collect", SLUG)
        assert collected.returncode == 0, collected.stdout + collected.stderr
        assert re.search(rf"REFUSED '{correct}\+.*names '{correct}' but was made by {blank}", collected.stdout)
        # What student 1 handed in is the notebook the launch button opened, with the answer.
        work = Path(course["grading"])
        handed_in = (work / "submitted" / browser_student / SLUG / f"{SLUG}.ipynb").read_text()
        assert "return dist.get_rank()" in handed_in and "My note:" in handed_in
        graded = instructor(course, "autograde", SLUG)
        log = graded.stdout + graded.stderr
        assert re.search(rf"{malformed} NOT GRADED \(scores 0\): .*Notebook does not appear to be JSON", log), log[-3000:]
        # Not root, yet each submission's processes are capped together: make hub delegated
        # control groups to the instructor's account (cgroups.delegate). Without them this said
        # "No cap on a submission's processes together (this account may not create ...)".
        assert "No cap on a submission's processes together" not in log, log[-3000:]
        assert re.search(r"The clean room and its ranks used [\d.]+ CPU-s \(cap: \d+\)", log), log[-3000:]
        assert instructor(course, "feedback", SLUG).returncode == 0
        assert instructor(course, "return", SLUG).returncode == 0
        # Least privilege: every file the grading commands made (gradebook, copies of the
        # submissions, graded notebooks, feedback, what `return` put in the exchange) belongs to
        # the instructor's account. Root made none of them: nothing a student left was ever
        # handled with root's rights.
        owner = pwd.getpwnam(teacher["user"]).pw_uid
        made = [work, *work.rglob("*"), *(Path(course["exchange"]) / "distlab").rglob("*")]
        by_others = sorted(str(p) for p in made if p.lstat().st_uid not in (owner, *student_uids(course)))
        assert not by_others, f"made by someone other than the instructor (root?): {by_others[:5]}"
        assert any(p.lstat().st_uid == owner for p in (work / "autograded").rglob("*.ipynb"))

        # -- The grades.
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gradebook:
            def final(student: str) -> tuple[float, float]:
                submission = gradebook.find_submission(SLUG, student)
                return submission.score, submission.late_submission_penalty
            assert final(browser_student) == (1.0, 0.0)       # task 1 only
            assert final(correct) == (6.0, 0.0)               # the latest of its own submissions
            assert final(blank) == (0.0, 0.0)
            assert final(hostile_student) == (4.0, 0.0)       # task 2 (what it attacks) 0, the rest full
            assert final(late) == (6.0, 6.0)                  # full marks, all taken by the late penalty
            try:                                              # graded 0, or never entered at all
                assert gradebook.find_submission(SLUG, malformed).score == 0.0
            except MissingEntry:
                pass
        # No hidden test line reaches any feedback.
        feedback = "".join(p.read_text() for p in (work / "feedback").rglob("*.html"))
        assert feedback and not [line for line in grading.hidden_test_lines(SLUG) if line in feedback]

        # Another student cannot list the returned feedback either.
        peek = as_student(course, blank, f"ls {Path(course['exchange']) / 'distlab' / 'feedback'}")
        assert peek.returncode != 0 and "Permission denied" in peek.stderr

        # -- Student 1 fetches the feedback in the Assignments tab and reads the score.
        page.click("#refresh_assignments_list")
        submitted = page.locator(f"#submitted_assignments_list .list_item:has-text('{SLUG}')").first
        submitted.locator("button:has-text('Fetch Feedback')").click()
        expect(submitted.locator("a:has-text('view feedback')")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "06-feedback-fetched.png"))
        # One click on "(view feedback)" opens the feedback page (hub/jupyter/labextensions):
        # not a move of the file browser into a folder, not an HTML file behind "Trust HTML".
        requested: list[str] = []   # by every page of the student's browser from here on
        page.context.on("request", lambda request: requested.append(request.url))
        with page.context.expect_page() as opened:
            submitted.locator("a:has-text('view feedback')").click()
        feedback_page = opened.value
        feedback_page.wait_for_load_state()
        assert f"/user/{browser_student}/course/feedback/{SLUG}/feedback/" in feedback_page.url, feedback_page.url
        body = feedback_page.locator("body")
        expect(body).to_contain_text(re.compile(r"Score:\s*1\.0\s*/\s*6\.0"))  # what is asserted
        # The formula is typeset by MathJax from the student's own server: offline, no CDN.
        expect(feedback_page.locator("mjx-container").first).to_be_visible(timeout=30_000)
        feedback_page.wait_for_load_state("networkidle")
        feedback_page.screenshot(path=str(ARTIFACTS / "07-feedback-score.png"), full_page=False)
        outside = [url for url in requested if not url.startswith(course["url"] + "/")]
        assert not outside, f"the feedback page asked for something outside the hub: {outside}"
        assert any("/course/mathjax/" in url for url in requested), requested
        text = body.inner_text()
        assert "NotImplementedError" in text  # why task 2 failed, as its test cell reported it
        assert "My note:" in text and "\\sum_" not in text, "the formula was not typeset"
        # Each test is named after its task and what it checks, with its verdict.
        assert "Test cell" not in text and "Grade cell" not in text, text[:3000]
        assert re.search(r"Task 1 [^\n]*checks my_rank\(\) on 4 ranks: passed", text), text[:3000]
        assert re.search(r"Task 2 [^\n]*: failed", text), text[:3000]
        released = nbformat.read(str(released_notebook(course)), as_version=4)
        named, _ = feedback_pages.NameTests().preprocess(released, {})
        for cell in named.cells:
            if "distlab_feedback" in cell.metadata:
                label = f"{cell.metadata.distlab_feedback.task} — checks {cell.metadata.distlab_feedback.checks}"
                assert label in text, f"no test named {label!r} in the feedback page"
        # Hidden tests stay hidden on the page too.
        assert not [line for line in grading.hidden_test_lines(SLUG) if line.strip() and line in text]
        feedback_page.close()
        chromium.close()
