"""A sandbox ends with the grader that started it, however the grader ends: its keeper.

The grading kernel and the clean room each run in a sandbox (:mod:`distlab.grade.boundary.bubblewrap`)
that nbgrader starts. ``bwrap --die-with-parent`` asks Linux for a *parent-death signal*
(``prctl(PR_SET_PDEATHSIG)``), but only once it has made its namespaces: a grader that dies
while the sandbox is still starting (the shell that joins the control group, the capped
folders' launcher, bwrap's own setup: a second or more on a busy machine) leaves a sandbox that
never learns of it. Such a sandbox was found an hour later, re-parented to init, in a session of
its own (jupyter_client starts every kernel in one, so no signal to the grader's process group
reaches it), its kernel still waiting for a cell. A parent-death signal has other gaps too: it
is cleared when a process changes its user or gains capabilities, and it follows the *thread*
that started the process, not the process.

So the sandbox's command starts with a keeper, ``python -m distlab.grade.boundary.sandbox_keeper
FD -- COMMAND...``, and the grader holds it by a pipe (:class:`Leash`): the keeper holds the
read end, FD, and only the grader holds the write end. When the grader ends, by SIGKILL
included, Linux closes its end and the keeper reads end-of-file; no signal and no handler is
involved. The keeper

* dies with the grader until it is running (a parent-death signal set when the grader forks
  it, before anything else happens: :meth:`Leash.popen_options`), then takes over from it;
* is a *child subreaper*: whatever the sandbox leaves when one of its processes dies (bwrap's
  first process inside, half set up) comes back to the keeper, not to init;
* runs COMMAND as its child, which dies with it, and waits for whichever comes first: the
  pipe's end-of-file (the grader is gone, or done with the sandbox), the end of COMMAND, or
  SIGTERM, SIGINT or SIGHUP; then it kills everything still below it, waits until it is
  gone, and ends as COMMAND ended (its exit code, or by its signal), or by the signal it got.

The keeper runs outside the sandbox, as the grader's user; the sandbox's processes, in process
ids of their own, cannot see it or signal it.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys
import time

from distlab.runtime import processes

END_BOUND_SECONDS = 10.0
"""The longest the keeper waits for the sandbox's processes to be gone once it killed them."""


def wrap(argv: list[str], fd: int) -> list[str]:
    """``argv`` started by a keeper that holds the grader's end of a :class:`Leash` as ``fd``."""
    return [sys.executable, "-m", __name__, str(fd), "--", *argv]


class Leash:
    """The grader's side: a pipe whose read end a keeper gets (:meth:`popen_options`); closing
    the write end (:meth:`close`, or the grader's death) ends the sandbox."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()   # neither inherited unless passed
        self.grader = os.getpid()

    def popen_options(self) -> dict:
        """What ``subprocess.Popen`` needs to start a keeper: the read end, passed on, and a
        parent-death signal from the fork on (the keeper dies with the grader until it runs)."""
        grader = self.grader
        processes.libc()   # loaded before the fork, not in the child

        def die_with_grader():
            processes.die_with_parent()
            if os.getppid() != grader:   # the grader ended before we could ask
                os._exit(1)

        return {"pass_fds": (self.read_fd,), "preexec_fn": die_with_grader}

    def started(self) -> None:
        """The keeper has its read end: the grader's copy goes (only the keeper's stays open)."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def close(self) -> None:
        """Let go: the keeper ends whatever of the sandbox still runs."""
        self.started()
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


class _Ended(Exception):
    pass


def _on_signal(signum, frame):
    raise _Ended(signum)


def _end_everything_below() -> None:
    """SIGKILL every process below this one (a subreaper: the sandbox's orphans included), until
    none is left, and reap them."""
    deadline = time.monotonic() + END_BOUND_SECONDS
    while time.monotonic() < deadline:
        processes.kill_trees(processes.children())
        if processes.reap_ended_children():
            return
        time.sleep(0.01)


def _wait(leash_fd: int, child: int) -> int | None:
    """Wait for the grader's end-of-file or the child's end; the child's exit code, or None."""
    child_fd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(leash_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    poller.register(child_fd, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == leash_fd:
                return None
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                return os.waitstatus_to_exitcode(status)


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _start(command: list[str], leash_fd: int) -> int:
    """Fork ``command``, which dies with this keeper; the child's process id."""
    keeper = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)   # no handler of ours runs in the child
    child = os.fork()
    if child == 0:
        try:
            os.close(leash_fd)
            processes.die_with_parent()
            if os.getppid() != keeper:
                os._exit(1)
            for signum in ENDING_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    close_all_but(leash_fd)   # nothing of the sandbox's but its output (a verdict pipe's end would stay open)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)
    return child


def end_as(code: int) -> None:
    """Exit with ``code``, or, negative, die by that signal, as the keeper's child did: a caller
    that reads ``-9`` from the sandbox reads it from the keeper too. Never returns. Shared with
    the rank's keeper (:mod:`distlab.grade.boundary.rank_keeper`), which ends as its rank did."""
    if code >= 0:
        os._exit(code)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -code not in (signal.SIGKILL, signal.SIGSTOP):   # these two take no handler (EINVAL)
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    finally:
        os._exit(128 - code)


def close_all_but(keep_fd: int) -> None:
    """Close every descriptor above standard error except ``keep_fd``: a keeper holds nothing of
    what it keeps (a pipe end it held would stay open for as long as the keeper lives)."""
    most = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, most if most != resource.RLIM_INFINITY else 65536)


def main(argv: list[str]) -> None:
    leash_fd, command = int(argv[0]), argv[argv.index("--") + 1:]
    for signum in ENDING_SIGNALS:
        signal.signal(signum, _on_signal)
    processes.die_with_parent(0)   # from here the pipe says when the grader is gone
    processes.become_subreaper()
    code = 1   # the grader let go (or died) first
    try:
        ended = _wait(leash_fd, _start(command, leash_fd))
        code = code if ended is None else ended
    except _Ended as why:
        code = -why.args[0]
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
        _end_everything_below()
    end_as(code)


if __name__ == "__main__":
    main(sys.argv[1:])
