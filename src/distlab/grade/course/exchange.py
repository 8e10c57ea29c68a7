"""Taking submissions out of nbgrader's exchange, trusting nothing a student wrote there.

On a multi-user hub, ``nbgrader submit`` copies a student's folder to
``<exchange>/<course>/inbound/<student>+<assignment>+<timestamp>+<random>``. Every student may
write to ``inbound`` (but not list it), so everything in it is the students' data: the name,
the files, the times. ``nbgrader collect`` would believe all three, and as the instructor (or
root) it would follow whatever it finds. Before it runs, :func:`stage_submissions` copies each
submission into a private folder, checking the three things a student controls:

* **The name.** ``--student=alice`` hands in work as Alice. The file system knows better:
  the folder is owned by the account that made it. The owner is read from the *opened*
  folder (``fstat``), so renaming it after the check changes nothing: what is copied is what
  was checked.
* **The files.** A symbolic link (to the solutions, to another student's work, to
  ``/dev/zero``), a pipe or a device is not collected: the whole submission is refused. Each
  file is opened without following links (``O_NOFOLLOW``) and checked again once open; a file
  with several names (a hard link), or owned by someone else, is refused too; and a submission
  holds at most :data:`MAX_SUBMISSION_BYTES`.
* **The nesting and the names.** A submission nests at most :data:`MAX_DEPTH` folders, and
  every name in it is printable UTF-8 (a name with a newline or a stray byte would reach
  nbgrader's log and the instructor's terminal as it is).
* **The time.** Lateness is decided by ``timestamp.txt``, which the student's own process
  writes. The file system's change time (``ctime``) is not the student's to set: it moves to
  *now* on every change, and only root can move the clock. A claimed time more than
  :data:`CLOCK_SLACK_S` before the submission's last change is replaced by that change time.
  A claim more than the slack *after* it, or not in nbgrader's own format (``2099/01/01``, a
  time-zone key such as ``../x`` that ``dateutil`` would look up as a file), is replaced too.
  (An honest claim is kept as written: nbgrader names the returned feedback by a hash that
  includes it.)

Each entry of the inbound folder is judged on its own: whatever one of them holds, the others
are staged. The staged copies are named by the grader (the student, the assignment, the trusted
time and a number), so no two can collide and nbgrader can parse every name it is given.
``nbgrader collect`` then reads the private copy, never the exchange.
"""

from __future__ import annotations

import datetime
import os
import pwd
import re
import shutil
import stat

from nbgrader.utils import parse_utc

from distlab.grade import config

MAX_SUBMISSION_BYTES = 64 * 2**20
"""Largest submission collected (all its files together): a notebook with figures is a few MiB."""

MAX_ENTRIES = 1000
"""Most files and folders in one submission."""

MAX_DEPTH = 32
"""Most folders nested in one submission (an exercise's folder needs two or three)."""

CLOCK_SLACK_S = 120
"""How far ``timestamp.txt`` may claim a time before the files' last change: nbgrader writes it
just before copying, and a shared file system's clock may differ from a login node's by a
little."""

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"
"""nbgrader's own format (``Exchange.timestamp_format``)."""

TIMESTAMP_SHAPE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6} [A-Za-z]{1,6}")
"""What :data:`TIMESTAMP_FORMAT` writes: a zone's abbreviation (``UTC``, ``CET``), never a path."""

PRINTABLE_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]+")
"""A file name collected as it is: no control characters, no undecodable bytes (listed by Python
as lone surrogates), no line or paragraph separators, no text-direction overrides."""


