"""The grader's own checks on nbgrader's exchange and log, without a hub (fast)."""

from __future__ import annotations

import datetime
import os
import pwd
import subprocess
from pathlib import Path

import pytest
from grading_support import Course
from nbgrader.utils import parse_utc
from test_collect_fuzz import nested_folders

from distlab.grade.__main__ import ungraded
from distlab.grade.course import exchange

ME = pwd.getpwuid(os.getuid()).pw_name


ASSIGNMENT = "00-first-steps"
NOW = "2026-11-25 10:00:00.000000 UTC"


def _exchange(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """An exchange's inbound folder and the staging folder ``collect`` copies it into."""
    monkeypatch.setenv("DISTLAB_GRADE_EXCHANGE", str(tmp_path / "exchange"))
    monkeypatch.setenv("DISTLAB_GRADE_WORK", str(tmp_path / "work"))
    inbound = tmp_path / "exchange" / "distlab" / "inbound"
    inbound.mkdir(parents=True)
    return inbound, tmp_path / "staged"


def _submission(inbound: Path, student: str, suffix: str, timestamp: str | None = None) -> Path:
    """A folder as ``nbgrader submit`` leaves it, written now, claiming ``timestamp``."""
    stamp = timestamp or datetime.datetime.now(datetime.timezone.utc).strftime(exchange.TIMESTAMP_FORMAT)
    folder = inbound / f"{student}+{ASSIGNMENT}+{stamp}+{suffix}"
    folder.mkdir()
    (folder / f"{ASSIGNMENT}.ipynb").write_text('{"cells": []}')
    (folder / "timestamp.txt").write_text(stamp)
    return folder


def _staged_name(folder: Path) -> str:
    """The name ``collect`` gives a submission it keeps as written: its own number replaces the
    random part (the entry's place in the inbound folder, sorted)."""
    student, assignment, stamp, _ = folder.name.rsplit("+", 3)
    return f"{student}+{assignment}+{stamp}+{sorted(os.listdir(folder.parent)).index(folder.name)}"


def test_a_submission_made_by_someone_else_than_it_names_is_not_collected(tmp_path, monkeypatch):
    inbound, staged = _exchange(tmp_path, monkeypatch)
    honest = _submission(inbound, ME, "abc")
    impostor = _submission(inbound, "alice", "def")          # made by us, names alice
    (inbound / f"alice+01-data-loading+{NOW}+ghi").mkdir()   # another assignment: not looked at

    notes = exchange.stage_submissions(ASSIGNMENT, str(staged))

    assert len(notes) == 1 and f"REFUSED {impostor.name!r}: names 'alice' but was made by {ME}" == notes[0]
    assert [p.name for p in staged.iterdir()] == [_staged_name(honest)]
    assert (staged / _staged_name(honest) / f"{ASSIGNMENT}.ipynb").read_text() == '{"cells": []}'
    assert impostor.exists()   # left where it is, for the instructor to look at


@pytest.mark.parametrize("plant", ["link_to_a_secret", "link_to_a_folder", "pipe", "hard_link", "huge_file",
                                   "folder_is_a_link"])
def test_links_pipes_and_huge_files_are_data_never_followed(tmp_path, monkeypatch, plant):
    """The attack: a hand-made submission holding a link to a file the grader can read (the
    solutions, another student's work) had nbgrader, as the instructor or root, copy the
    target into the gradebook's folders; a pipe or /dev/zero hung or filled the disk."""
    inbound, staged = _exchange(tmp_path, monkeypatch)
    secret = tmp_path / "secret.txt"
    secret.write_text("THE HIDDEN TESTS")
    secret.chmod(0o600)
    folder = _submission(inbound, ME, "xyz")
    if plant == "link_to_a_secret":
        (folder / "notes.txt").symlink_to(secret)
    elif plant == "link_to_a_folder":
        (folder / "more").symlink_to(tmp_path)
    elif plant == "pipe":
        os.mkfifo(folder / "notes.txt")
    elif plant == "hard_link":
        os.link(secret, folder / "notes.txt")
    elif plant == "huge_file":
        with open(folder / "data.bin", "wb") as file:
            file.truncate(exchange.MAX_SUBMISSION_BYTES + 1)   # sparse: no disk used
    elif plant == "folder_is_a_link":
        real = _submission(tmp_path, ME, "real")
        folder.rename(tmp_path / "spare")
        folder.symlink_to(real)

    notes = exchange.stage_submissions(ASSIGNMENT, str(staged))

    reason = {"link_to_a_secret": "notes.txt is a symbolic link", "link_to_a_folder": "more is a symbolic link",
              "pipe": "notes.txt is a pipe", "hard_link": "notes.txt has 2 names (a hard link)",
              "huge_file": f"larger than {exchange.MAX_SUBMISSION_BYTES // 2**20} MiB",
              "folder_is_a_link": "could not be opened"}[plant]
    assert len(notes) == 1 and reason in notes[0], notes
    assert list(staged.iterdir()) == []
    assert secret.stat().st_mode & 0o777 == 0o600


def test_a_file_swapped_for_a_link_between_the_check_and_the_copy_is_refused(tmp_path, monkeypatch):
    """The race a student can run while collect works: a file that passed the check becomes a
    link before it is opened. The open does not follow it (O_NOFOLLOW), and the submission is
    refused with the reason; the other submissions are still collected."""
    inbound, staged = _exchange(tmp_path, monkeypatch)
    honest = _submission(inbound, ME, "abc")
    racer = _submission(inbound, ME, "def")
    secret = tmp_path / "secret.txt"
    secret.write_text("THE HIDDEN TESTS")
    real_stat = os.stat

    def stat_then_swap(name, *args, dir_fd=None, **kwargs):
        info = real_stat(name, *args, dir_fd=dir_fd, **kwargs)
        if name == f"{ASSIGNMENT}.ipynb" and os.readlink(f"/proc/self/fd/{dir_fd}") == str(racer):
            os.unlink(racer / name)
            os.symlink(secret, racer / name)
        return info

    monkeypatch.setattr(exchange.os, "stat", stat_then_swap)
    notes = exchange.stage_submissions(ASSIGNMENT, str(staged))

    assert len(notes) == 1 and notes[0].startswith(f"REFUSED {racer.name!r}: [Errno 40]"), notes
    assert [p.name for p in staged.iterdir()] == [_staged_name(honest)]


def test_a_submission_time_before_its_files_last_change_is_replaced_by_that_change(tmp_path, monkeypatch):
    """timestamp.txt is written by the student's process; ctime moves to now on every change
    and cannot be set back: a claim more than the slack before it is replaced (lateness and
    which submission is the latest then follow the file system)."""
    inbound, staged = _exchange(tmp_path, monkeypatch)
    honest = _submission(inbound, ME, "abc")
    backdated = _submission(inbound, ME, "def", timestamp="2020-01-01 00:00:00.000000 UTC")
    (inbound / backdated.name / "timestamp.txt").write_text("2020-01-01 00:00:00.000000 UTC")
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)   # parse_utc's naive UTC

    notes = exchange.stage_submissions(ASSIGNMENT, str(staged))

    assert len(notes) == 1 and notes[0].startswith(f"CORRECTED {backdated.name!r}: claimed '2020-01-01"), notes
    assert (staged / _staged_name(honest) / "timestamp.txt").read_text() == honest.name.split("+")[2]   # kept as written
    (corrected,) = [p for p in staged.iterdir() if p.name != _staged_name(honest)]
    written = (corrected / "timestamp.txt").read_text()
    assert corrected.name.split("+")[2] == written
    assert abs((parse_utc(written) - before).total_seconds()) < 60


