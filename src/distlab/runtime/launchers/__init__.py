"""Launchers: what starts the ranks of a run, chosen by name.

========  ==============================================================================
local     ``torchrun`` on this machine (:mod:`.local`)
fork      this machine, ranks forked from one process that imported torch once (:mod:`.forked`)
srun      a job step of the Slurm allocation we are in (:mod:`.slurm.srun`)
sbatch    a Slurm batch job, from a login node (:mod:`.slurm.sbatch`)
========  ==============================================================================

Every launcher is a *job* class with ``wait()``, ``wait_until_ready()`` and ``stop()``; the
waiting itself is the one :class:`~distlab.runtime.watcher.Watcher` they all compose.
"""

from __future__ import annotations

import os

NAMES = ("local", "fork", "srun", "sbatch")


def choose(name: str, backend: str | None = None) -> type:
    """The job class for a launcher name (and backend: ``"relay"`` runs on the fork launcher only,
    whose agent hands each rank its end of the router, :mod:`distlab.relay`).

    ``"auto"`` means: ``$DISTLAB_LAUNCHER`` if set; else ``"srun"`` inside a Slurm allocation
    (``SLURM_JOB_ID`` set and ``srun`` installed: a shell from ``salloc``, a batch job, a
    notebook server started as a Slurm job); else ``"local"``.
    """
    from distlab.runtime.launchers.slurm.commands import in_allocation

    if backend == "relay":
        if name not in ("auto", "fork"):
            raise ValueError(f"backend='relay' runs with launcher 'fork' (or 'auto'), not {name!r}")
        name = "fork"
    if name == "auto":
        name = os.environ.get("DISTLAB_LAUNCHER") or ("srun" if in_allocation() else "local")
    if name == "local":
        from distlab.runtime.launchers.local import LocalJob

        return LocalJob
    if name == "fork":
        from distlab.runtime.launchers.forked import ForkedJob

        return ForkedJob
    if name == "srun":
        from distlab.runtime.launchers.slurm.srun import SrunJob

        return SrunJob
    if name == "sbatch":
        from distlab.runtime.launchers.slurm.sbatch import SbatchJob

        return SbatchJob
    raise ValueError(f"launcher must be 'auto' or one of {sorted(NAMES)}, got {name!r}")
