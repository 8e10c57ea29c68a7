"""The grader's own checks on nbgrader's exchange and log, without a hub (fast)."""

from __future__ import annotations

import os
import pwd

from distlab.grade import exchange
from distlab.grade.__main__ import ungraded


def test_a_submission_made_by_someone_else_than_it_names_is_set_aside(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_GRADE_EXCHANGE", str(tmp_path / "exchange"))
    monkeypatch.setenv("DISTLAB_GRADE_WORK", str(tmp_path / "work"))
    inbound = tmp_path / "exchange" / "distlab" / "inbound"
    me = pwd.getpwuid(os.getuid()).pw_name
    honest = inbound / f"{me}+00-first-steps+2026-11-25 10:00:00 UTC+abc"
    impostor = inbound / "alice+00-first-steps+2026-11-25 10:00:01 UTC+def"   # made by us, names alice
    other_assignment = inbound / "alice+01-data-loading+2026-11-25 10:00:02 UTC+ghi"
    for folder in (honest, impostor, other_assignment):
        folder.mkdir(parents=True)
        (folder / "00-first-steps.ipynb").write_text("{}")

    refused = exchange.set_aside_impostors("00-first-steps")

    assert len(refused) == 1 and "names alice but was made by " + me in refused[0]
    assert honest.exists() and other_assignment.exists() and not impostor.exists()
    assert (tmp_path / "work" / "refused" / impostor.name / "00-first-steps.ipynb").exists()


def test_ungraded_names_each_student_nbgrader_could_not_grade_and_why():
    log = [
        "[AutogradeApp | ERROR] Traceback (most recent call last):",
        "    json.decoder.JSONDecodeError: Unterminated string starting at: line 1",
        "nbformat.reader.NotJSONError: Notebook does not appear to be JSON: '{\"cells\"...'",
        "[AutogradeApp | ERROR] There was an error processing assignment '00-first-steps' for student 'bob'",
        "[AutogradeApp | INFO] Writing 15266 bytes to autograded/carol/00-first-steps/00-first-steps.ipynb",
        "[AutogradeApp | ERROR] There was an error processing assignment '00-first-steps' for student 'dan'",
    ]
    assert ungraded(log) == {"bob": "nbformat.reader.NotJSONError: Notebook does not appear to be JSON: '{\"cells\"...'",
                             "dan": "see the log above"}
