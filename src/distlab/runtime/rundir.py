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
``hosts``               ``/etc/hosts`` in the ranks' own network (:mod:`~distlab.runtime.private_network`)
======================  =====================================================

A pool (:class:`distlab.Pool`) keeps its ranks for many calls: each call gets a folder
``call-<k>`` holding that call's ``options.json``, ``payload.pkl``, results and errors,
while pids, states and output stay at the top. A ``stop`` file tells idle ranks to leave.

Files that others read are written to a temporary name and renamed into place, so a
reader sees either nothing or the whole file, never half of it.

A rank in the grader's private room (:mod:`distlab.grade.boundary.rank_room`) sees none of this folder
but a folder of its own, ``rank-<k>``, shown at the run folder's path: what it writes (its
state, its results and errors) lands there, and the names above are links into it. Each
call's ``payload.pkl`` and ``options.json`` are copied into every such folder
(:func:`share_call`), and ``stop`` too (:func:`write_stop`): nothing one rank writes is in
another's view.

The folder's name carries the process id of its owner (``distlab-run-4242-x1y2z3``): the owner
removes it when the run or pool ends, and if the owner was killed first (a kernel ended with
SIGKILL cannot clean up), the next run of the same user on the machine removes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

PAYLOAD = "payload.pkl"
OPTIONS = "options.json"
AGENT_LOG = "agent.log"
STOP = "stop"


OWNED_FOLDER = re.compile(r"distlab-(?:run|pool)-(\d+)-")
"""Name of a run folder: its kind and its owner's process id."""


def new_run_dir(kind: str) -> Path:
    """A fresh private folder for a ``kind`` ("run" or "pool"), after removing the ones that
    owners killed before they could clean up left behind (:func:`remove_orphaned_run_dirs`)."""
    remove_orphaned_run_dirs()
    return Path(tempfile.mkdtemp(prefix=f"distlab-{kind}-{os.getpid()}-"))


def remove_orphaned_run_dirs() -> list[Path]:
    """Remove this user's run folders whose owner process no longer exists; return them.

    Only folders of the current user, in this process's temporary folder, named by
    :func:`new_run_dir`: another user's runs, and ours still owned, are never touched. (Owners
    are looked up in this machine's process table: a grading sandbox, with process ids of its
    own, has a private temporary folder too.)"""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("distlab-*-*-*"):
        owner = OWNED_FOLDER.match(path.name)
        try:
            if owner is None or path.stat().st_uid != os.getuid() or _exists(int(owner.group(1))):
                continue
        except OSError:    # gone meanwhile
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: it exists
        return True
    return True


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


def rank_dir(run_dir: Path, rank: int) -> Path:
    """``<rundir>/rank-<k>``: what rank ``k`` sees of the run folder from inside its private room."""
    return Path(run_dir) / f"rank-{rank}"


def rank_dirs(run_dir: Path) -> dict[int, Path]:
    """``{rank: folder}`` of the ranks of this run that keep a folder of their own."""
    found = {}
    for path in Path(run_dir).glob("rank-*"):
        if path.name[5:].isdigit() and path.is_dir() and not path.is_symlink():
            found[int(path.name[5:])] = path
    return found


def share_call(run_dir: Path, call_dir: Path) -> None:
    """Hand a pool's call (written in ``call_dir``) to the ranks that keep a folder of their own:
    a copy of its files each (``options.json`` last: the go signal), and links from
    ``call_dir`` to where each will write its result or error."""
    call_dir = Path(call_dir)
    for rank, own in rank_dirs(run_dir).items():
        mine = own / call_dir.name
        mine.mkdir()
        for made in (result_file, error_file):
            os.symlink(os.path.relpath(made(mine, rank), call_dir), made(call_dir, rank))
        shutil.copyfile(call_dir / PAYLOAD, mine / PAYLOAD)
        write_atomically(mine / OPTIONS, (call_dir / OPTIONS).read_bytes())


def remove_call(run_dir: Path, call_dir: Path) -> None:
    """Remove a finished call's folder, and its copies in the ranks' own folders."""
    for own in rank_dirs(run_dir).values():
        shutil.rmtree(own / Path(call_dir).name, ignore_errors=True)
    shutil.rmtree(call_dir, ignore_errors=True)


def write_stop(run_dir: Path) -> None:
    """Tell a pool's idle ranks to leave (``stop``), in their own folders too."""
    for folder in [Path(run_dir), *rank_dirs(run_dir).values()]:
        try:
            write_atomically(folder / STOP, b"")
        except OSError:
            pass


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
