"""Checks on nbgrader's exchange before the instructor collects from it.

On a multi-user hub, students submit with ``nbgrader submit``, which copies their folder to
``<exchange>/<course>/inbound/<student>+<assignment>+<timestamp>+<random>``. The inbound
folder lets students write but not list, so nobody can read or even find another student's
submission. But the ``<student>`` in the name is whatever the submitter said, and ``nbgrader
collect`` believes it: ``nbgrader submit --student=alice ...`` hands in work as Alice (or
overwrites her grade with a blank one). The file system knows better: the folder is owned by the Unix account that made it.
:func:`set_aside_impostors` moves every submission whose owner is not the student it names
out of the inbound folder (into the grading work folder, for the instructor to look at),
before nbgrader collects.
"""

from __future__ import annotations

import os
import pwd
import shutil

from distlab.grade import config


def _owner(path: str) -> str:
    uid = os.lstat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def set_aside_impostors(assignment: str) -> list[str]:
    """Move submissions of ``assignment`` not made by the student they name; describe each."""
    inbound = os.path.join(config.exchange_root(), config.COURSE_ID, "inbound")
    if not os.path.isdir(inbound):
        return []
    refused_dir = os.path.join(config.work_dir(), "refused")
    refused = []
    for name in sorted(os.listdir(inbound)):
        parts = name.split("+")
        if len(parts) < 3 or parts[1] != assignment:
            continue
        claimed, folder = parts[0], os.path.join(inbound, name)
        owners = {_owner(folder)} | {_owner(os.path.join(top, f)) for top, _, files in os.walk(folder) for f in files}
        if owners != {claimed}:
            os.makedirs(refused_dir, mode=0o700, exist_ok=True)
            shutil.move(folder, os.path.join(refused_dir, name))
            refused.append(f"{name!r} names {claimed} but was made by {', '.join(sorted(owners))}: "
                           f"moved to {refused_dir}")
    return refused
