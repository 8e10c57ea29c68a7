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


def test_the_guide_counts_the_hostile_submissions_there_are():
    """The folders' table says how many hostile submissions the tests grade: as many as
    grader/hostile/ holds at its top (tests/grade/test_hostile.py's class) and in its folders."""
    from grading_support import HOSTILE, hostile_specs

    row = next(line for line in GUIDE.read_text().splitlines() if line.startswith("| `grader/hostile/` |"))
    counted = re.search(r"(\d+) graded as one class by `tests/grade/test_hostile.py`, and (\d+) more in its folders",
                        row)
    assert counted, row
    folders = sorted(p.name for p in HOSTILE.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert folders == ["caps", "metadata", "output", "rooms"], "name the new folder in the guide's row"
    found = (len(hostile_specs()), sum(len(hostile_specs(folder)) for folder in folders))
    assert tuple(map(int, counted.groups())) == found, f"grader/hostile/ holds {found[0]} and {found[1]}: {row}"


PATH_ROOTS = ("src", "tests", "hub", "scripts", "benchmarks", "book", "solutions", "notebooks", "grader", "templates")
REPOSITORY_PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(PATH_ROOTS)})/[^\s`'\",;:()\[\]]*")
"""A path in the repository, as the pages spell one: from a top-level folder, to the first space,
backtick, quote or punctuation around it."""
PLACEHOLDER = re.compile(r"<[^>]*>|NN")
"""``solutions/<slug>/<slug>.ipynb``, ``tests/chapters/test_chapterNN.py``: a pattern, not a path."""
MADE_BY_COMMANDS = ("grader/work", "hub/node_modules")
"""Folders a command makes (the grader's working folder, ``npm ci --prefix hub``): a fresh clone has neither."""


def named_paths(markdown: str) -> set[str]:
    """The repository paths a page names, in its code spans and its fenced blocks."""
    spans = re.findall(r"`([^`\n]+)`", markdown) + re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.S | re.M)
    return {path.rstrip(".") for span in spans for path in REPOSITORY_PATH.findall(span)}


def test_named_paths_finds_paths_in_spans_and_blocks_and_leaves_prose_alone():
    page = ("Run `python hub/demo.py up`, then read `tests/hub/test_hub.py::test_x` and ``src/distlab/grade/``.\n"
            "In prose src/distlab/tools is not a named path.\n```bash\nmake page PAGE=book/intro.md\n```\n")
    assert named_paths(page) == {"hub/demo.py", "tests/hub/test_hub.py", "src/distlab/grade/", "book/intro.md"}


def test_every_repository_path_the_guide_the_book_and_the_readmes_name_exists():
    """What a reader is told to open must be there: every path the instructor's guide, the other
    appendices, the book's pages and the READMEs name (the threat model's evidence column, the
    README's layout, the hub's files). A file moved or renamed without its mentions fails here."""
    pages = sorted((REPO / "book").rglob("*.md")) + [REPO / "README.md", REPO / "hub" / "README.md"]
    assert GUIDE in pages
    checked, missing = 0, {}
    for page in pages:
        for path in sorted(named_paths(page.read_text())):
            if PLACEHOLDER.search(path) or path.startswith(MADE_BY_COMMANDS):
                continue
            checked += 1
            if not (REPO / path).exists() and not list(REPO.glob(path)):
                missing.setdefault(str(page.relative_to(REPO)), []).append(path)
    assert not missing, f"paths named but not in the repository: {missing}"
    assert checked > 100, f"only {checked} paths found: the pattern no longer sees the pages' paths"


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