class Refused(Exception):
    """A submission that is not collected, and why."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "pipe"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return "special file"


class _Copier:
    """Copies one submission, folder descriptor by folder descriptor; remembers its last change."""

    def __init__(self, uid: int | None):
        """``uid``: the account every file must belong to (``None``: any account)."""
        self.uid, self.bytes, self.entries, self.last_change = uid, 0, 0, 0.0

    def check(self, info: os.stat_result, name: str) -> None:
        if self.uid is not None and info.st_uid != self.uid:
            raise Refused(f"{name} belongs to {_user(info.st_uid)}, not to {_user(self.uid)}")
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise Refused(f"it holds more than {MAX_ENTRIES} files and folders")
        self.last_change = max(self.last_change, info.st_ctime)

    def copy_folder(self, fd: int, target: str, shown: str, depth: int = 0) -> None:
        self.check(os.fstat(fd), shown or "the folder")
        if depth > MAX_DEPTH:
            raise Refused(f"it nests folders more than {MAX_DEPTH} deep")
        os.mkdir(target, 0o700)
        for name in sorted(os.listdir(fd)):
            path = f"{shown}/{name}" if shown else name
            if not PRINTABLE_NAME.fullmatch(name):
                raise Refused(f"{path!r} is not a printable UTF-8 name")
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    self.copy_folder(child, os.path.join(target, name), path, depth + 1)
                finally:
                    os.close(child)
            elif stat.S_ISREG(info.st_mode):
                self.copy_file(fd, name, os.path.join(target, name), path)
            else:
                raise Refused(f"{path} is a {_kind(info.st_mode)}; only files and folders are collected")

    def copy_file(self, folder_fd: int, name: str, target: str, shown: str) -> None:
        # O_NONBLOCK: a pipe swapped in after the check must not block the open; fstat refuses it.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(f"{shown} is a {_kind(info.st_mode)}; only files and folders are collected")
            if info.st_nlink != 1:
                raise Refused(f"{shown} has {info.st_nlink} names (a hard link); only plain files are collected")
            self.check(info, shown)
            with open(fd, "rb", closefd=False) as source, open(target, "xb") as copy:
                while chunk := source.read(2**20):
                    self.bytes += len(chunk)
                    if self.bytes > MAX_SUBMISSION_BYTES:
                        raise Refused(f"it is larger than {MAX_SUBMISSION_BYTES // 2**20} MiB")
                    copy.write(chunk)
        finally:
            os.close(fd)


def _claimed_time(path: str) -> tuple[str | None, datetime.datetime | None]:
    """What ``timestamp.txt`` says, and the time it means if written in nbgrader's format."""
    if os.path.isdir(path):      # the staged copy is the grader's own: no links in it
        shutil.rmtree(path)
        return "a folder", None
    try:
        with open(path, "rb") as file:
            written = file.read(100).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None, None
    if not TIMESTAMP_SHAPE.fullmatch(written):
        return written, None
    try:
        return written, parse_utc(written)
    except (ValueError, OverflowError):
        return written, None


def _trusted_timestamp(staged: str, last_change: float) -> tuple[str, str | None]:
    """The submission's time, and a note when its ``timestamp.txt`` claimed another one."""
    changed = datetime.datetime.fromtimestamp(last_change, datetime.timezone.utc)
    path = os.path.join(staged, "timestamp.txt")
    written, claimed = _claimed_time(path)
    slack = datetime.timedelta(seconds=CLOCK_SLACK_S)
    naive = changed.replace(tzinfo=None)   # parse_utc: naive UTC
    if claimed is not None and naive - slack <= claimed <= naive + slack:
        return written, None
    trusted = changed.strftime(TIMESTAMP_FORMAT)
    with open(path, "w") as file:
        file.write(trusted)
    said = f"claimed {written!r}" if written else "had no readable timestamp.txt"
    return trusted, f"{said}; its files were last changed at {trusted}, which counts"


def _stage_one(inbound_fd: int, name: str, claimed: str, target: str) -> tuple[str | None, str | None]:
    """Copy one inbound entry to ``target``: ``(its trusted time, a note)``, or ``(None, why
    it was refused)``."""
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=inbound_fd)
    except OSError as exc:  # gone, renamed or not a folder since it was listed
        return None, f"REFUSED {name!r}: it could not be opened as a folder ({exc.strerror})"
    try:
        owner = _user(os.fstat(folder).st_uid)
        if owner != claimed:
            raise Refused(f"names {claimed!r} but was made by {owner}")
        copier = _Copier(os.fstat(folder).st_uid)
        copier.copy_folder(folder, target, "")
        timestamp, note = _trusted_timestamp(target, copier.last_change)
        return timestamp, note and f"CORRECTED {name!r}: {note}"
    except (Refused, OSError) as why:   # OSError: changed under us while it was copied
        reason = str(why)
    except Exception as exc:   # noqa: BLE001 - whatever one entry holds, the class is collected
        reason = f"it could not be staged ({type(exc).__name__}: {str(exc)[:200]!r})"
    finally:
        os.close(folder)
    shutil.rmtree(target, ignore_errors=True)
    return None, f"REFUSED {name!r}: {reason}"


