"""Talking to Slurm: every client command with a timeout, and what a launcher asks of it.

When the controller is down, Slurm's client tools block for minutes; every call here has a
limit (:data:`CLIENT_TIMEOUT`) and turns a missing tool or a silent controller into a
:class:`SlurmJobError` that says so.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import socket
import subprocess

from distlab.runtime.errors import LaunchError

CLIENT_TIMEOUT = 30.0
"""Seconds any Slurm command may take (a healthy controller answers in well under one)."""

PORT_RANGE = (20000, 32000)
"""Rendezvous ports are drawn from here: above the well-known services, below Linux's
ephemeral ports (32768+), which the kernel hands out for outgoing connections."""
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                 "RESV_DEL_HOLD"}
"""Job states in which a job is still queued or running."""

WHY_IT_ENDED = {
    "CANCELLED": "was cancelled (scancel, by you, a script or an administrator)",
    "TIMEOUT": "reached its time limit (--time; raise `time` in distlab.toml)",
    "PREEMPTED": "was preempted by a job of higher priority",
    "NODE_FAIL": "lost a node (node failure)",
    "BOOT_FAIL": "could not boot its nodes",
    "OUT_OF_MEMORY": "ran out of memory on a node (ask for more with --mem)",
    "DEADLINE": "passed its deadline",
    "FAILED": "failed",
}
"""What the end states of a job mean, for error messages."""

class SlurmJobError(LaunchError):
    """Slurm ended the job (or step) before every rank returned, or refused it.

    Attributes:
        job_id: the Slurm job id ("12", or "12.3" for a step), or None if never submitted.
        state: Slurm's word for how it ended: ``CANCELLED``, ``TIMEOUT``, ``FAILED``, ...
    """

    def __init__(self, message: str, job_id: str | None = None, state: str | None = None):
        super().__init__(message)
        self.job_id, self.state = job_id, state

    def __reduce__(self):
        return (type(self), (str(self), self.job_id, self.state))


def slurm_command(cmd: list[str], timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """Run a Slurm client command with a timeout; a missing command or a silent controller
    becomes a :class:`SlurmJobError` that says so."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmJobError(f"`{cmd[0]}` was not found: this machine has no Slurm client tools "
                            "(use launcher='local', or run on the cluster's login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmJobError(f"`{shlex.join(cmd)}` got no answer within {timeout:g} s: is the "
                            "Slurm controller down? (`sinfo` tells)") from None


def in_allocation(env=os.environ) -> bool:
    """Are we inside a Slurm allocation (``salloc``, ``sbatch``, a Slurm-spawned notebook)?"""
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


def node_names(nodelist: str) -> list[str]:
    """``distlab-n[1-2]`` -> ``["distlab-n1", "distlab-n2"]``, as ``scontrol show hostnames`` says."""
    out = slurm_command(["scontrol", "show", "hostnames", nodelist])
    names = out.stdout.split()
    if out.returncode != 0 or not names:
        raise SlurmJobError(f"`scontrol show hostnames {nodelist}` failed: {out.stderr.strip()}")
    return names


def rendezvous_host(first_node: str, suffix: str = "") -> str:
    """The name under which the other nodes reach the first one (JSC: ``jwb0001`` + ``i``)."""
    return first_node + suffix


def pick_port(first_node: str) -> int:
    """A port for the rendezvous on the first node that no concurrent run is likely to use.

    Drawn at random from :data:`PORT_RANGE` (two concurrent runs on one node collide with
    probability 1/12000); when the first node is this machine we also check it is free.
    """
    rng = random.SystemRandom()
    for _ in range(50):
        port = rng.randrange(*PORT_RANGE)
        if not _is_this_machine(first_node) or _free_here(port):
            return port
    raise SlurmJobError(f"found no free port in {PORT_RANGE} on this machine")


def _is_this_machine(node: str) -> bool:
    names = {socket.gethostname(), socket.gethostname().split(".")[0], os.environ.get("SLURMD_NODENAME")}
    return node in names


def _free_here(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def ranks_per_node(nprocs: int, nodes: int) -> int:
    """Spread ``nprocs`` ranks evenly over ``nodes`` nodes (torchrun starts the same number on each)."""
    if nprocs % nodes:
        raise ValueError(f"{nprocs} ranks cannot be spread evenly over {nodes} nodes; use a multiple "
                         f"of {nodes} (nodes come from the allocation, or `nodes` in distlab.toml)")
    return nprocs // nodes


def cpus_per_node(job_cpus_per_node: str) -> int | None:
    """The fewest CPUs any node of the allocation has: ``"36(x2),72"`` -> 36 (``SLURM_JOB_CPUS_PER_NODE``)."""
    counts = [int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", job_cpus_per_node or "")]
    return min(counts) if counts else None
