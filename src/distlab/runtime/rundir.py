"""The run directory: how the notebook and its ranks talk without sharing memory.

Every call to :func:`distlab.run` gets a fresh private directory (``tempfile.mkdtemp``), so
two runs, from two notebooks or two users, never touch the same files. Inside it:

======================  =====================================================
``options.json``        the caller's ``sys.path`` and the seed (read before unpickling)
``payload.pkl``         the function and its arguments (written by the caller)
``pid-<k>``             process id of rank ``k`` (written first thing by the rank)
``state-<k>.json``      what rank ``k`` is doing now: in user code, or blocked in
                        which distributed call (kept up to date by the rank)
``out-<k>``/``err-<k>`` everything rank ``k`` prints (its file descriptors 1 and 2)
``result-<k>.pkl``      the value rank ``k``'s function returned
``error-<k>.pkl``       the exception rank ``k`` raised, with its traceback
``agent.log``           what torchrun itself printed
======================  =====================================================

A pool (:class:`distlab.Pool`) keeps its ranks for many calls: each call gets a folder
``call-<k>`` holding that call's ``options.json``, ``payload.pkl``, results and errors,
while pids, states and output stay at the top. A ``stop`` file tells idle ranks to leave.

Files that others read are written to a temporary name and renamed into place, so a
reader sees either nothing or the whole file, never half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PAYLOAD = "payload.pkl"
OPTIONS = "options.json"
AGENT_LOG = "agent.log"
STOP = "stop"


def call_dir(run_dir: Path, index: int) -> Path:
    """Where call number ``index`` of a pool keeps its payload, results and errors."""
    return run_dir / f"call-{index}"


def _per_rank(pattern: str):
    """The path of one rank's file in a run (or call) folder: ``pattern`` with the rank filled in."""
    def path(rundir: Path, rank: int) -> Path:
        return Path(rundir) / pattern.format(rank=rank)
    path.__doc__ = f"``<rundir>/{pattern}``: see the table above."
    return path


pid_file = _per_rank("pid-{rank}")
state_file = _per_rank("state-{rank}.json")
out_file = _per_rank("out-{rank}")
err_file = _per_rank("err-{rank}")
result_file = _per_rank("result-{rank}.pkl")
error_file = _per_rank("error-{rank}.pkl")


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` so that readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_state(rundir: Path, rank: int, state: dict) -> None:
    write_atomically(state_file(rundir, rank), json.dumps(state).encode())


def read_state(rundir: Path, rank: int) -> dict | None:
    try:
        return json.loads(state_file(rundir, rank).read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def read_pid(rundir: Path, rank: int) -> int | None:
    try:
        return int(pid_file(rundir, rank).read_text())
    except (FileNotFoundError, ValueError):
        return None