def stage_submissions(assignment: str, staged_inbound: str) -> list[str]:
    """Copy every checked submission of ``assignment`` into ``staged_inbound``; describe each
    one refused or corrected (the others are copied silently). One entry's trouble never stops
    the others."""
    inbound = os.path.join(config.exchange_root(), config.COURSE_ID, "inbound")
    os.makedirs(staged_inbound, mode=0o700, exist_ok=True)
    if not os.path.isdir(inbound):
        return []
    notes = []
    inbound_fd = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for number, name in enumerate(sorted(os.listdir(inbound_fd))):
            parts = name.rsplit("+", 3)     # as nbgrader reads it: a user name may hold a "+"
            if len(parts) < 3 or parts[1] != assignment:
                continue
            target = os.path.join(staged_inbound, f"staging-{number}")
            timestamp, note = _stage_one(inbound_fd, name, parts[0], target)
            if note:
                notes.append(note)
            if timestamp is not None:
                # nbgrader picks each student's latest by the time in the name: the trusted one.
                os.rename(target, os.path.join(staged_inbound, f"{parts[0]}+{assignment}+{timestamp}+{number}"))
    finally:
        os.close(inbound_fd)
    return notes


def course_folder_problem() -> str | None:
    """Why ``publish`` must not write to the exchange's course folder, or ``None``.

    The exchange's root is writable by everyone (1777): a student who makes ``<exchange>/<course>``
    before the first ``publish`` owns it, so they could fill its ``outbound`` folder with their own
    "release" and read or remove what the class hands in. The folder must be the grader's own."""
    folder = os.path.join(config.exchange_root(), config.COURSE_ID)
    try:
        info = os.stat(folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return f"the exchange's course folder {folder} is a {_kind(info.st_mode)}, not a folder"
    if info.st_uid != os.geteuid():
        return (f"the exchange's course folder {folder} belongs to {_user(info.st_uid)}, not to you "
                f"({_user(os.geteuid())}): someone made it before the course's first publish. Look at what is "
                "in it, remove it (it needs root: the exchange is sticky), and publish again")
    return None


def _remove(path: str) -> None:
    """Remove what was partly copied to ``path`` (the grader's own copy: no links in it)."""
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def copy_class_folder(source: str, archive: str) -> tuple[int, list[str]]:
    """``collect --from SOURCE``: copy each entry of ``SOURCE`` (a student's ``.zip`` or folder)
    into ``archive`` with the same checks as a submission (no links followed, no pipes, the
    caps), except the owner: the instructor may have downloaded them all. Returns how many
    were copied and a line per entry refused."""
    copied, notes = 0, []
    source_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in sorted(os.listdir(source_fd)):
            target = os.path.join(archive, name)
            try:
                if not PRINTABLE_NAME.fullmatch(name):
                    raise Refused("it is not a printable UTF-8 name")
                info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
                copier = _Copier(None)
                if stat.S_ISDIR(info.st_mode):
                    folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=source_fd)
                    try:
                        copier.copy_folder(folder, target, "")
                    finally:
                        os.close(folder)
                elif stat.S_ISREG(info.st_mode):
                    copier.copy_file(source_fd, name, target, name)
                else:
                    raise Refused(f"it is a {_kind(info.st_mode)}; only files and folders are collected")
                copied += 1
            except Exception as why:   # noqa: BLE001 - one entry's trouble never stops the class
                _remove(target)
                reason = str(why) if isinstance(why, (Refused, OSError)) else f"{type(why).__name__}: {why}"
                notes.append(f"REFUSED {name!r}: {reason}")
    finally:
        os.close(source_fd)
    return copied, notes
