"""The instructor of benchmarks/hub_class.py: ``python -m distlab.grade`` as the course's instructor
account (never root), and what the class's work became: the submissions collected, each filed
under the student who wrote it, and the grades in the gradebook."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import instructor_account
from process_support import run_in_own_group

from .student import SLUG, Student, authors


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
