"""Spare agents: fork-launcher agents made in advance, with torch already imported.

Every :class:`~distlab.runtime.launchers.forked.ForkedJob` starts its agent as a new Python,
which imports torch before it forks the ranks: about 1.5 s of CPU, paid again for every pool
the grader's clean room starts (two or three per notebook, more after a wrong answer ends
one). A process that has already imported torch can instead *fork* agents, which then cost
nothing to start. But a forked child starts with a copy of its parent's memory, and the clean
room's memory holds what the ranks must never see (the hidden tests, the verdict's pipe). So
the clean room forks its spares first thing, before it reads its job, when its memory holds
nothing but imported modules; each spare waits on a socket pair until a job needs an agent, then
becomes exactly what the agent's command, ``python -m distlab.runtime.launchers.forked ...``,
would be:

* its descriptors are 0, 1 and 2 only (standard input is ``/dev/null``, the others the agent's
  log), so nothing the parent opens later (the job, the verdict's pipe) reaches it, except
  the descriptors the job itself hands over (``SCM_RIGHTS``: the relay's ends, :mod:`distlab.relay`);
* its environment, folder and command are the ones the job gives it, its output unbuffered
  (``PYTHONUNBUFFERED``, which a new Python would have read at start);
* it is dumpable again (a new program would be; the clean room is not), in a session of its
  own, dies with its parent and adopts its orphans (:func:`~distlab.runtime.processes.leash`);
* it runs the command's module as ``python -m`` does (:func:`runpy.run_module`, a new
  ``__main__``), with the command's arguments.

Two things a fork cannot change. Its command line stays its parent's (``ps`` shows the clean
room's), so it names itself ``distlab-agent`` (``ps -o comm``; its ranks are
``distlab-rank<k>``). And ``/proc/<pid>/environ`` keeps showing the environment the parent
started with, without the run's tag (:data:`~distlab.runtime.processes.TAG_VARIABLE`, which
:func:`~distlab.runtime.processes.tagged` looks for); the programs its ranks start do carry
it, and the clean room, a subreaper, ends everything below it when a notebook is done.

A spare is a child of the process that made it, so that process waits for it and reads its
exit status as it would a ``subprocess.Popen``'s (:class:`SpareProcess`). When no spare is
left, an agent starts the usual way. Unused spares end with their parent (they die with it,
and the clean room kills everything below it when it is done). This module knows nothing of
the fork launcher: the launcher asks for a spare (``ForkedJob.spare_agents``), and whoever
keeps spares imports first what the agents import (:func:`~.forked.preload`).
"""

from __future__ import annotations

import io
import json
import os
import runpy
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from distlab.runtime import processes

_spares: list[tuple[int, int]] = []   # (pid, our end of its socket pair), oldest first


def keep(count: int) -> int:
    """Fork ``count`` spare agents now; return how many were made.

    Call it before this process holds anything its ranks must not read, after importing what
    the agents will import (then the spares share it instead of each importing it). It makes
    none if this process runs a Python thread besides the main one (a fork copies a lock
    another thread may hold). The idle threads of the BLAS library's pool, which importing
    numpy starts, are no obstacle: the library resets its pool in a forked child, as it does
    for every fork launcher agent.
    """
    if threading.active_count() > 1:
        return 0
    made = 0
    for _ in range(count):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)   # can carry descriptors
        pid = os.fork()
        if pid == 0:
            reader = theirs.detach()
            ours.close()
            _serve(reader)                 # never returns
        theirs.close()
        writer = ours.detach()
        os.set_inheritable(writer, False)
        _spares.append((pid, writer))
        made += 1
    return made


def available() -> int:
    return len(_spares)


def take(command: list[str], env: dict[str, str], cwd: str, log: Path, fds=(),
         fds_variable: str = "") -> SpareProcess | None:
    """Hand the oldest spare an agent's ``command`` (``[sys.executable, "-m", module, ARGS...]``);
    None if the command is not of that form, or no spare is left (or it died meanwhile): then
    start the agent the usual way.

    ``fds``: descriptors the agent must have (what ``pass_fds`` gives a new process); they travel
    with the job (``SCM_RIGHTS``), and the agent finds their numbers, comma-separated, in its
    environment variable ``fds_variable``."""
    if command[:2] != [sys.executable, "-m"] or len(command) < 3:
        return None
    while _spares:
        pid, writer = _spares.pop(0)
        job = json.dumps({"module": command[2], "argv": command[3:], "env": env, "cwd": cwd,
                          "log": str(log), "fds_variable": fds_variable}).encode()
        channel = socket.socket(fileno=writer)
        try:                               # the descriptors ride on the first byte, then the job, then EOF
            socket.send_fds(channel, [job[:1]], list(fds))
            channel.sendall(job[1:])
        except OSError:                    # it is gone (killed with everything below us, say)
            continue
        finally:
            channel.close()
        return SpareProcess(pid, command)
    return None


class SpareProcess:
    """A spare turned agent, seen the way :class:`~distlab.runtime.launchers.agent.Agent` sees a
    ``subprocess.Popen``: ``pid``, ``poll()``, ``wait(timeout)`` and ``returncode``."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:      # reaped by a sweep of everything below us: it has ended
                self.returncode = -9
                return self.returncode
            if done == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


def _serve(reader: int) -> None:
    """In the spare: wait for a job, become its agent, exit with the agent's exit code."""
    code = 1
    try:
        parent = os.getppid()
        processes.die_with_parent()
        if os.getppid() != parent:         # the parent died before we could ask to die with it
            os._exit(1)
        nothing = os.open(os.devnull, os.O_RDONLY)
        if nothing != 0:
            os.dup2(nothing, 0)
            os.close(nothing)
        os.closerange(3, reader)
        os.closerange(reader + 1, _max_fd())
        channel = socket.socket(fileno=reader)
        job, fds, _, _ = socket.recv_fds(channel, 1, 256)
        while chunk := channel.recv(1 << 16):
            job += chunk
        if not job:                        # the parent went away without a job for us
            os._exit(0)
        job = json.loads(job)
        if job.get("fds_variable"):
            job["env"][job["fds_variable"]] = ",".join(map(str, fds))
        os.setsid()
        processes.set_name("distlab-agent")
        processes.become_subreaper()
        processes.set_dumpable(True)     # as after an exec
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        log = os.open(job["log"], os.O_WRONLY | os.O_APPEND)
        for fd in (1, 2):
            os.dup2(log, fd)
        os.close(log)
        channel.close()
        sys.stdout, sys.stderr = _unbuffered(1), _unbuffered(2)
        sys.argv = [sys.executable, *job["argv"]]   # runpy puts the module's file first
        try:
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as leaving:
            code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    except BaseException:                  # noqa: BLE001 - a spare must never return into its parent
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _unbuffered(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                            write_through=True)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1024