def test_collect_hands_nbgrader_only_what_it_checked(tmp_path):
    """The whole command: nbgrader collects the honest submission and never sees the refused one."""
    course = Course(tmp_path / "work")
    env_exchange = tmp_path / "work" / "exchange"
    assert course.grade("publish", ASSIGNMENT).returncode == 0, course.log
    inbound = env_exchange / "distlab" / "inbound"
    inbound.mkdir(parents=True, exist_ok=True)
    _submission(inbound, ME, "abc", timestamp="2020-01-01 00:00:00.000000 UTC")
    secret = tmp_path / "secret.txt"
    secret.write_text("THE HIDDEN TESTS")
    linked = _submission(inbound, ME, "def")
    (linked / "timestamp.txt").unlink()
    (linked / "timestamp.txt").symlink_to(secret)

    done = course.grade("collect", ASSIGNMENT)

    assert done.returncode == 0, course.log
    assert f"REFUSED {linked.name!r}: timestamp.txt is a symbolic link" in done.stdout, done.stdout
    assert "CORRECTED" in done.stdout and "which counts" in done.stdout
    submitted = tmp_path / "work" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == [ME]
    timestamp = (submitted / ME / ASSIGNMENT / "timestamp.txt").read_text()
    assert not timestamp.startswith("2020"), timestamp
    assert not any("THE HIDDEN TESTS" in p.read_text() for p in submitted.rglob("*") if p.is_file())
    assert not (tmp_path / "work" / "staged-exchange").exists()


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


