"""``distlab.run``: call a function on N ranks and get one result per rank back.

    >>> import distlab, torch.distributed as dist
    >>> distlab.run(lambda: dist.get_rank() * 10, nprocs=4)
    [0, 10, 20, 30]

What happens, step by step:

1. The arguments are checked before anything starts (a bad ``nprocs``, something that
   cannot be pickled, NCCL without GPUs: each fails at once with a clear message).
2. The function and its arguments are pickled into a fresh run directory
   (:mod:`distlab.rundir`); cloudpickle sends notebook functions by value.
3. ``torchrun --standalone`` starts N workers (:mod:`distlab.worker`). Each joins the
   process group, runs the function and writes its result or its exception.
4. Meanwhile we stream every line the ranks print, prefixed ``[rank k]``, and watch for
   three ways to finish: every rank delivered a result (return them); a rank failed
   (raise :class:`~distlab.RankError` and stop the others at once); time is up (raise
   :class:`~distlab.DistTimeout`, saying which call each rank is stuck in).
5. Whatever happened, including Ctrl-C, every process we started is ended
   (:mod:`distlab.processes`) and the run directory is deleted.

Success is judged by the results the ranks delivered, not by torchrun's exit code.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from distlab import serialize
from distlab import rundir as files
from distlab import slurm
from distlab.local import LocalJob

MAX_NPROCS = 64
"""The most ranks one local run may start (8 processes on 2 cores already crawl)."""

BACKENDS = (None, "auto", "gloo", "nccl")


_rank_setup: contextvars.ContextVar[tuple] = contextvars.ContextVar("distlab_rank_setup", default=())


@contextlib.contextmanager
def rank_setup(module: str, function: str, when: str = "call", **kwargs):
    """Run ``module.function(**kwargs)`` on every rank of the runs started inside this block.

    ``when="start"`` runs it first thing in the rank (before torch is imported: resource
    limits); ``when="call"`` runs it just before the user's function (after the process group
    and the call recorder exist: e.g. disabling APIs an exercise forbids). The grader uses
    this; the arguments must be JSON-serialisable.
    """
    if when not in ("start", "call"):
        raise ValueError(f"when must be 'start' or 'call', got {when!r}")
    step = {"module": module, "function": function, "when": when, "kwargs": kwargs}
    token = _rank_setup.set(_rank_setup.get() + (step,))
    try:
        yield
    finally:
        _rank_setup.reset(token)


def current_rank_setup() -> list[dict]:
    """The setup steps of the enclosing :func:`rank_setup` blocks, outermost first."""
    return list(_rank_setup.get())


LAUNCHERS = {"local": LocalJob, "srun": slurm.SrunJob, "sbatch": slurm.SbatchJob}
"""Launcher name -> job class. ``"auto"`` picks one (see :func:`choose_launcher`)."""


def choose_launcher(name: str) -> type:
    """The job class for a launcher name.

    ``"auto"`` means: ``$DISTLAB_LAUNCHER`` if set; else ``"srun"`` inside a Slurm allocation
    (``SLURM_JOB_ID`` set and ``srun`` installed: a shell from ``salloc``, a batch job, a
    notebook server started as a Slurm job); else ``"local"``.
    """
    if name == "auto":
        name = os.environ.get("DISTLAB_LAUNCHER") or ("srun" if slurm.in_allocation() else "local")
    if name not in LAUNCHERS:
        raise ValueError(f"launcher must be 'auto' or one of {sorted(LAUNCHERS)}, got {name!r}")
    return LAUNCHERS[name]


def run(fn, *args, nprocs: int = 2, timeout: float = 60.0, backend: str | None = None,
        threads: int | None = None, seed: int = 0, launcher: str = "auto", **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` ranks and return their results in rank order.

    Args:
        fn: any callable; a function defined in the notebook travels by value.
        nprocs: number of ranks (1 to ``MAX_NPROCS``).
        timeout: seconds the function may run, counted from the moment every rank has
            joined the process group. Past it: :class:`DistTimeout`. Starting the ranks is not
            counted (a cold start costs ~4 s for 2 ranks and ~7 s for 4 on 2 CPU cores); it
            has its own limit, ``DISTLAB_START_TIMEOUT`` (default 180 s).
        backend: ``None`` picks NCCL when every rank can have its own GPU, gloo otherwise;
            or ``"gloo"`` / ``"nccl"`` explicitly.
        threads: torch threads per rank; default ``max(1, cores // ranks on the node)``,
            decided on the node each rank runs on.
        seed: every rank seeds ``random``, ``torch`` (and ``numpy`` if loaded) with it.
        launcher: ``"local"`` (torchrun on this machine), ``"srun"`` (inside a Slurm allocation),
            ``"sbatch"`` (a Slurm batch job) or ``"auto"`` (srun inside an allocation, else local).

    The names ``nprocs, timeout, backend, threads, seed, launcher`` are taken by ``run``;
    pass arguments of ``fn`` with those names positionally.

    When a :class:`distlab.Pool` of ``nprocs`` ranks is active (``%distributed start``), the
    call runs on its warm ranks instead of new ones, with the same behaviour and errors.

    Every other keyword argument goes to ``fn``. The process group is ready when ``fn``
    starts; ``torch.distributed.get_rank()`` tells a rank who it is.

    Raises:
        RankError: a rank raised (or died); the other ranks are stopped at once.
        DistTimeout: ``timeout`` passed; the message says what every rank was doing.
        ValueError, TypeError: bad arguments, before any process starts.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame from tracebacks
    from distlab.pool import active_pool

    pool = active_pool(nprocs, backend, threads, launcher)
    if pool is not None:
        return pool.run(fn, *args, timeout=timeout, seed=seed, **kwargs)
    check_arguments(fn, nprocs, timeout, backend, threads)
    job_class = choose_launcher(launcher)
    blob = serialize.dumps_call(fn, args, kwargs)
    run_dir = Path(tempfile.mkdtemp(prefix="distlab-"))
    try:
        (run_dir / files.PAYLOAD).write_bytes(blob)
        options = {"sys_path": [os.path.abspath(p) for p in sys.path if p], "seed": seed,
                   "setup": current_rank_setup()}
        (run_dir / files.OPTIONS).write_text(json.dumps(options))
        job = job_class(run_dir, nprocs, timeout, backend, threads)
        try:
            return job.wait()
        finally:
            job.stop()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def check_arguments(fn, nprocs, timeout, backend, threads) -> None:
    if not callable(fn):
        raise TypeError(f"distlab.run needs a function to call, got {type(fn).__name__} {fn!r}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be an integer, got {nprocs!r}")
    if not 1 <= nprocs <= MAX_NPROCS:
        raise ValueError(f"nprocs must be between 1 and {MAX_NPROCS}, got {nprocs}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of None, 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < nprocs:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: {nprocs} ranks asked for, {gpus} GPU(s) "
                "visible here. Use backend=None (gloo on the CPU) or fewer ranks.")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")


