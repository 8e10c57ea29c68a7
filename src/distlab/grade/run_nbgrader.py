"""Running one nbgrader command for the instructor's commands (:mod:`distlab.grade.__main__`).

nbgrader is run as its own process, with the course's configuration (``grader/`` is its
working folder, so ``grader/nbgrader_config.py`` is read) and this distlab first on the path.
Its log is streamed as it comes, tidied (routine lines dropped, ``a/../b`` paths shortened),
and kept in :data:`OUTPUT`, so a command can say in one line what went wrong.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from distlab.grade import config
from distlab.runtime import processes

QUIET = ("Copying ", "  Copying to:", "Overwriting files", "Creating/updating student",
         "Removing existing", "Updating/creating", "Extracting from", "  Extracting to",
         "Directory not found. Creating:")
"""nbgrader log lines that report routine work (zip_collect logs making each new folder as a WARNING)."""


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
    command = [sys.executable, "-m", "distlab.grade.nbgrader_app", *args]   # nbgrader, 1.5 s sooner
    say("$ nbgrader " + " ".join(args))
    env = config.nbgrader_environment(dict(os.environ))
    # nbgrader runs the `alembic` command by name: the .venv's bin must come first on PATH.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(repo, "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # nbgrader dies with this command (killed, its terminal closed): its kernel and clean room
    # die with nbgrader in turn, so nothing grades on unseen.
    proc = subprocess.Popen(command, cwd=os.path.join(repo, "grader"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=processes.die_with_parent)
    OUTPUT.clear()
    for line in proc.stdout:
        line = tidy_paths(line.rstrip())
        OUTPUT.append(line)
        if not any(q in line for q in QUIET):
            print("    " + line, flush=True)
    return proc.wait()


def tidy_paths(line: str) -> str:
    """``/repo/grader/../../srv/work/x`` -> ``/srv/work/x``: paths nbgrader built from relative settings."""
    return re.sub(r"/[^\s'\"]*/\.\./[^\s'\"]*", lambda m: os.path.normpath(m.group(0)), line)
