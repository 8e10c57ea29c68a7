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
* **The time.** Lateness is decided by ``timestamp.txt``, which the student's own process
  writes. The file system's change time (``ctime``) is not the student's to set: it moves to
  *now* on every change, and only root can move the clock. A claimed time more than
  :data:`CLOCK_SLACK_S` before the submission's last change is replaced by that change time.
  (An honest claim is kept as written: nbgrader names the returned feedback by a hash that
  includes it.)

``nbgrader collect`` then reads the private copy, never the exchange.
"""

from __future__ import annotations

import datetime
import os
import pwd
import shutil
import stat

from nbgrader.utils import parse_utc

from distlab.grade import config

MAX_SUBMISSION_BYTES = 64 * 2**20
"""Largest submission collected (all its files together): a notebook with figures is a few MiB."""

MAX_ENTRIES = 1000
"""Most files and folders in one submission."""

CLOCK_SLACK_S = 120
"""How far ``timestamp.txt`` may claim a time before the files' last change: nbgrader writes it
just before copying, and a shared file system's clock may differ from a login node's by a
little."""

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"
"""nbgrader's own format (``Exchange.timestamp_format``)."""


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

    def __init__(self, uid: int):
        self.uid, self.bytes, self.entries, self.last_change = uid, 0, 0, 0.0

    def check(self, info: os.stat_result, name: str) -> None:
        if info.st_uid != self.uid:
            raise Refused(f"{name} belongs to {_user(info.st_uid)}, not to {_user(self.uid)}")
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise Refused(f"it holds more than {MAX_ENTRIES} files and folders")
        self.last_change = max(self.last_change, info.st_ctime)

    def copy_folder(self, fd: int, target: str, shown: str) -> None:
        self.check(os.fstat(fd), shown or "the folder")
        os.mkdir(target, 0o700)
        for name in sorted(os.listdir(fd)):
            path = f"{shown}/{name}" if shown else name
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    self.copy_folder(child, os.path.join(target, name), path)
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


def _trusted_timestamp(staged: str, last_change: float) -> tuple[str, str | None]:
    """The submission's time, and a note when its ``timestamp.txt`` claimed an earlier one."""
    changed = datetime.datetime.fromtimestamp(last_change, datetime.timezone.utc)
    path = os.path.join(staged, "timestamp.txt")
    try:
        with open(path) as file:
            written = file.read().strip()
        claimed = parse_utc(written)
    except (OSError, ValueError, OverflowError):
        written, claimed = None, None
    slack = datetime.timedelta(seconds=CLOCK_SLACK_S)
    if claimed is not None and claimed >= changed.replace(tzinfo=None) - slack:  # parse_utc: naive UTC
        return written, None
    trusted = changed.strftime(TIMESTAMP_FORMAT)
    with open(path, "w") as file:
        file.write(trusted)
    said = f"claimed {written!r}" if written else "had no readable timestamp.txt"
    return trusted, f"{said}; its files were last changed at {trusted}, which counts"


def stage_submissions(assignment: str, staged_inbound: str) -> list[str]:
    """Copy every checked submission of ``assignment`` into ``staged_inbound``; describe each
    one refused or corrected (the others are copied silently)."""
    inbound = os.path.join(config.exchange_root(), config.COURSE_ID, "inbound")
    os.makedirs(staged_inbound, mode=0o700, exist_ok=True)
    if not os.path.isdir(inbound):
        return []
    notes = []
    inbound_fd = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in sorted(os.listdir(inbound_fd)):
            parts = name.rsplit("+", 3)     # as nbgrader reads it: a user name may hold a "+"
            if len(parts) < 3 or parts[1] != assignment:
                continue
            claimed, rest = parts[0], parts[3:]
            target = os.path.join(staged_inbound, name)
            try:
                folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=inbound_fd)
            except OSError as exc:  # gone, renamed or not a folder since it was listed
                notes.append(f"{name!r} could not be opened ({exc.strerror}): not collected")
                continue
            try:
                owner = _user(os.fstat(folder).st_uid)
                if owner != claimed:
                    raise Refused(f"names {claimed} but was made by {owner}")
                copier = _Copier(os.fstat(folder).st_uid)
                copier.copy_folder(folder, target, "")
            except (Refused, OSError) as why:   # OSError: changed under us while it was copied
                shutil.rmtree(target, ignore_errors=True)
                notes.append(f"REFUSED {name!r}: {why}")
                continue
            finally:
                os.close(folder)
            timestamp, note = _trusted_timestamp(target, copier.last_change)
            if note:
                notes.append(f"CORRECTED {name!r}: {note}")
            # nbgrader picks each student's latest by the time in the name: the trusted one.
            os.rename(target, os.path.join(staged_inbound, "+".join([claimed, assignment, timestamp, *rest])))
    finally:
        os.close(inbound_fd)
    return notes
