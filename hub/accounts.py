"""The demo course's Unix accounts: real users, as a centre's login system would have them.

The hub authenticates with PAM, so a student is a Unix account with a password, and the
spawner submits each server's Slurm job *as* that account. A course is a name prefix and two
groups:

    <course>-instructor1               in <course>-instructors  (the hub's admins)
    <course>-student1 ... studentN     in <course>-students     (may log in)

Homes are private (mode 0700): a student cannot read another student's files, whether through
the hub or from inside a server. ``remove_accounts`` deletes only accounts of the course's two
groups whose names carry the prefix, with their homes; nothing else is touched.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import subprocess
from pathlib import Path


def _run(cmd: list[str], **kwargs) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30, **kwargs)


def groups(course: str) -> tuple[str, str]:
    return f"{course}-students", f"{course}-instructors"


def create_accounts(course: str, students: int = 3, instructors: int = 1) -> dict[str, str]:
    """Create the course's groups and accounts (those missing); return {user: new password}.

    Every call sets a fresh random password on each account (they are printed once, by the
    caller); homes are created 0700.
    """
    if os.geteuid() != 0:
        raise PermissionError("creating Unix accounts needs root (the demo hub runs as root, as PAM needs)")
    student_group, instructor_group = groups(course)
    for group in (student_group, instructor_group):
        try:
            grp.getgrnam(group)
        except KeyError:
            _run(["groupadd", group])
    wanted = [(f"{course}-instructor{i}", instructor_group) for i in range(1, instructors + 1)]
    wanted += [(f"{course}-student{i}", student_group) for i in range(1, students + 1)]
    passwords = {}
    for user, group in wanted:
        try:
            pwd.getpwnam(user)
        except KeyError:
            _run(["useradd", "--create-home", "--shell", "/bin/bash", "--gid", group, user])
        os.chmod(pwd.getpwnam(user).pw_dir, 0o700)
        passwords[user] = secrets.token_urlsafe(9)
        _run(["chpasswd"], input=f"{user}:{passwords[user]}\n")
    return passwords


def course_accounts(course: str) -> list[str]:
    """The accounts ``remove_accounts`` would delete: prefix and primary group both match."""
    gids = set()
    for group in groups(course):
        try:
            gids.add(grp.getgrnam(group).gr_gid)
        except KeyError:
            pass
    return sorted(p.pw_name for p in pwd.getpwall() if p.pw_name.startswith(f"{course}-") and p.pw_gid in gids)


def remove_accounts(course: str) -> list[str]:
    """Delete the course's accounts (homes included) and its groups; return the users removed."""
    removed = course_accounts(course)
    for user in removed:
        home = Path(pwd.getpwnam(user).pw_dir)
        _run(["userdel", "--remove", user])
        if home.exists():  # userdel leaves a home it did not create; ours, so remove it
            _run(["rm", "-rf", "--one-file-system", str(home)])
    for group in groups(course):
        try:
            grp.getgrnam(group)
            _run(["groupdel", group])
        except KeyError:
            pass
    return removed
