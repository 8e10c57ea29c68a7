"""``release``: the student version of each assignment, generated from ``solutions/``.

nbgrader's ``generate_assignment`` strips the solutions and hidden tests from
``solutions/<slug>/`` and writes what is left to ``notebooks/<slug>/`` (or another folder).
With ``--force`` it first deletes that folder and then writes it again, so for a few seconds
``notebooks/<slug>/`` does not exist: a book build, a student's ``git pull`` of the published
course or a test reading it meanwhile finds no notebook (one CI run did). So nbgrader writes
into a folder beside the target, and :func:`replace_folder` then moves each file into place
with one ``os.replace``: a reader sees the old file or the new one, never none.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from distlab.grade import config
from distlab.grade.pipeline.run_nbgrader import nbgrader, say


def slugs_in(folder: str) -> list[str]:
    """The assignments of ``folder`` (of the repository): each ``<slug>/<slug>.ipynb``."""
    root = os.path.join(config.repo_root(), folder)
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, f"{d}.ipynb")))


def release(slugs: list[str], to: str | None = None) -> int:
    """``nbgrader generate_assignment`` for each slug (all of ``solutions/`` by default), into
    ``notebooks/`` or ``to``; 1 if any failed."""
    slugs = slugs or slugs_in("solutions")
    target = os.path.abspath(to or os.path.join(config.repo_root(), "notebooks"))
    os.makedirs(target, exist_ok=True)
    failed, start = 0, time.monotonic()
    for i, slug in enumerate(slugs, 1):
        say(f"release {i}/{len(slugs)}: solutions/{slug} -> {target if to else 'notebooks'}/{slug}")
        staged = tempfile.mkdtemp(prefix=f".{slug}-", dir=target)
        try:
            done = nbgrader("generate_assignment", slug, "--force", f"--CourseDirectory.release_directory={staged}")
            failed += done != 0
            if done == 0:
                replace_folder(os.path.join(staged, slug), os.path.join(target, slug))
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    say(f"release: {len(slugs) - failed} of {len(slugs)} released in {time.monotonic() - start:.1f} s")
    return int(failed > 0)


def replace_folder(new: str, old: str) -> None:
    """Make folder ``old`` hold what ``new`` holds: each file moved over with ``os.replace``,
    then the files ``new`` did not have removed."""
    kept = set()
    for folder, _, files in os.walk(new):
        relative = os.path.relpath(folder, new)
        os.makedirs(os.path.join(old, relative), exist_ok=True)
        for name in files:
            os.replace(os.path.join(folder, name), os.path.join(old, relative, name))
            kept.add(os.path.normpath(os.path.join(relative, name)))
    for folder, _, files in os.walk(old):
        for name in files:
            if os.path.normpath(os.path.join(os.path.relpath(folder, old), name)) not in kept:
                os.remove(os.path.join(folder, name))
