"""``launcher="srun"``: the ranks as a new job step of the allocation we are in.

What ``"auto"`` picks inside an allocation: a notebook server started by JupyterHub as a Slurm
job, a shell from ``salloc``, a batch script. ``srun`` runs here (so Ctrl-C and the notebook's
death reach it as they reach torchrun on a laptop); it starts one torchrun on each node of
the step, and those start the ranks. A step on one node starts them in a network of their own
(:mod:`distlab.runtime.private_network`): no other account on the node reaches their ports.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from distlab.runtime import private_network
from distlab.runtime import rundir as files
from distlab.runtime.launchers.agent import Agent
from distlab.runtime.launchers.slurm import commands, remote, script
from distlab.runtime.launchers.slurm import config as slurm_config
from distlab.runtime.launchers.torchrun import NO_LOG_FOLDER, WORKER, agent_environment
from distlab.runtime.watcher import Watcher


class SrunJob:
    """``srun`` + one torchrun per node, as a job step of the allocation we are in."""

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int | None,
                 pool: bool = False):
        self.config = slurm_config.load()
        self.nprocs, self.timeout, self.pool = nprocs, timeout, pool
        self.job_id = os.environ.get("SLURM_JOB_ID")
        if not self.job_id:
            raise ValueError("launcher='srun' needs a Slurm allocation (salloc, or a notebook started "
                             "as a Slurm job); from a login node use launcher='sbatch'")
        hosts = commands.node_names(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", ""))
        self.hosts = hosts[:min(len(hosts), nprocs)]  # 2 ranks in a 4-node allocation: 2 nodes
        self.nproc_per_node = commands.ranks_per_node(nprocs, len(self.hosts))
        first = self.hosts[0]
        # every rank on one node: there they start in a network of their own, where the rendezvous
        # is on its loopback (private_network); across nodes, on the first node's address
        self.private = len(self.hosts) == 1 and private_network.wanted()
        host = "127.0.0.1" if self.private else commands.rendezvous_host(first, self.config.hostname_suffix)
        self.endpoint = f"{host}:{commands.pick_port(first)}"
        self.cpus = commands.cpus_per_node(os.environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
        self.run_dir = self.shared_dir = remote.shared_run_dir(run_dir, self.config)
        self.step_name = f"distlab-{self.shared_dir.name}"
        self.agent = Agent(self.command(), agent_environment(self.shared_dir, backend, threads), self.shared_dir)
        # The ranks run on the allocation's nodes: only srun itself is a process of ours here.
        self.watcher = Watcher(self.shared_dir, nprocs, self.agent, self._explain_end,
                               agent_pid=self.agent.pid, poll_seconds=remote.POLL_SECONDS)

    def command(self) -> list[str]:
        """``srun [one task per node] bash -c 'exec python -m torch.distributed.run ...'``."""
        target = ["--max-restarts=0", "--monitor-interval=0.05", NO_LOG_FOLDER, "--module", WORKER, str(self.shared_dir)]
        python = self.config.python or sys.executable   # the notebook runs inside the allocation
        line = script.torchrun_on_each_node(python, str(len(self.hosts)), self.nproc_per_node, self.endpoint,
                                     self.step_name, target + (["--pool"] if self.pool else []),
                                     private_network_folder=str(self.shared_dir) if self.private else None)
        return script.srun_command(self.hosts, self.step_name, line, self.cpus)

    def wait(self, call_dir: Path | None = None, timeout: float | None = None) -> list:
        """Watch the call. A :class:`~distlab.Pool` writes each call into its own folder on this
        machine: the call moves to the shared directory first."""
        __tracebackhide__ = True  # noqa: F841
        if call_dir is not None and Path(call_dir).parent != self.shared_dir:
            call_dir = self._share_call(Path(call_dir))
        return self.watcher.wait(self.timeout if timeout is None else timeout, call_dir)

    def wait_until_ready(self, timeout: float) -> None:
        self.watcher.wait_until_ready(timeout)

    def _share_call(self, local: Path) -> Path:
        shared = self.shared_dir / local.name
        shared.mkdir()
        shutil.copy2(local / files.PAYLOAD, shared / files.PAYLOAD)
        # The options file tells the waiting ranks to go: it comes last, in one piece.
        files.write_atomically(shared / files.OPTIONS, (local / files.OPTIONS).read_bytes())
        return shared

    def _explain_end(self, dead: list[int]) -> Exception:
        """srun exited before every rank delivered: say why, from its output."""
        self.agent.wait(remote.END_GRACE_SECONDS)   # the last lines may still be on their way
        time.sleep(remote.END_GRACE_SECONDS if self.agent.returncode == 0 else 0.2)
        self.watcher.echo.pump()
        log = self.agent.output()
        state = remote.state_from_step_log(log)
        what = f"the srun step {self.step_name!r} of job {self.job_id}"
        if state is None:
            what += f" (srun exit code {self.agent.returncode})"
        return remote.explain_end(self.watcher, what, state, log, "srun's output", self.job_id)

    def stop(self, gracefully: bool | None = None) -> None:
        """Cancel our step in Slurm (the ranks on every node) unless it ended well, then end srun."""
        graceful = self.watcher.succeeded if gracefully is None else gracefully
        try:
            if not graceful:
                self._cancel_step()
            self.agent.end(self.watcher, graceful, self.pool)
        finally:
            remote.remove_run_dir(self.shared_dir, self.watcher.succeeded)

    def _cancel_step(self) -> None:
        try:
            out = commands.slurm_command(["squeue", "--steps", f"--jobs={self.job_id}", "--noheader",
                                 "--format=%i %j"], timeout=10)
        except commands.SlurmJobError:
            return  # srun's own end (below) still ends the step
        for line in out.stdout.splitlines():
            step_id, _, name = line.strip().partition(" ")
            if name == self.step_name:
                try:
                    commands.slurm_command(["scancel", "--quiet", step_id], timeout=10)
                except commands.SlurmJobError:
                    pass
