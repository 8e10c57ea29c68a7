"""What every run is asked to do, checked once and written once, whoever starts the ranks.

A run (:func:`distlab.run`) and a warm pool's call (:meth:`distlab.Pool.run`) go through the
same three steps here before any launcher is involved:

1. :func:`check_arguments`: a bad ``nprocs``, ``timeout``, ``backend`` or ``threads`` fails at
   once, with a message, before a single process starts.
2. :func:`rank_setup` blocks collect *setup steps*: functions every rank runs when it starts
   (resource caps) or just before the call (the grader's guard). They travel as names and
   JSON arguments, so the rank imports and runs them itself.
3. :func:`write_options` writes ``options.json`` into the run (or call) folder: the caller's
   import path, the seed and the setup steps (and, for ranks borrowed from the book build's
   shared pool, the caller's working directory). The rank reads it before it unpickles the
   function, because unpickling needs the import path and the guard must be in first.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
from pathlib import Path

from distlab.runtime import rundir

MAX_NPROCS = 64
"""The most ranks one local run may start (8 processes on 2 cores already crawl)."""

BACKENDS = (None, "auto", "gloo", "nccl", "relay")
"""``"relay"``: every message through a router in the calling process (:mod:`distlab.relay`)."""
WHEN = ("start", "joined", "call")
"""When a setup step runs on a rank (see :func:`rank_setup`); ``start`` and ``joined`` steps
run once per rank, so they belong to a pool's ranks, ``call`` steps to each call."""
ONCE = ("start", "joined")

_rank_setup: contextvars.ContextVar[tuple] = contextvars.ContextVar("distlab_rank_setup", default=())


def check_arguments(fn, nprocs, timeout, backend, threads) -> None:
    """Raise ``TypeError``/``ValueError`` for arguments no launcher could honour."""
    if not callable(fn):
        raise TypeError(f"distlab.run needs a function to call, got {type(fn).__name__} {fn!r}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be an integer, got {nprocs!r}")
    if not 1 <= nprocs <= MAX_NPROCS:
        raise ValueError(f"nprocs must be between 1 and {MAX_NPROCS}, got {nprocs}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of None, 'gloo', 'nccl' or 'relay', got {backend!r}")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < nprocs:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: {nprocs} ranks asked for, {gpus} GPU(s) "
                "visible here. Use backend=None (gloo on the CPU) or fewer ranks.")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")


@contextlib.contextmanager
def rank_setup(module: str, function: str, when: str = "call", **kwargs):
    """Run ``module.function(**kwargs)`` on every rank of the runs started inside this block.

    ``when="start"`` runs it first thing in the rank (before torch is imported: resource
    limits); ``when="joined"`` once, after the process group and the call recorder exist and
    before the first call (it also gets ``run_dir`` and ``rank``: the grader's private room for
    each rank, :mod:`distlab.grade.boundary.rank_room`); ``when="call"`` runs it just before the user's
    function (e.g. disabling APIs an exercise forbids). The grader uses this; the arguments
    must be JSON-serialisable.
    """
    if when not in WHEN:
        raise ValueError(f"when must be 'start', 'joined' or 'call', got {when!r}")
    step = {"module": module, "function": function, "when": when, "kwargs": kwargs}
    token = _rank_setup.set(_rank_setup.get() + (step,))
    try:
        yield
    finally:
        _rank_setup.reset(token)


@contextlib.contextmanager
def setup_steps(steps: list[dict]):
    """:func:`rank_setup` for each of ``steps`` (dicts as :func:`current_rank_setup` returns), in order."""
    with contextlib.ExitStack() as stack:
        for step in steps:
            stack.enter_context(rank_setup(step["module"], step["function"], when=step["when"], **step["kwargs"]))
        yield


def current_rank_setup(*when: str) -> list[dict]:
    """The setup steps of the enclosing :func:`rank_setup` blocks, outermost first (only those
    of the times ``when`` names, if any)."""
    return [step for step in _rank_setup.get() if not when or step["when"] in when]


def write_options(folder: Path, seed: int, setup: list[dict], cwd: str | None = None) -> None:
    """Write ``options.json`` (import path, seed, setup steps) into a run or call folder.

    ``cwd``: the folder the call must run in, for ranks that started elsewhere (borrowed from
    a shared pool); other ranks run where their launcher started them, the caller's folder.

    Written in one piece (:func:`~distlab.runtime.rundir.write_atomically`): in a pool's call
    folder this file is the "go" signal the waiting ranks look for, so it comes last.
    """
    options = {"sys_path": [os.path.abspath(p) for p in sys.path if p], "seed": seed, "setup": setup}
    if cwd is not None:
        options["cwd"] = cwd
    rundir.write_atomically(Path(folder) / rundir.OPTIONS, json.dumps(options).encode())
