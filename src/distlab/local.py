"""The local launcher: torchrun on this machine, and everything needed to watch and stop it.

A *job* is one launch of N ranks. It has two methods that :func:`distlab.run` calls:
``wait()`` (stream output; return the results or raise) and ``stop()`` (end every process
it started, whatever happened). The Slurm launchers (:mod:`distlab.slurm`) provide jobs
with the same two methods.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from distlab import processes, serialize
from distlab import rundir as files
from distlab.errors import DistTimeout, LaunchError, RankError
from distlab.output import OutputEcho

POLL_SECONDS = 0.01
START_TIMEOUT = float(os.environ.get("DISTLAB_START_TIMEOUT", 180))
"""Seconds the ranks may take to start and join the process group (importing torch on every
rank of a busy 2-core machine can take tens of seconds; a stuck rendezvous ends here)."""


def torchrun_command(nprocs: int, run_dir: Path, pool: bool = False) -> list[str]:
    """The local launcher: one torchrun with its own rendezvous on a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nprocs}", "--max-restarts=0", "--monitor-interval=0.05",
            "--module", "distlab.worker", str(run_dir)] + (["--pool"] if pool else [])


def worker_environment(backend: str | None, threads: int | None) -> dict[str, str]:
    """The environment variables every distlab worker needs, whichever launcher starts it.

    ``threads=None`` lets each rank size its own thread pool from the cores of the node it
    runs on (what a Slurm job needs: the login node's core count says nothing about it).
    """
    package_root = str(Path(__file__).resolve().parent.parent)
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


