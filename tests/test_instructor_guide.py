"""The instructor's guide, tried as a new instructor would: its commands, copied from the page.

The bash blocks of "The five steps" in book/appendices/instructors-guide.md run as they are
printed, in a new working folder (``DISTLAB_GRADE_WORK``) and a home folder whose
``~/downloads/week0`` holds one submission, a student called alice. Every command must
succeed and print plainly: no traceback, no warning about cells nobody edited, no
SQLAlchemy or configuration noise, real paths, and how long each step took.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
from grading_support import REPO, SLUG, solution_answers, with_answers
from process_support import run_in_own_group

GUIDE = REPO / "book" / "appendices" / "instructors-guide.md"
NOISE = ("Traceback", "has changed!", "SAWarning", "display_data_priority", "/../", "Directory not found")


def guide_commands(section: str = "## The five steps") -> list[str]:
    """The shell commands of the bash blocks of ``section``, in order (comments dropped)."""
    text = GUIDE.read_text().split(section, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def test_the_guide_shows_each_command_with_what_it_needs():
    commands = guide_commands()
    assert commands[0] == "make grade-release"
    assert any("collect" in c and "FROM=" in c for c in commands), commands
    text = GUIDE.read_text()
    assert "collect 00-first-steps --from" in text and "release 00-first-steps --to" in text


def run(command: str, env: dict) -> subprocess.CompletedProcess:
    return run_in_own_group(["bash", "-c", command], 600, cwd=REPO, env=env)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_five_steps_run_verbatim_and_print_plainly(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    release = tmp_path / "preview"
    subprocess.run([sys.executable, "-m", "distlab.grade", "release", SLUG, "--to", str(release)], cwd=REPO,
                   env=dict(os.environ, DISTLAB_GRADE_WORK=str(tmp_path / "scratch")), check=True,
                   capture_output=True)
    week0 = home / "downloads" / "week0" / "alice"
    week0.mkdir(parents=True)
    (week0 / f"{SLUG}.ipynb").write_bytes(with_answers(release / SLUG / f"{SLUG}.ipynb", solution_answers(SLUG)))
    env = dict(os.environ, HOME=str(home), DISTLAB_GRADE_WORK=str(work))

    # A new working folder: autograding before releasing says what to do, in one line.
    early = run(f"{sys.executable} -m distlab.grade autograde {SLUG}", env)
    assert early.returncode == 1 and "release it first" in early.stdout and "Traceback" not in early.stdout + early.stderr

    for command in guide_commands():
        done = run(command, env)
        log = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {command}\n{log[-4000:]}"
        noise = [n for n in NOISE if n in log]
        assert not noise, f"$ {command} printed {noise}:\n{log[-4000:]}"
        timed = [line for line in done.stdout.splitlines() if line.startswith("[distlab.grade]")
                 and re.search(r"\b\d+\.\d s\b", line)]
        assert timed, f"$ {command} does not say how long it took:\n{done.stdout[-2000:]}"
    rows = list(csv.DictReader(open(work / "grades.csv")))
    alice = [r for r in rows if r["student_id"] == "alice" and r["assignment"] == SLUG]
    assert alice and float(alice[0]["score"]) == float(alice[0]["max_score"]) > 0
    feedback = work / "feedback" / "alice" / SLUG / f"{SLUG}.html"
    assert feedback.exists()
    assert json.loads((REPO / "notebooks" / SLUG / f"{SLUG}.ipynb").read_text())   # the release is intact
