"""``launcher="sbatch"``: the ranks as a batch job, from a login node or a server outside any allocation.

:class:`SbatchJob` writes a job script (:func:`~distlab.runtime.launchers.slurm.script.job_script`),
submits it, reports the job's state while it waits in the queue (pending, running, done), and
streams the ranks' output once they run. Nothing runs on this machine but us: the "agent" the
:class:`~distlab.runtime.watcher.Watcher` polls is a :class:`QueuedJob`, Slurm's view of the job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from distlab.runtime.launchers.slurm import commands, remote, script
from distlab.runtime.launchers.slurm import config as slurm_config
from distlab.runtime.launchers.torchrun import NO_LOG_FOLDER, WORKER, worker_environment
from distlab.runtime.watcher import Watcher


class QueuedJob:
    """A submitted batch job, seen through ``scontrol show job``.

    It answers ``poll()`` like a :class:`subprocess.Popen` does (None while the job is queued
    or running), so the :class:`~distlab.runtime.watcher.Watcher` can watch it as it watches torchrun, and it
    reports every change of state (PENDING, RUNNING, COMPLETED, ...) as it sees it. The
    controller is asked at most every ``poll_seconds``.
    """

    def __init__(self, job_id: str, poll_seconds: float, on_change=None):
        self.job_id, self.poll_seconds, self.on_change = job_id, poll_seconds, on_change
        self.state, self.reason, self.nodes, self.exit_code = "PENDING", "", "", None
        self.time_limit = ""
        self.asked = float("-inf")
        self.ended_at: float | None = None

    @property
    def active(self) -> bool:
        return self.state in commands.ACTIVE_STATES

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.asked < self.poll_seconds:
            return
        self.asked = now
        try:
            out = commands.slurm_command(["scontrol", "--oneliner", "show", "job", self.job_id], timeout=15)
        except commands.SlurmJobError:
            return  # the controller is busy or down: keep the last state, ask again later
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:  # finished long ago and forgotten by the controller
                self._update("GONE", "no longer known to the controller", self.nodes, None)
            return
        fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
        code = fields.get("ExitCode", "")
        self.time_limit = fields.get("TimeLimit", self.time_limit)
        self._update(fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                     fields.get("NodeList", ""), int(code.split(":")[0]) if code[:1].isdigit() else None)

    def _update(self, state, reason, nodes, exit_code) -> None:
        changed = state != self.state or (state == "PENDING" and reason != self.reason)
        self.state, self.reason, self.nodes, self.exit_code = state, reason, nodes, exit_code
        if not self.active and self.ended_at is None:
            self.ended_at = time.monotonic()
        if changed and self.on_change:
            self.on_change(self)

    def describe(self) -> str:
        if self.state == "PENDING":
            return f"PENDING ({self.reason})" if self.reason and self.reason != "None" else "PENDING"
        if self.state == "RUNNING":
            return f"RUNNING on {self.nodes}"
        return self.state

    # -- what the watcher asks of its "agent" ---------------------------------------------

    def poll(self) -> int | None:
        """None while the job is queued or running (or ended less than a moment ago)."""
        self.refresh()
        if self.active or time.monotonic() - self.ended_at < remote.END_GRACE_SECONDS:
            return None
        return self.returncode

    @property
    def returncode(self) -> int | None:
        if self.active:
            return None
        return self.exit_code if self.exit_code is not None else 1


class SbatchJob:
    """A batch job: write a job script, ``sbatch`` it, watch it, collect the results.

    The run's ``timeout`` does not include the wait in the queue, which has its own limit,
    ``queue_timeout`` (distlab.toml).
    """

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int | None,
                 pool: bool = False):
        if pool:
            raise ValueError("a Pool keeps its ranks between calls; it needs an allocation "
                             "(salloc, or a notebook started as a Slurm job), not a batch job")
        self.config = slurm_config.load()
        self.nprocs, self.timeout = nprocs, timeout
        self.nodes = self.config.nodes
        self.nproc_per_node = commands.ranks_per_node(nprocs, self.nodes)
        self.run_dir = self.shared_dir = remote.shared_run_dir(run_dir, self.config)
        self.job_id = None
        self.output = self.shared_dir / "slurm-job.out"
        self.script = self.shared_dir / "job.sbatch"
        self.script.write_text(self._job_script(timeout, backend, threads))
        self.job_id = self._submit()
        self.agent = QueuedJob(self.job_id, self.config.poll_seconds,
                               on_change=lambda job: remote.show(f"job {job.job_id}: {job.describe()}"))
        self.watcher = Watcher(self.shared_dir, nprocs, self.agent, self._explain_end, poll_seconds=remote.POLL_SECONDS)

    def _job_script(self, timeout: float, backend, threads: int | None) -> str:
        exports = worker_environment(backend, threads)  # the same variables the local ranks get
        return script.job_script(self.config, nodes=self.nodes, nproc_per_node=self.nproc_per_node,
                          target=["--module", WORKER, str(self.shared_dir)],
                          job_name="distlab", time_limit=self.config.time or script.minutes_for(timeout),
                          output=str(self.output), exports=exports,
                          torchrun_extra=["--monitor-interval=0.5", NO_LOG_FOLDER])

    def _submit(self) -> str:
        try:
            out = commands.slurm_command(["sbatch", "--parsable", str(self.script)])
        except commands.SlurmJobError:
            remote.remove_run_dir(self.shared_dir, succeeded=True)  # nothing ran: nothing to look at
            raise
        if out.returncode != 0:
            remote.remove_run_dir(self.shared_dir, succeeded=True)
            raise commands.SlurmJobError(f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}\n"
                                f"(settings from distlab.toml / DISTLAB_SLURM_*: account={self.config.account!r}, "
                                f"partition={self.config.partition!r}, nodes={self.nodes}; "
                                "`distlab-slurm config` shows where each comes from)")
        job_id = out.stdout.strip().split(";")[0]  # "12" or "12;cluster"
        remote.show(f"job {job_id} submitted: {self.nodes} node(s) x {self.nproc_per_node} rank(s); "
             f"output in {self.shared_dir}")
        return job_id

    def wait(self, call_dir: Path | None = None, timeout: float | None = None) -> list:
        __tracebackhide__ = True  # noqa: F841
        self._wait_until_running()
        self.watcher.restart_clock()  # the ranks start now, not when we submitted
        return self.watcher.wait(self.timeout if timeout is None else timeout, call_dir)

    def _wait_until_running(self) -> None:
        limit = self.config.queue_timeout
        queued = time.monotonic()
        self.agent.refresh(force=True)
        while self.agent.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD"):
            if limit and time.monotonic() - queued > limit:
                raise commands.SlurmJobError(
                    f"job {self.job_id} waited {limit:g} s in the queue ({self.agent.describe()}) and "
                    "was cancelled. Raise `queue_timeout` in distlab.toml, or pick a less busy "
                    "partition (`sinfo` shows them).", self.job_id, "PENDING")
            time.sleep(min(self.config.poll_seconds, 0.2))
            self.agent.refresh()

    def _explain_end(self, dead: list[int]) -> Exception:
        self.watcher.echo.pump()
        log = self.output.read_text(errors="replace") if self.output.exists() else ""
        what = f"Slurm job {self.job_id}"
        if self.agent.state not in commands.WHY_IT_ENDED:
            what += f" (state {self.agent.state}, exit code {self.agent.exit_code})"
        return remote.explain_end(self.watcher, what, self.agent.state, log, f"the job's output {self.output}", self.job_id)

    def stop(self, gracefully: bool | None = None) -> None:
        """Cancel the job unless it is already over; show how it ended."""
        try:
            if self.job_id is not None:
                self._end_job(self.watcher.succeeded if gracefully is None else gracefully)
            self.watcher.end()
        finally:
            remote.remove_run_dir(self.shared_dir, self.watcher.succeeded)

    def _end_job(self, graceful: bool, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        if graceful:  # the ranks are leaving by themselves: give the job a moment
            while self.agent.active and time.monotonic() < deadline - seconds / 2:
                time.sleep(0.2)
                self.agent.refresh(force=True)
        if self.agent.active:
            try:
                commands.slurm_command(["scancel", "--quiet", self.job_id], timeout=15)
            except commands.SlurmJobError as exc:
                remote.show(f"could not cancel job {self.job_id}: {exc}; run `scancel {self.job_id}`")
                return
            while self.agent.active and time.monotonic() < deadline:
                time.sleep(0.2)
                self.agent.refresh(force=True)