class LocalJob:
    """One torchrun and its workers, from start to cleanup.

    A plain job runs one call, whose files are in ``run_dir`` itself. A pool job
    (``pool=True``, used by :class:`distlab.Pool`) keeps its ranks for many calls, each in its
    own folder ``run_dir/call-<k>``; :meth:`wait` watches one call at a time.
    """

    poll_seconds = POLL_SECONDS  # how often the run directory is looked at (slower on shared filesystems)

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int | None,
                 pool: bool = False):
        self.run_dir, self.nprocs, self.timeout, self.pool = run_dir, nprocs, timeout, pool
        self.call_dir = run_dir
        self.started = time.monotonic()
        self.echo = OutputEcho(run_dir, nprocs)
        self.succeeded = False
        self.workers: dict[int, psutil.Process] = {}
        # Same machine: size threads from our cores (torchrun would otherwise set 1 and warn).
        threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
        env = dict(os.environ, **worker_environment(backend, threads))
        # torchrun's temporary files go into the run directory (deleted with it); the
        # worker gives the user's code its own TMPDIR back.
        env.update(TMPDIR=str(run_dir), DISTLAB_USER_TMPDIR=os.environ.get("TMPDIR", ""))
        self.agent_log = open(run_dir / files.AGENT_LOG, "wb")
        self.agent = subprocess.Popen(
            self.command(), env=env, cwd=os.getcwd(),
            stdin=subprocess.DEVNULL, stdout=self.agent_log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not torchrun: we clean up
            preexec_fn=processes.die_with_parent,
        )

    def command(self) -> list[str]:
        """The command that starts the ranks (the Slurm launchers wrap it in ``srun``)."""
        return torchrun_command(self.nprocs, self.run_dir, self.pool)

    # -- waiting --------------------------------------------------------------------------------

    def wait(self, call_dir: Path | None = None, timeout: float | None = None) -> list:
        """Watch one call until every rank delivered its result; return them in rank order.

        The ``timeout`` clock starts once every rank has joined the process group, so a slow
        start (all ranks importing torch on a busy machine) does not eat the function's time;
        starting itself may take up to ``START_TIMEOUT`` seconds. Without ``call_dir``: the
        job's single call. With it: one call of a pool, whose ranks are already up.
        """
        __tracebackhide__ = True  # noqa: F841
        timeout = self.timeout if timeout is None else timeout
        self.call_dir = call_dir or self.run_dir
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
            dead = self._dead_without_report()
            if dead or self.agent.poll() is not None:
                raise self._ended_early(dead)
            if time.monotonic() > deadline:
                raise DistTimeout(timeout, self._rank_states(), waiting_for)
            time.sleep(self.poll_seconds)

    def _note_workers(self) -> None:
        if len(self.workers) == self.nprocs:
            return
        for rank in range(self.nprocs):
            if rank not in self.workers:
                pid = files.read_pid(self.run_dir, rank)
                if pid is not None:
                    try:
                        self.workers[rank] = psutil.Process(pid)
                    except psutil.Error:
                        pass

    def _dead_without_report(self) -> list[int]:
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

    # -- explaining what went wrong ---------------------------------------------------------------

    def _reports(self) -> dict[int, dict]:
        reports = {}
        for rank in range(self.nprocs):
            path = files.error_file(self.call_dir, rank)
            if path.exists():
                reports[rank] = serialize.loads(path.read_bytes())
        return reports

    def _rank_error(self) -> Exception:
        # A rank that failed writes its report and then waits to be stopped, so its peers are
        # not disturbed. A short pause lets a second report, or a silent death, show up.
        time.sleep(0.2)
        self.echo.pump()
        self._note_workers()
        dead = self._dead_without_report()
        if dead:
            return self._ended_early(dead)
        return _first_failure(self._reports())

    def _ended_early(self, dead: list[int]) -> Exception:
        """A rank process vanished without a report, or torchrun itself stopped."""
        try:  # torchrun notices a dead worker within its monitor interval and logs its exit code
            self.agent.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        self.echo.pump()
        log = (self.run_dir / files.AGENT_LOG).read_text(errors="replace")
        if not self.workers:
            return LaunchError(f"torchrun exited with code {self.agent.returncode} before any rank "
                               f"started. Its output:\n{_tail(log)}")
        codes = {rank: _exit_code_from_torchrun_log(log, rank) for rank in dead}
        # Ranks that torchrun (or we) stopped with SIGTERM/SIGKILL are victims, not culprits.
        culprits = [r for r in dead if codes[r] not in (-signal.SIGTERM, -signal.SIGKILL)]
        reports = self._reports()
        if not culprits and reports:
            return _first_failure(reports)
        missing = [r for r in range(self.nprocs) if not files.result_file(self.call_dir, r).exists()]
        rank = (culprits or dead or missing or [0])[0]
        code = codes.get(rank)
        if code is None:
            how = "ended"
        elif code >= 0:
            how = f"exited with code {code}"
        else:
            how = f"was killed by signal {-code} ({_signal_name(-code)})"
        others = {r: "did not finish (stopped)" for r in missing if r != rank}
        return RankError(rank, "ProcessExited",
                         f"the process of rank {rank} {how} before returning a result or raising "
                         "(os._exit? a crash? the out-of-memory killer?)", "", None, others)

    def _rank_states(self) -> dict[int, str]:
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
            else:
                text = "in user code, not in a distributed call"
                if state.get("last"):
                    text += f" (last call: {state['last']}, {since:.1f} s ago)"
            if state.get("pending"):
                text += f"; async ops not finished: {', '.join(state['pending'])}"
            states[rank] = text
        return states

    # -- cleaning up ---------------------------------------------------------------------------

    def stop(self) -> None:
        """End torchrun and every worker: politely after success, at once otherwise."""
        if self.succeeded:
            if self.pool:  # idle pool ranks leave when they see this file
                files.write_atomically(self.run_dir / files.STOP, b"")
            try:  # the ranks are leaving by themselves; torchrun follows within its monitor interval
                self.agent.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        self._note_workers()
        procs = processes.snapshot([self.agent.pid] + [p.pid for p in self.workers.values()])
        procs += [p for p in self.workers.values() if p not in procs]
        processes.end_processes(procs, grace=0.5)
        try:
            self.agent.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.echo.pump(final=True)
        self.agent_log.close()


def _first_failure(reports: dict[int, dict]) -> RankError:
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


def _exit_code_from_torchrun_log(log: str, rank: int) -> int | None:
    """Read a rank's exit code from torchrun's failure summary (``rank : 1 ... exitcode : -9``)."""
    for found_rank, code in re.findall(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log, flags=re.M):
        if int(found_rank) == rank:
            return int(code)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])
