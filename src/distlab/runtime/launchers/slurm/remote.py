"""What both Slurm launchers share: ranks on other machines, seen through files and Slurm's word.

On a cluster the ranks run on the allocation's nodes. Their process ids belong to other
machines (here they could name an unrelated process), so the Slurm jobs never judge or signal
ranks by pid: the :class:`~distlab.runtime.watcher.Watcher` reads their files from a run
directory every node sees (:func:`shared_run_dir`), and when the ranks end early, Slurm's
own words say why (:func:`explain_end`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from distlab.runtime import rundir as files
from distlab.runtime.errors import LaunchError, RankError
from distlab.runtime.launchers.slurm.commands import WHY_IT_ENDED, SlurmJobError
from distlab.runtime.launchers.slurm.config import SlurmConfig
from distlab.runtime.launchers.torchrun import exit_code_from_log
from distlab.runtime.watcher import describe_exit, first_failure, tail

POLL_SECONDS = 0.1
"""How often the watcher looks at a run directory on a shared filesystem (less often than locally)."""

END_GRACE_SECONDS = 3.0
"""After Slurm says the ranks ended, wait this long for their last files to show up: on a
shared filesystem another node's writes can take a moment to become visible here."""

STEP_ENDINGS = [  # what slurmstepd writes when it ends a step: (pattern, state)
    (r"DUE TO TIME LIMIT", "TIMEOUT"),
    (r"DUE TO PREEMPTION", "PREEMPTED"),
    (r"DUE TO NODE FAILURE", "NODE_FAIL"),
    (r"CANCELLED AT", "CANCELLED"),
    (r"oom[-_ ]kill", "OUT_OF_MEMORY"),
]


def shared_run_dir(local_run_dir: Path, config: SlurmConfig) -> Path:
    """A fresh run directory under ``run_root`` holding a copy of the call's files.

    :func:`distlab.run` wrote the function and its options into a private temporary
    directory on this machine; the other nodes cannot see it, so the files move here.
    """
    root = config.run_root_path
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create run_root {root} ({exc}); set `run_root` in distlab.toml "
                         "to a directory on a filesystem every node sees") from None
    shared = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    for name in (files.PAYLOAD, files.OPTIONS):
        if (local_run_dir / name).exists():
            shutil.copy2(local_run_dir / name, shared / name)
    return shared


def remove_run_dir(path: Path, succeeded: bool) -> None:
    """Delete a finished run's directory; after a failure keep it, its logs tell what happened."""
    if succeeded:
        shutil.rmtree(path, ignore_errors=True)


def explain_end(watcher, what: str, state: str | None, log: str, log_name: str, job_id: str | None) -> Exception:
    """The exception for ranks that ended (by Slurm's word) without all delivering results.

    ``what`` names the step or job, ``state`` is how Slurm ended it (``CANCELLED``, ...; or
    ``None``), ``log`` is its output, read from ``log_name``.
    """
    reports = watcher.reports()
    if reports:  # a rank raised: that is the story, whatever Slurm did afterwards
        return first_failure(reports)
    missing = watcher.missing()
    started = [r for r in range(watcher.nprocs) if files.read_state(watcher.run_dir, r) is not None]
    doing = "\n".join(f"  rank {r}: {s}" for r, s in sorted(watcher.rank_states().items()))
    output = f"Last lines of {log_name}:\n{tail(log, 20)}" if log.strip() else f"({log_name} is empty)"
    if state in WHY_IT_ENDED:
        said = slurm_lines(log)  # Slurm's own words; torchrun's traceback of the signal is noise
        output = f"What Slurm said (in {log_name}):\n{said}" if said else output
        return SlurmJobError(
            f"{what} {WHY_IT_ENDED[state]} before ranks {missing} returned.\n"
            f"What each rank was doing:\n{doing}\n{output}", job_id, state)
    if not started:
        return LaunchError(f"{what} ended before any rank started. {output}")
    codes = {r: exit_code_from_log(log, r) for r in missing}
    culprits = [r for r in missing if codes[r] not in (None, -15, -9)] or missing
    rank = culprits[0]
    return RankError(rank, "ProcessExited",
                     f"the process of rank {rank} {describe_exit(codes[rank])} before returning a result or "
                     f"raising ({what} ended). {output}", "", None,
                     {r: "did not finish (stopped)" for r in missing if r != rank})


def slurm_lines(log: str, most: int = 8) -> str:
    """The lines Slurm's own tools wrote into a job's output (``srun: ...``, ``slurmstepd...``)."""
    lines = [line for line in log.splitlines()
             if re.match(r"(srun|slurmstepd\S*|salloc|sbatch): ", line) or "***" in line]
    return "\n".join(lines[-most:])


def state_from_step_log(log: str) -> str | None:
    """How Slurm ended a step, from what srun printed (``... CANCELLED AT ...``)."""
    for pattern, state in STEP_ENDINGS:
        if re.search(pattern, log, flags=re.I):
            return state
    return None


def show(message: str) -> None:
    print(f"[slurm] {message}", flush=True)
