"""The fork launcher: ranks forked from one process that has already imported torch.

torchrun starts each rank as a new Python, and each imports torch again: about 2.7 s of CPU
per rank on this machine, plus torchrun's own import. Four ranks cost five imports, and a
grader that starts fresh ranks for every student's notebook pays that again and again. Here
one *agent* process imports torch, ``torch.distributed`` and the worker once, then forks the
ranks. A forked child starts with everything its parent had loaded (the pages are shared
until written), so a launch costs one import, whatever the number of ranks.

Everything else is as torchrun does it on one node with ``--max-restarts=0``, so the worker
(:mod:`distlab.runtime.worker`), the watcher and the error messages are the same:

* **Rendezvous.** The agent hosts the store (a ``TCPStore`` on a free port, as
  torchrun's agent does) and gives each rank torchrun --standalone's variables: ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE`` and the
  rest, so ``init_process_group()`` reads its usual ``env://`` settings. On the relay
  (``backend="relay"``, :mod:`distlab.relay`) there is no store: the agent inherits one end of
  the router per rank, each rank keeps its own and closes the others', and the agent keeps none.
* **Failure.** The first rank to exit with an error ends the others (SIGTERM, then SIGKILL
  after a grace period) and the agent exits with 1 after printing torchrun's failure lines
  (``rank : 1`` / ``exitcode : -9``), which :func:`~.torchrun.exit_code_from_log` reads.
* **Stopping.** SIGTERM or SIGINT to the agent is passed on to the ranks; a rank dies with
  the agent (the worker asks for it); the agent dies with whoever started it.

Why forking is safe here. The store's thread is started only *after* the forks (the ranks
wait on a pipe for its port), and the agent runs no tensor operation before forking, so no
lock or thread pool is copied half-taken. And the agent is a fresh ``python -m`` process
started exactly like torchrun: a rank inherits no memory that a torchrun rank would not have,
which matters where ranks run untrusted code (the grader's clean room,
:mod:`distlab.grade.boundary.cleanroom`). The clean room goes one step further: its agents are spares
it forked from itself before it read anything secret (:mod:`~distlab.runtime.launchers.spares`),
so not even the agent imports torch again.

Who uses it: the clean room, whose ranks are thrown away after each notebook, and anyone
who asks (``distlab.run(fn, launcher="fork")``). torchrun stays the default launcher: it is
what a cluster job runs, and what the book teaches.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from distlab.runtime.launchers.local import LocalJob

STOP_GRACE_S = 5.0
"""How long ranks get to leave after SIGTERM before SIGKILL (when one rank failed, or we are told to stop)."""

_PORT_RECORD = 8
"""Bytes of one port number on the pipe: every rank reads exactly one record (atomic below PIPE_BUF)."""


def forked_command(nprocs: int, run_dir: Path, pool: bool = False) -> list[str]:
    """The agent's command line (the counterpart of :func:`~.torchrun.torchrun_command`)."""
    return [sys.executable, "-m", __name__, str(nprocs), str(run_dir)] + (["--pool"] if pool else [])


class ForkedJob(LocalJob):
    """A :class:`~.local.LocalJob` whose agent forks its ranks instead of running torchrun.

    With ``backend="relay"`` the job also owns the run's :class:`~distlab.relay.router.Router`,
    in this process: the agent inherits one end of the router per rank and gives each rank its
    own (see :func:`_become_rank`); the router lives until the job stops.
    """

    agent_command = staticmethod(forked_command)
    spare_agents = True

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int | None,
                 pool: bool = False):
        self.router = None
        if backend == "relay":
            from distlab.relay.router import Router

            self.router = Router(nprocs)
        try:
            super().__init__(run_dir, nprocs, timeout, backend, threads, pool)
        except BaseException:
            self._stop_router()
            raise
        if self.router is not None:
            self.router.launched()      # the agent holds the ranks' ends now; ours would keep them open

    def _agent_fds(self) -> list[int]:
        return self.router.rank_fds() if self.router is not None else []

    def stop(self, gracefully: bool | None = None) -> None:
        try:
            super().stop(gracefully)
        finally:
            self._stop_router()

    def _stop_router(self) -> None:
        router, self.router = self.router, None
        if router is not None:
            router.stop()


# -- the agent ------------------------------------------------------------------------------------


def preload(pool: bool) -> None:
    """Import, once, what every rank would import for itself (and a pool's chapter packages)."""
    import datetime  # noqa: F401 - the worker's imports, in the order it makes them

    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import distlab.relay.backend  # noqa: F401
    import distlab.runtime.worker  # noqa: F401
    from distlab.runtime import devices, serialize  # noqa: F401
    from distlab.tools import comm  # noqa: F401

    if pool:
        from distlab.runtime import isolation

        isolation.preload()


