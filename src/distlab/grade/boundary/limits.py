"""Resource caps for one process: memory, processes, output size, wall time, CPU time.

The grader runs students' code on N ranks at once on a shared machine. Without caps, one
``torch.empty(10**10)`` on 4 ranks takes a 24 GiB machine down, one ``print`` in a loop
fills the disk, and one ``subprocess.Popen`` in a loop fills the process table. So every
rank (and the grading kernel) calls :func:`apply` first thing, through
``distlab.runtime.options.rank_setup("distlab.grade.boundary.limits", "apply", when="start", ...)``::

    with rank_setup("distlab.grade.boundary.limits", "apply", when="start", memory_mb=3072, processes=8):
        distlab.run(student_fn, nprocs=4)

Each cap and how it is enforced:

==============  ===========================================================================
memory_mb       ``RLIMIT_AS``: the address space of the process. Past it, allocations fail
                *inside* the process (``RuntimeError: ... can't allocate memory``), which is
                what we want: the error is reported, the machine stays up. Note that this is
                virtual memory: an idle rank with torch and gloo loaded already maps ~1.5 GiB.
output_mb       ``RLIMIT_FSIZE``: the largest file the process may write. A rank's output goes
                to a file (see :mod:`distlab.runtime.worker`); past the cap, ``print`` raises
                ``OSError: File too large`` (Python ignores the SIGXFSZ signal).
cpu_s           ``RLIMIT_CPU``: CPU seconds; past it the kernel sends SIGXCPU (process ends).
processes       How many live descendants (children, grandchildren, ...) the process may
                have. ``RLIMIT_NPROC`` does not bind for root (CI and many graders run as
                root) and counts *every* process of the user, so we count ourselves: a
                watchdog thread looks every 20 ms, and past the cap kills the descendants
                and ends this process with exit code 125. The process is also made a "child
                subreaper" (Linux ``PR_SET_CHILD_SUBREAPER``): a grandchild that double-forks
                into a new session is re-parented to *us*, not to init, so it is still
                counted and still killed.
wall_s          Seconds of wall-clock time from :func:`apply`; past it the watchdog ends the
                process with exit code 124 (like ``timeout(1)``), descendants first.
==============  ===========================================================================

Why a thread and not a signal: a signal handler runs only between Python bytecodes, so a
rank blocked in a C call (a collective that never completes) would never see it. The
watchdog uses ``os._exit``, which works whatever the main thread is doing.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time

from distlab.runtime.processes import become_subreaper, children, init_of_own_pids, set_dumpable

MiB = 1 << 20
WATCH_INTERVAL_S = 0.02

EXIT_TOO_MANY_PROCESSES = 125
EXIT_WALL_TIME = 124


def _set_rlimit(which: int, value: int) -> None:
    """Lower both the soft and the hard limit (so the capped code cannot raise them again)."""
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def apply(memory_mb: int | None = None, processes: int | None = None, output_mb: int | None = None,
          wall_s: float | None = None, cpu_s: int | None = None, label: str | None = None) -> None:
    """Cap this process (see the table in the module docstring). ``None`` leaves a cap off."""
    if label is None:
        label = f"rank {os.environ['RANK']}" if "RANK" in os.environ else "this process"
    if memory_mb is not None:
        _set_rlimit(resource.RLIMIT_AS, int(memory_mb) * MiB)
    if output_mb is not None:
        _set_rlimit(resource.RLIMIT_FSIZE, int(output_mb) * MiB)
    if cpu_s is not None:
        _set_rlimit(resource.RLIMIT_CPU, int(cpu_s))
    if processes is not None or wall_s is not None:
        become_subreaper()
        watchdog = Watchdog(processes, wall_s, label)
        _watchdogs.append(watchdog)
        watchdog.start()


_watchdogs: list = []
"""The watchdogs :func:`apply` started in this process (:func:`restart_watchdogs` renews them)."""


def pause_watchdogs() -> list:
    """Stop this process's watchdogs (each thread ends); :func:`resume_watchdogs` starts new ones.

    A thread keeps the namespaces it was started in. A rank that enters its private room
    (:mod:`distlab.grade.boundary.rank_room`) does so from its main thread, between these two calls: the
    new watchdogs start from inside the room, so that code a student makes them run (by
    replacing a function they call) runs in the room too.
    """
    old = list(_watchdogs)
    _watchdogs.clear()
    for watchdog in old:
        watchdog.stop()
    return old


def resume_watchdogs(paused: list) -> None:
    """Start watchdogs with the same caps and deadlines as ``paused`` (see :func:`pause_watchdogs`)."""
    for watchdog in paused:
        renewed = watchdog.renewed()
        _watchdogs.append(renewed)
        renewed.start()


def make_undumpable() -> bool:
    """Close this process to the other processes of its user (Linux; else False).

    ``prctl(PR_SET_DUMPABLE, 0)``: its ``/proc/<pid>/`` entries (``mem``, ``fd``, ``cwd``,
    ``environ``) become root's, and ``ptrace`` is refused, even to processes of the same user.
    The clean room does it first thing: its ranks run as the same user, and must not read
    the hidden tests from its memory or reach the descriptor its verdict leaves on. (The
    setting does not pass to the programs it starts: a rank is dumpable again.)
    """
    return set_dumpable(False)


def descendants() -> list:
    """Live descendants of this process (zombies excluded), as psutil handles."""
    import psutil

    found = []
    try:
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return found


def live_descendant_count() -> int:
    """How many live descendants this process has, reading only its own part of the tree.

    ``psutil.Process().children(recursive=True)`` (what :func:`descendants` uses) reads the
    status of *every* process on the machine to learn who is whose parent: 1.3 ms with 90
    processes here, more on a busy node. The watchdog counts 50 times a second, in every capped
    rank and kernel, so an idle capped rank spent about 9 % of a core on it. Walking the
    children lists from our own pid (:func:`distlab.runtime.processes.children`) visits only our
    descendants. A child that starts or ends during the walk may be missed; the next look,
    20 ms later, counts it.
    """
    if not os.path.exists("/proc/self/stat"):   # not Linux
        return len(descendants())
    count, todo, seen = 0, list(children()), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if _is_live(pid):
            count += 1
        todo += children(pid)
    return count


def _is_live(pid: int) -> bool:
    """Running or sleeping, not a zombie (the state letter after the command name in ``stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):   # gone
        return False


