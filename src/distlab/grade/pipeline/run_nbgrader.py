"""Running one nbgrader command for the instructor's commands (:mod:`distlab.grade.__main__`).

nbgrader is run as its own process, with the course's configuration (``grader/`` is its
working folder, so ``grader/nbgrader_config.py`` is read) and this distlab first on the path.
Its log is streamed as it comes, tidied (routine lines dropped, ``a/../b`` paths shortened),
and kept in :data:`OUTPUT`, so a command can say in one line what went wrong. It is read as
bytes and capped like a student's printing (:func:`distlab.grade.boundary.student_output.capped_lines`:
control characters neutralised, lines and the whole log cut at :data:`MAX_LOG_LINE_CHARS` and
:data:`MAX_LOG_BYTES`): the log holds text from students, marked as theirs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from distlab.grade import config
from distlab.grade.boundary import student_output
from distlab.runtime import processes

QUIET = ("Copying ", "  Copying to:", "Overwriting files", "Creating/updating student",
         "Removing existing", "Updating/creating", "Extracting from", "  Extracting to",
         "Directory not found. Creating:")
"""nbgrader log lines that report routine work (zip_collect logs making each new folder as a WARNING)."""


MAX_LOG_LINE_CHARS = 4096
"""Longest line of nbgrader's log shown and kept (a student's lines are shorter already)."""

MAX_LOG_BYTES = 64 * 2**20
"""Most of one nbgrader run's log shown and kept: a class of a few hundred, each student's
printing capped at :data:`distlab.grade.boundary.student_output.MAX_LOGGED_BYTES` per phase."""


def say(message: str) -> None:
    print(f"[distlab.grade] {message}", flush=True)


EXTRA: list[str] = []
"""nbgrader options passed through from our command line (``--Class.trait=value``)."""

OUTPUT: list[str] = []
"""What the last nbgrader command printed, line by line."""


def nbgrader(*args: str) -> int:
    """Run ``nbgrader ARGS`` with the course config, streaming its log; return its exit code."""
    repo = config.repo_root()
    config.private_work_dir()
    args = (*args, *EXTRA)
    command = [sys.executable, "-m", "distlab.grade.pipeline.nbgrader_app", *args]   # nbgrader, 1.5 s sooner
    say("$ nbgrader " + " ".join(args))
    env = config.nbgrader_environment(dict(os.environ))
    # nbgrader runs the `alembic` command by name: the .venv's bin must come first on PATH.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(repo, "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # nbgrader dies with this command (killed, its terminal closed): its kernel and clean room
    # die with nbgrader in turn, so nothing grades on unseen.
    proc = subprocess.Popen(command, cwd=os.path.join(repo, "grader"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=processes.die_with_parent)
    OUTPUT.clear()
    for line in student_output.capped_lines(proc.stdout, MAX_LOG_LINE_CHARS, MAX_LOG_BYTES):
        line = tidy_paths(line.rstrip())
        OUTPUT.append(line)
        if not any(q in line for q in QUIET):
            print("    " + line, flush=True)
    return proc.wait()


def tidy_paths(line: str) -> str:
    """``/repo/grader/../../srv/work/x`` -> ``/srv/work/x``: paths nbgrader built from relative settings."""
    return re.sub(r"/[^\s'\"]*/\.\./[^\s'\"]*", lambda m: os.path.normpath(m.group(0)), line)