def _rank_environment(rank: int, nprocs: int, port: int) -> dict[str, str]:
    """What torchrun tells each of its workers on a single node."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs), "ROLE_WORLD_SIZE": str(nprocs),
        "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "MASTER_ADDR": "localhost", "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "distlab-fork",
    }


def _relay_fds() -> list[int]:
    from distlab.runtime.launchers.agent import RELAY_FDS

    return [int(fd) for fd in os.environ.get(RELAY_FDS, "").split(",") if fd]


def _keep_own_relay_end(rank: int) -> None:
    """In rank ``rank``: keep its end of the router (``$DISTLAB_RELAY_FD``) and close every other
    rank's, so that no rank can read another's messages or write in its name."""
    from distlab.relay.backend import RELAY_FD
    from distlab.runtime.launchers.agent import RELAY_FDS

    fds = _relay_fds()
    os.environ.pop(RELAY_FDS, None)
    if not fds:
        return
    for other, fd in enumerate(fds):
        if other != rank:
            os.close(fd)
    os.environ[RELAY_FD] = str(fds[rank])


def _become_rank(rank: int, nprocs: int, port_pipe: int, run_dir: str, pool: bool) -> None:
    """In the forked child: wait for the store's port, then be rank ``rank``. Never returns."""
    from distlab.runtime import processes, worker

    try:
        _keep_own_relay_end(rank)
        processes.die_with_parent()
        processes.set_name(f"distlab-rank{rank}")   # its command line is the agent's
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        record = os.read(port_pipe, _PORT_RECORD)
        os.close(port_pipe)
        if len(record) != _PORT_RECORD:   # the agent died before it had a store
            os._exit(1)
        os.environ.update(_rank_environment(rank, nprocs, int(record)))
        sys.argv = [worker.__file__, run_dir] + (["--pool"] if pool else [])
        worker.main()                     # leaves with os._exit
    except BaseException:                 # noqa: BLE001 - a child must never return into the agent
        import traceback

        traceback.print_exc()
    os._exit(1)


class _Stop(Exception):
    """SIGTERM or SIGINT reached the agent."""


def _raise_stop(signum, frame):
    raise _Stop(signum)


def _end_ranks(ranks: dict[int, int]) -> dict[int, int]:
    """SIGTERM every rank still running, SIGKILL those still there after the grace period; reap
    them. Returns ``{rank: exit code}`` of each (negative: the signal that ended it)."""
    for sig in (signal.SIGTERM, signal.SIGINT):   # a second request to stop must not cut this short
        signal.signal(sig, signal.SIG_IGN)
    for pid in ranks:
        _signal(pid, signal.SIGTERM)
    codes = {}
    deadline = time.monotonic() + STOP_GRACE_S
    while ranks and time.monotonic() < deadline:
        for pid in list(ranks):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                codes[ranks.pop(pid)] = os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    for pid in ranks:
        _signal(pid, signal.SIGKILL)
        codes[ranks[pid]] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ranks.clear()
    return codes


def _report_failures(codes: dict[int, int], pids: dict[int, int]) -> None:
    """torchrun's failure summary, one entry per rank that did not exit with 0: the first one to
    fail, and also any that failed on their own at the same moment (a wall-time cap reached by
    every rank at once) or that we ended (SIGTERM, SIGKILL: victims, not culprits)."""
    for rank in sorted(r for r, code in codes.items() if code != 0):
        print(f"  rank      : {rank} (local_rank: {rank})\n"
              f"  exitcode  : {codes[rank]} (pid: {pids[rank]})", flush=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    """``python -m distlab.runtime.launchers.forked NPROCS RUN_DIR [--pool]``: returns the exit code."""
    nprocs, run_dir, pool = int(argv[0]), argv[1], "--pool" in argv[2:]
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    preload(pool)
    reader, writer = os.pipe()
    ranks: dict[int, int] = {}            # pid -> rank
    try:
        for rank in range(nprocs):
            pid = os.fork()
            if pid == 0:
                os.close(writer)
                _become_rank(rank, nprocs, reader, run_dir, pool)
            ranks[pid] = rank
        os.close(reader)
        for fd in _relay_fds():           # each rank has its own end now; the agent keeps none
            os.close(fd)
        port = 0
        if not _relay_fds():              # on the relay the ranks share no store: they are given none
            from torch.distributed import TCPStore

            store = TCPStore("localhost", 0, None, True, wait_for_workers=False)   # noqa: F841 - kept alive
            port = store.port
        os.write(writer, f"{port:0{_PORT_RECORD}d}".encode() * nprocs)
        os.close(writer)
        while ranks:
            pid, status = os.waitpid(-1, 0)   # also reaps what a rank left to us
            if pid not in ranks:
                continue
            rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
            if code != 0:
                print(f"[distlab fork launcher] rank {rank} failed; ending the others", flush=True)
                pids = {r: p for p, r in ranks.items()} | {rank: pid}
                _report_failures({rank: code} | _end_ranks(ranks), pids)
                return 1
        return 0
    except _Stop:
        _end_ranks(ranks)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
