"""Keeping the processes we start on a leash, and ending exactly those, all of them.

Two rules, because a login node or a JupyterHub server is shared with other people:

* We only ever signal processes we started ourselves, by process id or by the process group
  we created for them, never by name (``pkill -f torchrun`` would kill other users' jobs).
* Nothing we start may outlive the run. torchrun puts every worker in a session of its own,
  so killing torchrun does not reach the workers, and a rank's own children may start
  sessions of their own too. Three Linux features keep the whole tree in reach:

  1. the *parent-death signal* (``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`): the
     kernel sends SIGKILL to torchrun when the notebook process dies, and to each rank when
     torchrun dies;
  2. the *child subreaper* flag (``prctl(PR_SET_CHILD_SUBREAPER)``, :func:`become_subreaper`),
     set on torchrun and on every rank: a process whose parent dies is re-parented to the
     nearest subreaper above it instead of to ``init``, so what a rank started (even in a new
     session, even after the rank died) stays below torchrun, where we can find it;
  3. :class:`ProcessTree`: the launcher remembers every process it has seen below torchrun
     (it looks again whenever a rank ends), and at the end of a run signals them, SIGTERM
     first and SIGKILL shortly after, and *waits until every one of them is gone*, with a
     bound. A run returns or raises only then.

One gap is left: when torchrun itself has ended (a rank died and torchrun followed it), what
the ranks started is re-parented to ``init``, out of every tree. So every process of a run
also carries a *tag*, the environment variable :data:`TAG_VARIABLE` set to the run's own
folder, which its children inherit; at the end :meth:`ProcessTree.end` also ends this user's
processes that carry the run's tag (:func:`tagged`). Only a process that both leaves the tree
and clears its environment gets past that, and the grader's caps count those
(:mod:`distlab.grade.boundary.limits`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36

TAG_VARIABLE = "DISTLAB_RUN_TAG"
"""The environment variable that tags every process of a run (its value: the run's folder)."""

END_BOUND_SECONDS = 10.0
"""The longest :meth:`ProcessTree.end` waits for killed processes to be gone (a SIGKILLed
process on a loaded machine takes milliseconds, rarely a second, to disappear)."""


_libc = None


def libc() -> ctypes.CDLL:
    """The C library, loaded once. Call it before a fork whose child calls :func:`die_with_parent`
    (a ``preexec_fn``): loading it in the child could wait forever for a lock another thread of
    the parent held when it forked."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return libc().prctl(option, int(value), 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent process dies.

    It survives ``exec``, so calling it in a ``preexec_fn`` covers the program started there.
    (On other systems this is a no-op; :class:`ProcessTree` still ends everything on every exit path.)
    """
    _prctl(_PR_SET_PDEATHSIG, sig)


def become_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it, not to ``init`` (Linux; else False).

    The flag survives ``exec`` (set it in a ``preexec_fn``), and is not inherited by children.
    """
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_dumpable(dumpable: bool) -> bool:
    """``prctl(PR_SET_DUMPABLE)``: whether other processes of this user may read this one's
    ``/proc/<pid>/`` entries (``mem``, ``fd``, ``cwd``, ``environ``) and trace it. An exec makes a
    process dumpable again; a fork does not. Linux; elsewhere a no-op that returns False."""
    return _prctl(_PR_SET_DUMPABLE, int(dumpable))


def set_name(name: str) -> None:
    """Name this process in ``ps -o comm``, ``top`` and ``psutil.Process.name()`` (Linux: up to 15
    bytes). A process forked without an exec keeps its parent's command line; this tells it apart."""
    if sys.platform.startswith("linux"):
        libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def leash(subreaper: bool = True) -> None:
    """``preexec_fn`` of a launcher's agent (torchrun, srun): dies with us, adopts its orphans."""
    die_with_parent()
    if subreaper:
        become_subreaper()


def alive(procs) -> list[psutil.Process]:
    """The processes among ``procs`` still running (a zombie has ended: it only awaits its parent)."""
    found = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _signal_groups_and_processes(procs, sig: int) -> None:
    """Send ``sig`` to each process and to the process group it leads (if it leads one)."""
    for proc in procs:
        try:
            if not proc.is_running():
                continue
            if os.getpgid(proc.pid) == proc.pid:  # a group leader we created: take its group
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue


def _wait_gone(procs, seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while True:
        left = alive(procs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def tagged(tag: str) -> list[psutil.Process]:
    """This user's running processes whose environment carries ``TAG_VARIABLE=tag`` (a few ms)."""
    me, found = os.getuid(), []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == me and proc.pid != os.getpid() \
                    and proc.environ().get(TAG_VARIABLE) == tag:
                found.append(proc)
        except psutil.Error:
            continue
    return alive(found)


class ProcessTree:
    """Every process seen below some roots (an agent and its ranks), ended together at the end.

    ``remember()`` adds what is below the roots now: call it whenever a process of the tree
    may be about to end (its orphans are re-parented to the nearest subreaper, which may be
    gone a moment later). :meth:`end` ends everything remembered and everything below the
    roots now, and returns only when all of it is gone or ``bound`` seconds have passed.
    """

    def __init__(self, roots=(), tag: str | None = None):
        self.roots: list[int] = list(roots)
        self.tag = tag                       # the run's tag (see TAG_VARIABLE), if its processes carry one
        self.seen: dict[int, psutil.Process] = {}

    def remember(self) -> None:
        """Add every process below the roots, and below what was seen before, that runs now."""
        below: dict[int, list[psutil.Process]] = {}   # parent pid -> children: one look at every process
        for proc in psutil.process_iter(["ppid"]):
            below.setdefault(proc.info["ppid"], []).append(proc)
        todo = []
        for pid in self.roots:               # our own children: their pids are ours until we reap them
            try:
                todo.append(psutil.Process(pid))
            except psutil.Error:
                continue
        todo += [proc for proc in self.seen.values() if proc.is_running()]   # not a reused pid
        while todo:
            proc = todo.pop()
            self.seen.setdefault(proc.pid, proc)
            todo += [child for child in below.get(proc.pid, []) if child.pid not in self.seen]

    def end(self, grace: float = 0.5, bound: float = END_BOUND_SECONDS) -> list[psutil.Process]:
        """SIGTERM, then SIGKILL after ``grace`` s, every process of the tree; wait until all are gone.

        Returns the processes still alive after ``bound`` seconds (normally none).
        """
        deadline = time.monotonic() + bound
        self.remember()
        procs = self._strays()
        _signal_groups_and_processes(procs, signal.SIGTERM)
        _wait_gone(procs, grace)
        while True:
            # Look again, always: a process may have started one more while it was being ended.
            # Only a look that finds nothing left ends the loop.
            self.remember()
            procs = self._strays()
            if not procs or time.monotonic() > deadline:
                return procs
            _signal_groups_and_processes(procs, signal.SIGKILL)
            _wait_gone(procs, min(0.2, max(0.0, deadline - time.monotonic())))

    def _strays(self) -> list[psutil.Process]:
        """What is left running: of the tree, and of the run's tagged processes wherever they went."""
        found = {proc.pid: proc for proc in alive(self.seen.values())}
        if self.tag is not None:
            found.update({proc.pid: proc for proc in tagged(self.tag)})
        return list(found.values())


def children(pid: int | None = None) -> set[int]:
    """Process ids of the direct children of ``pid`` (default: this process); empty once it is gone.

    Cheap: Linux lists each thread's children in ``/proc/<pid>/task/<tid>/children``, so only
    this process is read. Without those files (not Linux, or a kernel built without them) psutil
    answers, by reading every process on the machine. A child that starts or ends while the
    files are read may be missed (they are not read atomically): callers that must see every
    child look again.
    """
    if not os.path.exists("/proc/self/task"):
        return _children_by_psutil(os.getpid() if pid is None else pid)
    pid = "self" if pid is None else pid   # "self": right also where our pid is not /proc's (init_of_own_pids)
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:                   # the process is gone
        return set()
    pids: set[int] = set()
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as listing:
                pids.update(int(child) for child in listing.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{task}"):   # the thread is there, its list is not
                return _children_by_psutil(pid)
        except OSError:               # the thread ended while we read
            continue
    return pids


def init_of_own_pids() -> bool:
    """Whether this process is the first of a process-id namespace of its own (a graded rank in
    its room, :mod:`distlab.grade.boundary.rank_room`). Its ``os.getpid()`` is then 1 while ``/proc`` may
    number it otherwise; it reaches nothing outside the namespace, and ``kill(-1, ...)`` reaches
    exactly what it started."""
    return os.getpid() == 1 and os.getppid() == 0


def _signal_through_proc(pid: int, sig: int) -> None:
    """Signal the process ``/proc/<pid>`` shows (a pidfd from that folder: right whichever
    namespace numbers it; Linux refuses one outside ours)."""
    try:
        folder = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        signal.pidfd_send_signal(folder, sig)
    except OSError:
        pass
    finally:
        os.close(folder)


def kill_trees(roots) -> set[int]:
    """SIGKILL each of ``roots`` and everything below it, walking ``/proc``'s lists of children
    (numbers as ``/proc`` shows them, so right inside a pid namespace of our own too); the process
    ids it reached. A process started meanwhile may be missed: callers that must leave nothing
    look again."""
    todo, seen = list(roots), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children(pid)
            _signal_through_proc(pid, signal.SIGKILL)
    return seen


def reap_ended_children() -> bool:
    """Reap every child of ours that has ended (a zombie holds its process id until then); True
    when no child at all is left."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return False
        except ChildProcessError:
            return True


def _end_trees_in_own_pids(roots: set[int]) -> None:
    """:func:`end_children_started_since` for the init of its own namespace: SIGKILL each root and
    everything below it, then reap whatever of ours has ended."""
    seen = kill_trees(roots)
    deadline = time.monotonic() + END_BOUND_SECONDS
    while any(os.path.exists(f"/proc/{pid}") and _state_letter(pid) not in (b"Z", b"X", None) for pid in seen) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    reap_ended_children()


def _state_letter(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children_by_psutil(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children()}
    except psutil.Error:
        return set()


def end_children_started_since(before: set[int], grace: float = 0.2) -> None:
    """End every process this one started since ``before`` (its children then), and their descendants.

    A warm rank runs many calls; what one call started must not outlive it. The rank is a
    subreaper, so even a process that detached itself is still below it. The ended children
    are reaped, so none stays behind as a zombie.
    """
    started = children() - before
    if not started:
        return
    if init_of_own_pids():
        _end_trees_in_own_pids(started)
        return
    ProcessTree(started).end(grace)
    for pid in children() - before:   # ours now: the ended children, and orphans re-parented to us
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
