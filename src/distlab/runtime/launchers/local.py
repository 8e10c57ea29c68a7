"""The local launcher: torchrun on this machine.

A *job* is one launch of N ranks, with three methods that :func:`distlab.run` and
:class:`distlab.Pool` call: ``wait()`` (stream output; return the results or raise),
``wait_until_ready()`` (a pool's ranks are up) and ``stop()`` (end every process it started,
whatever happened). The waiting is the :class:`~distlab.runtime.watcher.Watcher`'s, the same
for every launcher; a launcher adds how the ranks start, how they stop, and how to explain
an early end. The Slurm launchers (:mod:`distlab.runtime.launchers.slurm`) are built the same way.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from distlab.runtime.errors import LaunchError, RankError
from distlab.runtime.launchers.agent import Agent
from distlab.runtime.launchers.torchrun import agent_environment, exit_code_from_log, torchrun_command
from distlab.runtime.watcher import Watcher, describe_exit, first_failure, tail


class LocalJob:
    """One torchrun and its workers, from start to cleanup.

    A plain job runs one call, whose files are in ``run_dir`` itself. A pool job
    (``pool=True``, used by :class:`distlab.Pool`) keeps its ranks for many calls, each in its
    own folder ``run_dir/call-<k>``; :meth:`wait` watches one call at a time.

    ``agent_command`` makes the agent's command line; :class:`~.forked.ForkedJob` swaps
    torchrun for an agent that forks its ranks, and keeps everything else.
    """

    agent_command = staticmethod(torchrun_command)
    spare_agents = False
    """Whether a spare agent (:mod:`~distlab.runtime.launchers.spares`) may stand in for a new process."""

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int | None,
                 pool: bool = False):
        self.run_dir, self.nprocs, self.timeout, self.pool = run_dir, nprocs, timeout, pool
        # Same machine: size threads from our cores (torchrun would otherwise set 1 and warn).
        threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
        self.agent = Agent(self.agent_command(nprocs, run_dir, pool), agent_environment(run_dir, backend, threads),
                           run_dir, spare=self.spare_agents, private=True, fds=self._agent_fds())
        self.watcher = Watcher(run_dir, nprocs, self.agent, self._explain_end, agent_pid=self.agent.pid,
                               ranks_here=True)

    def _agent_fds(self) -> list[int]:
        """Descriptors the agent must inherit (none for torchrun)."""
        return []

    def wait(self, call_dir: Path | None = None, timeout: float | None = None) -> list:
        """Watch one call (see :meth:`Watcher.wait`); return the results in rank order."""
        __tracebackhide__ = True  # noqa: F841
        return self.watcher.wait(self.timeout if timeout is None else timeout, call_dir)

    def wait_until_ready(self, timeout: float) -> None:
        self.watcher.wait_until_ready(timeout)

    def stop(self, gracefully: bool | None = None) -> None:
        """End torchrun and every process below it: politely after success, at once otherwise.

        ``gracefully`` defaults to whether the last call succeeded. Returns once every process
        the job started is gone (see :class:`~distlab.runtime.processes.ProcessTree`).
        """
        self.agent.end(self.watcher, self.watcher.succeeded if gracefully is None else gracefully, self.pool)

    def _explain_end(self, dead: list[int]) -> Exception:
        """A rank process vanished without a report, or torchrun itself stopped."""
        self.agent.wait(2.0)   # torchrun notices a dead worker within its monitor interval and logs its exit code
        watcher = self.watcher
        watcher.echo.pump()
        log = self.agent.output()
        if not watcher.workers:
            return LaunchError(f"torchrun exited with code {self.agent.returncode} before any rank "
                               f"started. Its output:\n{tail(log)}")
        codes = {rank: exit_code_from_log(log, rank) for rank in dead}
        # Ranks that torchrun (or we) stopped with SIGTERM/SIGKILL are victims, not culprits.
        culprits = [r for r in dead if codes[r] not in (-signal.SIGTERM, -signal.SIGKILL)]
        reports = watcher.reports()
        if not culprits and reports:
            return first_failure(reports)
        missing = watcher.missing()
        rank = (culprits or dead or missing or [0])[0]
        others = {r: "did not finish (stopped)" for r in missing if r != rank}
        return RankError(rank, "ProcessExited",
                         f"the process of rank {rank} {describe_exit(codes.get(rank))} before returning a "
                         "result or raising (os._exit? a crash? the out-of-memory killer?)", "", None, others)
