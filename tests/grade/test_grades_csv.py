"""``python -m distlab.grade export``: the CSV says in which zone its times are."""

from __future__ import annotations

import csv
import datetime
import os
import subprocess
import sys

from grading_support import REPO


def test_exported_times_carry_their_utc_offset(tmp_path, monkeypatch):
    """nbgrader keeps due dates and hand-in times in UTC and exports them bare
    (``2026-12-01 16:00:00``), which a reader in another zone takes for local time."""
    from nbgrader.api import Gradebook

    # nbgrader makes a new gradebook with the `alembic` command, found on PATH: this .venv's
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    work = tmp_path / "work"
    work.mkdir()
    due = datetime.datetime(2026, 12, 1, 16, 0, 0)                 # UTC, as nbgrader stores it
    handed_in = datetime.datetime(2026, 12, 1, 15, 59, 30, 250000)
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment("00-first-steps", duedate=due)
        gradebook.add_student("alice")
        gradebook.add_student("bob")
        gradebook.add_submission("00-first-steps", "alice", timestamp=handed_in)
    out = tmp_path / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "distlab.grade", "export", "--to", str(out)], cwd=REPO,
                          env=dict(os.environ, DISTLAB_GRADE_WORK=str(work)), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "times in UTC" in done.stdout
    rows = {row["student_id"]: row for row in csv.DictReader(open(out))}
    utc = datetime.timezone.utc
    assert datetime.datetime.fromisoformat(rows["alice"]["duedate"]) == due.replace(tzinfo=utc)
    assert datetime.datetime.fromisoformat(rows["alice"]["timestamp"]) == handed_in.replace(tzinfo=utc)
    assert rows["alice"]["timestamp"].endswith("+00:00"), rows["alice"]
    assert rows["bob"]["timestamp"] == "", "a student who handed nothing in has no time"
