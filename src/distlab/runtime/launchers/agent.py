"""The agent: the one process on this machine that starts the ranks (torchrun here, srun in an allocation).

Both launchers that run a process here start it the same way, watch it the same way, and end
it the same way; only the command differs. The agent runs in a session of its own (Ctrl-C in a
terminal reaches us, not it: we clean up), dies with us, and adopts what its ranks leave behind
(:func:`distlab.runtime.processes.leash`). What it prints goes to ``agent.log`` in the run folder.
An agent whose ranks all run on this machine starts in a network of its own
(:mod:`distlab.runtime.private_network`): no other account here can reach their ports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from distlab.runtime import private_network, processes
from distlab.runtime import rundir as files
from distlab.runtime.launchers import spares

RELAY_FDS = "DISTLAB_RELAY_FDS"
"""The agent's environment variable naming the ranks' relay descriptors, rank 0 first."""


class Agent:
    """A launcher's agent process and its log."""

    def __init__(self, command: list[str], env: dict[str, str], run_dir: Path, spare: bool = False,
                 private: bool = False, fds=()):
        """``spare``: if this process keeps spare agents (:mod:`~distlab.runtime.launchers.spares`),
        one of them becomes this agent instead of a new process. ``private``: the agent starts in a
        network of its own (every rank on this machine; a spare is already where its keeper is).
        ``fds``: descriptors the agent inherits, their numbers in ``$DISTLAB_RELAY_FDS``
        (:data:`RELAY_FDS`): the ranks' ends of the relay."""
        self.run_dir = Path(run_dir)
        self.log = open(self.run_dir / files.AGENT_LOG, "wb")
        self.fds = list(fds)
        if self.fds:
            env = dict(env, **{RELAY_FDS: ",".join(map(str, self.fds))})
        self.process = (spares.take(command, env, os.getcwd(), self.run_dir / files.AGENT_LOG, self.fds, RELAY_FDS)
                        if spare else None)
        if self.process is None and private and private_network.wanted():
            hosts = private_network.hosts_file(str(self.run_dir))

            def start_in_private_network():
                processes.leash()
                private_network.enter(hosts)
            try:
                self.process = self._start(command, env, start_in_private_network)
            except subprocess.SubprocessError:
                # Linux let the namespaces be made but refused a step inside them (some
                # security modules restrict user namespaces that way): that child is gone
                # without running anything; start the agent in this network, and say so.
                sys.stderr.write("[distlab] note: this machine refused a private network for the ranks "
                                 "part-way; other accounts here can reach their ports\n")
        if self.process is None:
            self.process = self._start(command, env, processes.leash)
        self.pid = self.process.pid

    def _start(self, command: list[str], env: dict[str, str], preexec) -> subprocess.Popen:
        return subprocess.Popen(command, env=env, cwd=os.getcwd(), stdin=subprocess.DEVNULL, stdout=self.log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec,
                                pass_fds=self.fds)

    def poll(self) -> int | None:
        """``None`` while it runs (what the watcher asks of every agent)."""
        return self.process.poll()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for it to end; True if it has."""
        try:
            self.process.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    def output(self) -> str:
        """Everything it has printed so far."""
        return (self.run_dir / files.AGENT_LOG).read_text(errors="replace")

    def end(self, watcher, gracefully: bool, pool: bool) -> None:
        """End the agent and every process of the job; return once they are all gone.

        Gracefully (after a success), the ranks leave by themselves first: a pool's idle ranks
        when they see the ``stop`` file, a single run's ranks right after their call. Otherwise,
        or when they do not leave, everything is ended at once.
        """
        watcher.remember_processes()       # before the ranks and the agent leave
        if gracefully:
            if pool:
                files.write_stop(self.run_dir)
            self.wait(2.0)                 # torchrun follows its ranks within its monitor interval
        watcher.end()
        self.wait(5.0)
        self.log.close()
