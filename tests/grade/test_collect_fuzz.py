"""``collect`` against a generated inbound folder of odd entries (seeded): nothing raises.

One student's hand-made entry in the exchange used to stop ``collect`` for the whole class
(tests/grade/test_exchange_checks.py names the five that were found by hand). Here a seeded
generator makes a few hundred odd entries of every kind a student controls: names, nesting,
sizes, timestamps, permissions, links, collisions and bytes that are not UTF-8. Each has an
expected outcome: staged as it is, staged with its time corrected, refused by name, or (not
this assignment's) ignored. The command then runs as the instructor types it.
"""

from __future__ import annotations

import datetime
import os
import pwd
import random
import subprocess
from pathlib import Path

from grading_support import Course
from nbgrader.utils import parse_utc

from distlab.grade.course import exchange

ME = pwd.getpwuid(os.getuid()).pw_name
ASSIGNMENT = "00-first-steps"
SEED = 44
ODD_ENTRIES = 240
NOTEBOOK = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime(exchange.TIMESTAMP_FORMAT)


def nested_folders(folder: Path, depth: int) -> None:
    """``depth`` folders one inside the other, made through descriptors (the path grows long)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


class Inbound:
    """An inbound folder being filled, and what ``collect`` must do with each entry."""

    def __init__(self, root: Path, outside: Path):
        self.root, self.outside, self.expected = root, outside, {}
        self.secret = outside / "secret.txt"
        self.secret.write_text("THE HIDDEN TESTS")

    def submission(self, suffix: str, outcome: str, *, stamp: str | None = None, student: str = ME,
                   assignment: str = ASSIGNMENT) -> Path:
        stamp = stamp or _now()
        folder = self.root / f"{student}+{assignment}+{stamp}+{suffix}"
        folder.mkdir()
        (folder / f"{ASSIGNMENT}.ipynb").write_text(NOTEBOOK)
        (folder / "timestamp.txt").write_text(stamp)
        self.expected[folder.name] = outcome
        return folder

    # -- one odd entry of each kind; `rng` picks its details ---------------------------------
    def odd_timestamp(self, n, rng):
        written = rng.choice(["2099/01/01 00:00:00", "2026-11-25 10:00:00.000000 ../x", "", "now",
                              "2020-01-01 00:00:00.000000 UTC", "2099-01-01 00:00:00.000000 UTC",
                              "2026-11-25 10:00:00.000000 /etc/passwd", "9" * rng.randint(30, 5000),
                              "2026-13-45 99:99:99.000000 UTC", "0000-00-00 00:00:00.000000 UTC"])
        folder = self.submission(f"t{n}", "corrected")
        (folder / "timestamp.txt").write_text(written)

    def undecodable_timestamp(self, n, rng):
        folder = self.submission(f"u{n}", "corrected")
        (folder / "timestamp.txt").write_bytes(bytes(rng.randrange(128, 256) for _ in range(rng.randint(1, 40))))

    def timestamp_not_a_file(self, n, rng):
        folder = self.submission(f"f{n}", "corrected")
        (folder / "timestamp.txt").unlink()
        if rng.random() < 0.5:
            (folder / "timestamp.txt").mkdir()
            (folder / "timestamp.txt" / "inner").write_text("x")
        # else: no timestamp.txt at all

    def collision(self, n, rng):
        """Two entries that nbgrader's naming would have given the same name."""
        stamp = _now()
        self.submission(f"c{n}", "staged", stamp=stamp)
        twin = self.submission(f"c{n}x", "staged", stamp=stamp)
        twin.rename(self.root / f"{ME}+{ASSIGNMENT}+{stamp[:-4]} Z+c{n}")
        self.expected[f"{ME}+{ASSIGNMENT}+{stamp[:-4]} Z+c{n}"] = self.expected.pop(twin.name)

    def deep(self, n, rng):
        folder = self.submission(f"d{n}", "refused:nests folders")
        nested_folders(folder, rng.randint(exchange.MAX_DEPTH + 1, 1200))

    def shallow_enough(self, n, rng):
        folder = self.submission(f"s{n}", "staged")
        nested_folders(folder, rng.randint(1, exchange.MAX_DEPTH - 1))

    def link(self, n, rng):
        folder = self.submission(f"l{n}", "refused:symbolic link")
        target = rng.choice([self.secret, self.outside, Path("/dev/zero"), self.outside / "dangling"])
        name = rng.choice(["notes.txt", "a/b/link", f"{ASSIGNMENT}.ipynb"])
        (folder / name).unlink(missing_ok=True)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(target)

    def entry_is_a_link(self, n, rng):
        name = f"{ME}+{ASSIGNMENT}+{_now()}+e{n}"
        (self.root / name).symlink_to(rng.choice([self.outside, self.secret]))
        self.expected[name] = "refused:could not be opened"

    def entry_is_a_file(self, n, rng):
        name = f"{ME}+{ASSIGNMENT}+{_now()}+g{n}"
        (self.root / name).write_bytes(os.urandom(rng.randint(0, 2000)))
        self.expected[name] = "refused:could not be opened"

    def pipe(self, n, rng):
        folder = self.submission(f"p{n}", "refused:is a pipe")
        os.mkfifo(folder / "notes.txt")

    def hard_link(self, n, rng):
        folder = self.submission(f"h{n}", "refused:a hard link")
        os.link(self.secret, folder / "notes.txt")
        self.secret = self.outside / f"secret{n}.txt"   # a fresh one: each link adds a name
        self.secret.write_text("THE HIDDEN TESTS")

    def huge(self, n, rng):
        folder = self.submission(f"z{n}", "refused:larger than")
        with open(folder / "data.bin", "wb") as file:   # sparse: no disk used
            file.truncate(exchange.MAX_SUBMISSION_BYTES + rng.randint(1, 2**20))

    def many_small_files(self, n, rng):
        over = rng.random() < 0.5
        folder = self.submission(f"m{n}", "refused:more than" if over else "staged")
        count = exchange.MAX_ENTRIES + 5 if over else rng.randint(10, 200)
        for i in range(count):
            (folder / f"{i}.txt").write_text(str(i))

    def odd_file_name(self, n, rng):
        folder = self.submission(f"o{n}", "refused:not a printable UTF-8 name")
        name = rng.choice([b"\xff\xfe.txt", b"line\nbreak", b"esc\x1b[2Jape", b"bell\x07", b"rtl\xe2\x80\xaetxt.exe",
                           b"\xc3\x28", b"tab\there"])
        with open(os.fsencode(folder) + b"/" + name, "wb") as file:
            file.write(b"x")

    def printable_unicode_name(self, n, rng):
        folder = self.submission(f"n{n}", "staged")
        (folder / rng.choice(["résumé.txt", "数据.csv", "naïve + café.md", " spaced .txt"])).write_text("ok")

    def undecodable_entry_name(self, n, rng):
        raw = os.fsencode(f"{ME}+{ASSIGNMENT}+{_now()}+") + bytes([rng.randrange(128, 256), 10, 27]) + b"[31m"
        path = Path(os.fsdecode(os.fsencode(self.root) + b"/" + raw))
        path.mkdir()
        (path / f"{ASSIGNMENT}.ipynb").write_text(NOTEBOOK)
        (path / "timestamp.txt").write_text(_now())
        self.expected[path.name] = "staged"

    def claims_another_student(self, n, rng):
        self.submission(f"a{n}", "refused:but was made by",
                        student=rng.choice(["", "alice", "bob\n[distlab.grade] alice NOT GRADED", "root2", "\x1b[2J"]))

    def not_this_assignment(self, n, rng):
        if rng.random() < 0.5:
            self.submission(f"x{n}", "ignored", assignment="01-data-loading")
        else:
            name = rng.choice([f"no-plus-{n}", f"{ME}+{n}", f"{ME}+01-data-loading+{n}"])
            (self.root / name).mkdir(exist_ok=True)
            self.expected[name] = "ignored"

    def too_large_in_many_files(self, n, rng):
        folder = self.submission(f"b{n}", "refused:larger than")
        for i in range(3):
            with open(folder / f"part{i}.bin", "wb") as file:
                file.truncate(exchange.MAX_SUBMISSION_BYTES // 2)

    def no_permissions(self, n, rng):
        """Unreadable to its owner; the instructor (or root) may still read it."""
        folder = self.submission(f"r{n}", "staged")
        target = rng.choice([folder / f"{ASSIGNMENT}.ipynb", folder / "sub"])
        if target.name == "sub":
            target.mkdir()
            (target / "inside.txt").write_text("x")
        target.chmod(0)
        if not os.access(target, os.R_OK):     # an instructor without root powers
            self.expected[folder.name] = "refused:Permission denied"


KINDS = [getattr(Inbound, name) for name in vars(Inbound) if not name.startswith(("_", "submission"))]


def _fill(inbound: Inbound, rng: random.Random) -> set:
    """The honest submissions and the odd entries; returns the kinds used."""
    for n in range(8):
        inbound.submission(f"good{n}", "staged")
    used = set()
    for n in range(ODD_ENTRIES):
        kind = rng.choice(KINDS)
        kind(inbound, n, rng)
        used.add(kind)
    return used


def _outcomes(notes: list[str], expected: dict) -> dict:
    got = {}
    for name in expected:
        said = [note for note in notes if note.split(" ", 1)[1].startswith(repr(name))]
        got[name] = said[0] if said else None
    return got


def test_a_seeded_class_of_odd_entries_is_staged_or_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_GRADE_EXCHANGE", str(tmp_path / "exchange"))
    root = tmp_path / "exchange" / "distlab" / "inbound"
    root.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    inbound = Inbound(root, tmp_path / "outside")
    assert _fill(inbound, random.Random(SEED)) == set(KINDS)
    assert len(inbound.expected) >= 200 + 8
    staged = tmp_path / "staged"
    try:
        notes = exchange.stage_submissions(ASSIGNMENT, str(staged))
    finally:   # give back the permissions taken away (links are left alone), so it can be removed
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(root)], check=True)
    got = _outcomes(notes, inbound.expected)
    wrong = {}
    for name, outcome in inbound.expected.items():
        note = got[name]
        if outcome in ("staged", "ignored"):
            ok = note is None
        elif outcome == "corrected":
            ok = note is not None and note.startswith("CORRECTED ")
        else:
            ok = note is not None and note.startswith("REFUSED ") and outcome.split(":", 1)[1] in note
        if not ok:
            wrong[name] = (outcome, note)
    assert not wrong, wrong
    assert len(notes) == sum(o not in ("staged", "ignored") for o in inbound.expected.values()), notes
    assert all(note.isprintable() for note in notes)
    kept = sum(o in ("staged", "corrected") for o in inbound.expected.values())
    names = sorted(os.listdir(staged))
    assert len(names) == kept
    for name in names:   # every name nbgrader is given parses, and agrees with its timestamp.txt
        student, assignment, stamp, _ = name.rsplit("+", 3)
        assert (student, assignment) == (ME, ASSIGNMENT) and name.isprintable()
        assert parse_utc(stamp) == parse_utc((staged / name / "timestamp.txt").read_text())
    assert not any("THE HIDDEN TESTS" in p.read_text(errors="replace")
                   for p in staged.rglob("*") if p.is_file() and not p.is_symlink())
    subprocess.run(["rm", "-rf", "--", str(root)], check=True)   # shutil recurses into the deep ones