def _hand_in(home: Path, exchange_root: Path) -> str:
    """``nbgrader submit`` as a student's server runs it (hub/jupyter first on its config
    path), from ``home``; its log."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_PATH=str(repo / "hub" / "jupyter"),
               DISTLAB_HUB_EXCHANGE=str(exchange_root))
    done = subprocess.run([sys.executable, "-m", "nbgrader", "submit", ASSIGNMENT], cwd=home, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Submitted as" in done.stderr, done.stderr
    return done.stderr


def test_a_hand_in_leaves_jupyterlab_s_checkpoints_out_and_warns_of_nothing_it_did_not_hand_in(tmp_path):
    """JupyterLab keeps a checkpoint of every notebook opened, beside it; nbgrader's submit
    left it out of the exchange but warned of it as an "EXTRA" notebook at every hand-in
    (hub/jupyter/course_exchange.py). A real extra notebook is still warned of."""
    root, home = tmp_path / "exchange", tmp_path / "home"
    release = root / "distlab" / "outbound" / ASSIGNMENT
    release.mkdir(parents=True)
    (root / "distlab" / "inbound").mkdir()
    (release / f"{ASSIGNMENT}.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    fetched = home / ASSIGNMENT
    (fetched / ".ipynb_checkpoints").mkdir(parents=True)
    (fetched / f"{ASSIGNMENT}.ipynb").write_text((release / f"{ASSIGNMENT}.ipynb").read_text())
    (fetched / ".ipynb_checkpoints" / f"{ASSIGNMENT}-checkpoint.ipynb").write_text(
        (release / f"{ASSIGNMENT}.ipynb").read_text())

    log = _hand_in(home, root)
    assert "EXTRA" not in log and "Possible missing notebooks" not in log, log
    handed_in, = (root / "distlab" / "inbound").iterdir()
    assert f"{ASSIGNMENT}.ipynb" in os.listdir(handed_in)
    assert not list(handed_in.rglob(".ipynb_checkpoints")), sorted(os.listdir(handed_in))

    (fetched / "scratch.ipynb").write_text((release / f"{ASSIGNMENT}.ipynb").read_text())
    log = _hand_in(home, root)
    assert "scratch.ipynb: EXTRA" in log and "checkpoint" not in log, log


def test_one_students_odd_entries_never_stop_the_class(tmp_path, monkeypatch, request):
    """The attack: each of these, in a student's own inbound folder, made ``collect`` raise before
    nbgrader ran (IsADirectoryError, FileNotFoundError, DeprecatedTzKeyWarning, ENOTEMPTY,
    RecursionError), so nobody was collected. Now each is judged on its own: staged with its
    time corrected, or refused by name; the honest submission is staged either way."""
    inbound, staged = _exchange(tmp_path, monkeypatch)
    honest = _submission(inbound, ME, "honest")
    folder_stamp = _submission(inbound, ME, "folderstamp")
    (folder_stamp / "timestamp.txt").unlink()
    (folder_stamp / "timestamp.txt").mkdir()
    slashed = _submission(inbound, ME, "slash")
    (slashed / "timestamp.txt").write_text("2099/01/01 00:00:00")
    relative_zone = _submission(inbound, ME, "zone")
    (relative_zone / "timestamp.txt").write_text("2026-11-25 10:00:00.000000 ../x")
    twin_stamp = honest.name.split("+")[2]
    twin = _submission(inbound, ME, "twin", timestamp=twin_stamp)
    twin.rename(inbound / f"{ME}+{ASSIGNMENT}+{twin_stamp[:-4]} X+honest")  # ends up named as `honest`
    twin = inbound / f"{ME}+{ASSIGNMENT}+{twin_stamp[:-4]} X+honest"
    deep = _submission(inbound, ME, "deep")
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", "--", str(deep)], check=True))  # shutil recurses
    nested_folders(deep, 995)

    notes = exchange.stage_submissions(ASSIGNMENT, str(staged))

    said = "\n".join(notes)
    for corrected in (folder_stamp, slashed, relative_zone):
        assert f"CORRECTED {corrected.name!r}" in said, said
    assert f"REFUSED {deep.name!r}: it nests folders more than {exchange.MAX_DEPTH} deep" in said, said
    assert twin.name not in said and honest.name not in said, said
    staged_names = sorted(p.name for p in staged.iterdir())
    assert len(staged_names) == 5, staged_names        # all but the deep one
    assert all(name.startswith(f"{ME}+{ASSIGNMENT}+") and "/" not in name for name in staged_names)
    for name in staged_names:                           # nbgrader can read every time it is given
        assert parse_utc(name.split("+")[2]) == parse_utc((staged / name / "timestamp.txt").read_text())


def test_publish_refuses_a_course_folder_in_the_exchange_that_someone_else_made(tmp_path):
    """The attack: the exchange's root is 1777, so a student who makes ``<exchange>/distlab``
    before the first publish owns it (and its ``outbound``, what the class fetches). publish
    wrote the release into it; now it refuses, saying whose folder it is and what to do."""
    course = Course(tmp_path / "work")
    planted = tmp_path / "work" / "exchange" / "distlab"
    planted.mkdir(parents=True)
    stranger = 54321   # no account: any uid but ours
    os.chown(planted, stranger, stranger)

    done = course.grade("publish", ASSIGNMENT)

    assert done.returncode == 1, course.log
    assert f"belongs to uid {stranger}, not to you ({ME})" in done.stdout and "publish again" in done.stdout, done.stdout
    assert list(planted.iterdir()) == []
    os.chown(planted, os.getuid(), os.getgid())    # the instructor's own folder: published into
    assert course.grade("publish", ASSIGNMENT).returncode == 0, course.log
    assert (planted / "outbound" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").exists()