def kill_descendants() -> int:
    """SIGKILL every live descendant of this process; return how many there were.

    Only processes below us in the process tree are touched (we started them, directly or
    not); as a subreaper, that includes the ones that tried to escape by double-forking.
    """
    import psutil

    procs = descendants()
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=2.0)
    reap_dead_children()  # orphans re-parented to us among them: no zombies left
    return len(procs)


def reap_dead_children() -> None:
    """Collect the exit status of every child of ours that has already ended.

    A subreaper inherits orphans nobody waits for: e.g. the process that ``bwrap`` forks to
    be the sandbox's init dies with ``bwrap`` and is re-parented to us. Unreaped, each stays a
    zombie (holding a process id) until this process ends, two per graded notebook.
    """
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            pass


class Watchdog(threading.Thread):
    """Counts this process's descendants and watches the clock; ends the process past a cap."""

    def __init__(self, processes: int | None, wall_s: float | None, label: str):
        super().__init__(name="distlab-limits-watchdog", daemon=True)
        self.processes, self.label = processes, label
        self.deadline = time.monotonic() + wall_s if wall_s is not None else None
        self.wall_s = wall_s
        self._stopped = threading.Event()

    def stop(self) -> None:
        """End this thread (and wait for it); the caps stop being watched until :meth:`renewed` starts."""
        self._stopped.set()
        if self.is_alive():
            self.join()

    def renewed(self) -> "Watchdog":
        """A new, unstarted watchdog with the same caps and the same deadline."""
        twin = Watchdog(self.processes, None, self.label)
        twin.deadline, twin.wall_s = self.deadline, self.wall_s
        return twin

    def run(self) -> None:
        while not self._stopped.is_set():
            if self.processes is not None:
                count = live_descendant_count()
                if count > self.processes:
                    self._end(EXIT_TOO_MANY_PROCESSES,
                              f"{self.label} had {count} processes running, more than its cap of "
                              f"{self.processes}: they and {self.label} were stopped")
            if self.deadline is not None and time.monotonic() > self.deadline:
                self._end(EXIT_WALL_TIME, f"{self.label} ran longer than its cap of {self.wall_s:g} s "
                                          "of wall-clock time and was stopped")
            self._stopped.wait(WATCH_INTERVAL_S)

    def _end(self, code: int, why: str) -> None:
        # The main thread may still be starting processes while we kill: sweep until three
        # sweeps in a row find nothing, then leave. (In the grader, whatever slips through is
        # re-parented to the clean room or the nbgrader process, both subreapers that kill
        # everything below them when a notebook is done.)
        if init_of_own_pids():   # a rank in its room: everything else in its namespace is below it
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        quiet = 0
        for _ in range(0 if init_of_own_pids() else 500):
            procs = descendants()
            quiet = quiet + 1 if not procs else 0
            if quiet >= 3:
                break
            for proc in procs:
                try:
                    proc.kill()
                except Exception:  # noqa: BLE001 - gone already
                    pass
            time.sleep(0.005)
        try:
            os.write(2, f"\n[distlab limits] {why}\n".encode())
        except OSError:
            pass
        os._exit(code)
