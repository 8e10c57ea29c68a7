"""torchrun, as every launcher uses it: its command line, the ranks' environment, its exit codes.

Whatever starts them (here, ``srun`` on each node, a batch job), the ranks are started by
``torchrun`` running ``python -m distlab.runtime.worker RUN_DIR`` once per rank, with the
environment :func:`worker_environment` builds.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from distlab.runtime.processes import TAG_VARIABLE

WORKER = "distlab.runtime.worker"
"""The module every rank runs (see :mod:`distlab.runtime.worker`)."""

NO_LOG_FOLDER = "--log-dir=" + os.devnull
"""torchrun option: keep no log folder. Left to itself, torchrun makes ``torchelastic_*`` in the
node's temporary folder for every run and never removes it; the ranks' output goes to the
console anyway, and what a rank reports (its result, its traceback) is in distlab's run folder."""


def torchrun_command(nprocs: int, run_dir: Path, pool: bool = False) -> list[str]:
    """The local launcher: one torchrun with its own rendezvous on a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nprocs}", "--max-restarts=0", "--monitor-interval=0.05", NO_LOG_FOLDER,
            "--module", WORKER, str(run_dir)] + (["--pool"] if pool else [])


def worker_environment(backend: str | None, threads: int | None) -> dict[str, str]:
    """The environment variables every distlab worker needs, whichever launcher starts it.

    ``threads=None`` lets each rank size its own thread pool from the cores of the node it
    runs on (what a Slurm job needs: the login node's core count says nothing about it).
    """
    package_root = str(Path(__file__).resolve().parents[3])   # .../src, which holds distlab/
    env = {
        "DISTLAB_BACKEND": backend or "",
        "DISTLAB_THREADS": str(threads or ""),
        # The process group must not give up before we do: our timeout names the stuck call.
        "DISTLAB_PG_TIMEOUT": str(24 * 3600),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def agent_environment(run_dir: Path, backend: str | None, threads: int | None) -> dict[str, str]:
    """The whole environment of a launcher's agent (torchrun, or srun that starts torchrun).

    This process's environment, the workers' variables, ``TMPDIR`` pointing into the run
    directory (torchrun's temporary files are deleted with it; the worker gives the user's code
    its own ``TMPDIR`` back, ``DISTLAB_USER_TMPDIR``), and the run's tag, which every process
    of the run inherits (:data:`distlab.runtime.processes.TAG_VARIABLE`). Never the relay's seed,
    which only the router's process may know (:mod:`distlab.relay.schedule`).
    """
    from distlab.relay import schedule

    env = dict(schedule.without_seed(os.environ), **worker_environment(backend, threads))
    env.update(TMPDIR=str(run_dir), DISTLAB_USER_TMPDIR=os.environ.get("TMPDIR", ""))
    env[TAG_VARIABLE] = str(run_dir)
    return env


def exit_code_from_log(log: str, rank: int) -> int | None:
    """A rank's exit code from torchrun's failure summary (``rank : 1 ... exitcode : -9``)."""
    for found_rank, code in re.findall(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log, flags=re.M):
        if int(found_rank) == rank:
            return int(code)
    return None