def test_the_command_collects_the_class_and_fails_only_when_nothing_could_be_collected(tmp_path):
    course = Course(tmp_path / "work")
    assert course.grade("publish", ASSIGNMENT).returncode == 0, course.log
    root = tmp_path / "work" / "exchange" / "distlab" / "inbound"
    root.mkdir(parents=True, exist_ok=True)
    (tmp_path / "outside").mkdir()
    inbound = Inbound(root, tmp_path / "outside")
    rng = random.Random(SEED)
    for kind in (Inbound.timestamp_not_a_file, Inbound.odd_timestamp, Inbound.collision, Inbound.deep, Inbound.link,
                 Inbound.odd_file_name, Inbound.undecodable_entry_name):
        kind(inbound, 0, rng)
    refused = [name for name, outcome in inbound.expected.items() if outcome.startswith("refused")]

    done = course.grade("collect", ASSIGNMENT)

    assert done.returncode == 0, course.log
    for name in refused:
        assert f"REFUSED {name!r}" in done.stdout, done.stdout
    assert (tmp_path / "work" / "submitted" / ME / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text() == NOTEBOOK
    assert done.stdout.isascii() or all(ch.isprintable() or ch == "\n" for ch in done.stdout)

    for name in list(inbound.expected):   # only refused entries are left
        if not inbound.expected[name].startswith("refused"):
            subprocess.run(["rm", "-rf", "--", str(root / name)], check=True)
    nothing = course.grade("collect", ASSIGNMENT)
    assert nothing.returncode == 1, course.log
    assert "nothing could be collected" in nothing.stdout
    subprocess.run(["rm", "-rf", "--", str(root)], check=True)


def test_collect_from_a_folder_never_follows_its_links(tmp_path):
    """``collect --from DIR``: DIR's folders may be the students' own; a link in them (to the
    solutions, to a folder) was followed by copytree. Now it is refused by name and the rest
    of the class collected."""
    course = Course(tmp_path / "work")
    assert course.grade("release", ASSIGNMENT).returncode == 0, course.log
    incoming = tmp_path / "incoming"
    (incoming / "honest").mkdir(parents=True)
    (incoming / "honest" / f"{ASSIGNMENT}.ipynb").write_text(NOTEBOOK)
    secret = tmp_path / "secret.txt"
    secret.write_text("THE HIDDEN TESTS")
    (incoming / "linker").mkdir()
    (incoming / "linker" / f"{ASSIGNMENT}.ipynb").symlink_to(secret)
    (incoming / "whole.zip").symlink_to(secret)
    (incoming / "folder").symlink_to(incoming / "honest")

    done = course.grade("collect", ASSIGNMENT, "--from", str(incoming))

    assert done.returncode == 0, course.log
    for name, why in (("linker", f"{ASSIGNMENT}.ipynb is a symbolic link"), ("whole.zip", "is a symbolic link"),
                      ("folder", "is a symbolic link")):
        assert f"REFUSED {name!r}: " in done.stdout and why in done.stdout, done.stdout
    archive = tmp_path / "work" / "downloaded" / ASSIGNMENT / "archive"
    assert sorted(os.listdir(archive)) == ["honest"]
    assert not any("THE HIDDEN TESTS" in p.read_text() for p in (tmp_path / "work").rglob("*")
                   if p.is_file() and p.suffix in (".ipynb", ".zip", ".txt"))
