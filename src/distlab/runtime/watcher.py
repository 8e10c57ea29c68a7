"""Watching N ranks through their run directory until they deliver, fail, die or run out of time.

Every launcher (torchrun here, ``srun`` in an allocation, ``sbatch`` from a login node) starts
ranks differently, but once they run, they all talk to us the same way: through files in the
run directory (:mod:`distlab.runtime.rundir`). So one loop watches them all. Every few
milliseconds :meth:`Watcher.wait` looks at, in order:

1. what the ranks printed: echoed into the notebook, ``[rank k]`` in front (:mod:`.output`);
2. error reports: a rank raised, so the earliest report becomes a :class:`RankError`;
3. results: every rank delivered one, so they are returned in rank order;
4. deaths: a rank process vanished without a report, or the launcher's *agent* (torchrun,
   srun, or the batch job as Slurm sees it) ended: the launcher says why (``explain_end``);
5. the clock: past the timeout, a :class:`DistTimeout` says what each rank was doing, read
   from the state file each rank keeps up to date.

The timeout's clock starts once every rank has joined the process group: starting the ranks
(torch imported on every rank of a busy machine) has its own limit, ``START_TIMEOUT``.

Where the ranks run on this machine, the watcher also knows their process ids, and keeps a
:class:`~distlab.runtime.processes.ProcessTree` of everything below the agent: :meth:`end`
returns only once all of it is gone. Where they run on other nodes (Slurm), process ids mean
nothing here, and the files and Slurm's word are all there is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from distlab.runtime import rundir as files
from distlab.runtime import serialize
from distlab.runtime.errors import DistTimeout, RankError
from distlab.runtime.output import OutputEcho
from distlab.runtime.processes import ProcessTree

START_TIMEOUT = float(os.environ.get("DISTLAB_START_TIMEOUT", 180))
"""Seconds the ranks may take to start and join the process group (importing torch on every
rank of a busy 2-core machine can take tens of seconds; a stuck rendezvous ends here)."""


class Watcher:
    """The ranks of one job, seen through ``run_dir``.

    Args:
        run_dir: the job's run directory (pids, states and output live at its top; a plain
            run's call files too, a pool's in ``call-<k>`` folders).
        nprocs: number of ranks.
        agent: what started the ranks; only ``poll()`` is asked of it (``None`` while it
            runs), like :class:`subprocess.Popen`.
        explain_end: ``explain_end(dead_ranks) -> Exception``, called when the agent ended, or
            ranks died, before every result arrived: the launcher knows best why.
        agent_pid: the agent's process id when it is a process of this machine (torchrun,
            srun): :meth:`end` then ends everything below it, and every process tagged with
            the run's folder (see :mod:`distlab.runtime.processes`), and waits until it is gone.
        ranks_here: whether the ranks run on this machine: then their deaths are noticed by
            process id, at once. (On other nodes their pids would name unrelated processes.)
        poll_seconds: how often to look (slower on a shared filesystem).
    """

    def __init__(self, run_dir: Path, nprocs: int, agent, explain_end, agent_pid: int | None = None,
                 ranks_here: bool = False, poll_seconds: float = 0.01):
        self.run_dir, self.nprocs, self.agent = Path(run_dir), nprocs, agent
        self.call_dir = self.run_dir
        self.explain_end, self.poll_seconds = explain_end, poll_seconds
        self.echo = OutputEcho(self.run_dir, nprocs)
        self.workers: dict[int, psutil.Process] = {}
        self.ranks_here = ranks_here
        self.tree = ProcessTree([agent_pid], tag=str(self.run_dir)) if agent_pid is not None else None
        self.started = time.monotonic()
        self.succeeded = False

    # -- waiting ----------------------------------------------------------------------------------

    def wait(self, timeout: float, call_dir: Path | None = None) -> list:
        """Watch one call until every rank delivered its result; return them in rank order.

        Without ``call_dir``: the job's single call, whose ranks may still be starting. With
        it: one call of a pool, whose ranks are already up.
        """
        __tracebackhide__ = True  # noqa: F841
        self.call_dir = Path(call_dir) if call_dir is not None else self.run_dir
        self.succeeded = False
        results = [files.result_file(self.call_dir, r) for r in range(self.nprocs)]
        if call_dir is None:
            self._watch(self._all_started, self.started + START_TIMEOUT, START_TIMEOUT, "start")
        self._watch(lambda: all(path.exists() for path in results), time.monotonic() + timeout, timeout)
        self.succeeded = True
        return [serialize.loads(path.read_bytes()) for path in results]

    def wait_until_ready(self, timeout: float) -> None:
        """For a pool: wait until every rank has joined the process group and waits for calls."""
        def ready():
            return all((files.read_state(self.run_dir, r) or {}).get("phase") == "ready"
                       for r in range(self.nprocs))
        self._watch(ready, self.started + timeout, timeout, "start")

    def restart_clock(self) -> None:
        """The ranks start now (a batch job: not when it was submitted, but when Slurm ran it)."""
        self.started = time.monotonic()

    def _all_started(self) -> bool:
        """Has every rank joined the process group (and so begun, or finished, the call)?"""
        for rank in range(self.nprocs):
            state = files.read_state(self.run_dir, rank)
            if state is None or state.get("phase") == "starting":
                return False
        return True

    def _watch(self, done, deadline: float, timeout: float, waiting_for: str = "finish") -> None:
        __tracebackhide__ = True  # noqa: F841
        errors = [files.error_file(self.call_dir, r) for r in range(self.nprocs)]
        while True:
            self.echo.pump()
            self._note_workers()
            if any(path.exists() for path in errors):
                raise self._rank_error()
            if done():
                return
            dead = self.dead_without_report()
            if dead or self.agent.poll() is not None:
                self.remember_processes()     # before the agent is gone: what the dead left is below it
                raise self.explain_end(dead)
            if time.monotonic() > deadline:
                raise DistTimeout(timeout, self.rank_states(), waiting_for)
            time.sleep(self.poll_seconds)

    # -- the ranks' processes (ranks on this machine only) ----------------------------------------------------

    def _note_workers(self) -> None:
        if not self.ranks_here or len(self.workers) == self.nprocs:
            return
        for rank in range(self.nprocs):
            if rank not in self.workers:
                pid = files.read_pid(self.run_dir, rank)
                if pid is not None:
                    try:
                        self.workers[rank] = psutil.Process(pid)
                    except psutil.Error:
                        pass

    def dead_without_report(self) -> list[int]:
        """Ranks whose process is gone although they wrote neither a result nor an error."""
        dead = []
        for rank, proc in self.workers.items():
            try:
                gone = not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone and not files.result_file(self.call_dir, rank).exists() \
                    and not files.error_file(self.call_dir, rank).exists():
                dead.append(rank)
        return dead

    def remember_processes(self) -> None:
        """Note every local process of the job now: call it before anything of the job may end
        (what a process started is re-parented when it dies, and may leave the tree with it)."""
        if self.tree is not None:
            self.tree.remember()

    # -- explaining what went wrong -------------------------------------------------------------------

    def reports(self) -> dict[int, dict]:
        """``{rank: error report}`` of the ranks that raised in the current call."""
        reports = {}
        for rank in range(self.nprocs):
            path = files.error_file(self.call_dir, rank)
            if path.exists():
                reports[rank] = serialize.loads(path.read_bytes())
        return reports

    def ranks_can_go_on(self, grace: float = 1.0) -> bool:
        """After a :class:`RankError` in a pool: did every rank finish the call, by returning or
        by failing cleanly (its report says it serves on, see ``worker._failed_cleanly``)?

        Then the ranks are as fit for the next call as after a success. A rank still in the
        call (perhaps blocked in a collective its failed peer never joined), dead, or failed
        inside a distributed call makes the answer no. Ranks that are still finishing get
        ``grace`` seconds (on a busy machine the last of four ranks raises a little later).
        """
        deadline = time.monotonic() + grace
        while True:
            reports = self.reports()
            if any(not report.get("serving_on") for report in reports.values()) or self.dead_without_report():
                return False
            if all(r in reports or files.result_file(self.call_dir, r).exists() for r in range(self.nprocs)):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def missing(self) -> list[int]:
        """Ranks that have not delivered a result for the current call."""
        return [r for r in range(self.nprocs) if not files.result_file(self.call_dir, r).exists()]

    def _rank_error(self) -> Exception:
        # A rank that failed writes its report and then waits to be stopped, so its peers are
        # not disturbed. A short pause lets a second report, or a silent death, show up.
        time.sleep(0.2)
        self.echo.pump()
        self._note_workers()
        dead = self.dead_without_report()
        if dead:
            self.remember_processes()
            return self.explain_end(dead)
        return first_failure(self.reports())

    def rank_states(self) -> dict[int, str]:
        """``{rank: what it is doing}``, in words, from the state files (for a DistTimeout)."""
        now = time.time()
        states = {}
        for rank in range(self.nprocs):
            state = files.read_state(self.run_dir, rank)
            if state is None:
                states[rank] = "not started yet (importing torch or waiting for the rendezvous)"
                continue
            since = now - state.get("since", now)
            phase = state.get("phase")
            if phase == "starting":
                text = f"joining the process group (init_process_group) for {since:.1f} s"
            elif phase == "call":
                text = f"blocked in {state['call']} for {since:.1f} s"
            elif phase == "returned":
                text = "returned (waiting for the other ranks)"
            elif phase == "raised":
                text = "raised an exception (reported; waiting for the next call)"
            else:
                text = "in user code, not in a distributed call"
                if state.get("last"):
                    text += f" (last call: {state['last']}, {since:.1f} s ago)"
            if state.get("pending"):
                text += f"; async ops not finished: {', '.join(state['pending'])}"
            states[rank] = text
        return states

    # -- the end -------------------------------------------------------------------------------------

    def end(self, grace: float = 0.5) -> None:
        """End every local process of the job and wait until all are gone; echo the last output."""
        if self.tree is not None:
            self.tree.seen.update({p.pid: p for p in self.workers.values()})
            self.tree.end(grace)
        self.echo.pump(final=True)


def first_failure(reports: dict[int, dict]) -> RankError:
    """The RankError for the earliest report; later ones are listed as probable consequences."""
    first = min(reports.values(), key=lambda r: r["time"])
    others = {r: f"{rep['type']}: {(rep['message'].splitlines() or [''])[0]}"
              for r, rep in reports.items() if r != first["rank"]}
    exc = None
    if first.get("exception") is not None:
        try:
            exc = serialize.loads(first["exception"])
        except Exception:  # e.g. an exception class the notebook cannot import
            exc = None
    return RankError(first["rank"], first["type"], first["message"], first["traceback"], exc, others)


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: ``exited with code 1``, ``was killed by signal 9 (SIGKILL)``."""
    import signal

    if code is None:
        return "ended"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "unknown signal"
    return f"was killed by signal {-code} ({name})"


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])
