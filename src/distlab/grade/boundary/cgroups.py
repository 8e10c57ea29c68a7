"""Caps on a whole submission at once: one control group for its kernel, its clean room and all
their ranks.

:mod:`distlab.grade.boundary.limits` caps each process: a rank may hold 3 GiB, the kernel 6 GiB. But a
submission is many processes (the kernel, the clean room, four ranks, whatever they start),
and each may go up to its own cap at the same moment: eight processes at 3 GiB each are 24 GiB,
a whole node. A Linux *control group* bounds their sum: every process started inside it, and
every process those start, counts against one memory limit and one limit on the number of
tasks (processes and threads). Past the memory limit the kernel's out-of-memory killer ends a
process of that group, never one of the grader's or another student's; past the task limit,
``fork`` fails inside the group.

CPU time works the same way, with one difference. Each rank may use ``rank_cpu_s`` seconds of
CPU, but the count starts again in every process, so four ranks that each start a few
helpers spend many times that between them. The group adds up the CPU time of everything in
it (``cpu.stat`` in v2, ``cpuacct.usage`` in v1). A group can limit how fast its processes
use CPU, not how much they use in all, so the grader enforces the sum itself: a thread reads it
a few times a second, and once it passes ``cpu_s`` the grader ends every process in the group.
The submission has spent its budget for this phase, and nothing of it runs on.

Two kinds of control groups exist. cgroup v2 (current Debian, Ubuntu, RHEL and most cluster
nodes) is one tree at ``/sys/fs/cgroup`` (``memory.max``, ``pids.max``); cgroup v1 (older
systems, and this project's test machine) has one tree per controller
(``/sys/fs/cgroup/memory/``, ``/sys/fs/cgroup/pids/``, ``/sys/fs/cgroup/cpuacct/``). Creating
a group needs the right to write there: root has it; another account has it only where the
system delegated a part of the tree to it. Root delegates with :func:`delegate` (a group of
its own, owned by the grading account) and tells the grader where it is in
``DISTLAB_GRADE_CGROUP_PARENTS``; the demo hub does this for its instructor account. Where no
group can be made, grading goes on with the per-process caps alone and says so once in its log.

A process enters the group before it runs anything of the student's: the command that starts
the kernel or the clean room is prefixed with a small shell that writes its own process id into
the group, then ``exec``\\ s the real command (:meth:`SubmissionGroup.wrap`). After the phase,
:meth:`SubmissionGroup.close` kills whatever is still in the group and removes it. The grader
makes one group per phase of grading a notebook, with the caps it was configured with
(:mod:`distlab.grade.boundary.submission_caps`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import threading
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "distlab-grade"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
"""The cgroup v1 trees a submission's group needs, in the order of :attr:`SubmissionGroup.folders`."""
_V1_MARKER = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpuacct": "cpuacct.usage"}


PARENTS_VARIABLE = "DISTLAB_GRADE_CGROUP_PARENTS"
"""Groups delegated to the grading account (``os.pathsep``-separated): one v2 group, or one
v1 group in each of the memory, pids and cpuacct trees. New groups go below them."""


def _delegated() -> list[Path]:
    return [Path(p) for p in os.environ.get(PARENTS_VARIABLE, "").split(os.pathsep) if p]


def _v2_root() -> Path | None:
    """Where v2 groups go, if the v2 tree is mounted whole at /sys/fs/cgroup with memory and
    pids available: its root, or the group delegated to this account."""
    controllers = ROOT / "cgroup.controllers"
    if controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split()):
        delegated = _delegated()
        return delegated[0] if delegated else ROOT
    return None


def _v1_roots() -> dict[str, Path] | None:
    """Where v1 memory, pids and cpuacct groups go, if all three controllers are mounted: the
    groups delegated to this account, else below the grader's own group of each (so limits set
    above it, e.g. by a batch job's, still apply)."""
    delegated = _delegated()
    if delegated:
        by_controller = {name: d for d in delegated for name, marker in _V1_MARKER.items() if (d / marker).exists()}
        if set(by_controller) != set(V1_CONTROLLERS):
            return None
        return {name: by_controller[name] for name in V1_CONTROLLERS}
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            own[controller] = path
    # A tree mounted for several controllers at once ("cpu,cpuacct") has a link per controller.
    roots = {name: ROOT / name / own.get(name, "/").lstrip("/") for name in V1_CONTROLLERS}
    if all((root / "cgroup.procs").exists() for root in roots.values()):
        return roots
    return None


def group_roots() -> list[Path]:
    """The folders new groups go in: the v2 tree's root, or the v1 memory, pids and cpuacct
    folders."""
    v2 = _v2_root()
    return [v2] if v2 is not None else list((_v1_roots() or {}).values())


def available() -> str | None:
    """Why no group can be made here, or ``None`` if one can."""
    v2, v1 = _v2_root(), _v1_roots()
    if v2 is None and v1 is None:
        if _delegated():
            return (f"{PARENTS_VARIABLE} must name one v2 group, or one v1 group in each of the "
                    f"{', '.join(V1_CONTROLLERS)} trees")
        return "this system offers neither cgroup v2 (memory, pids) nor the v1 memory, pids and cpuacct controllers"
    folders = [v2] if v2 is not None else list(v1.values())
    if not all(os.access(folder, os.W_OK) for folder in folders):
        return f"this account may not create control groups in {', '.join(map(str, folders))}"
    return None


def delegate(account: str, name: str) -> list[Path]:
    """As root: a group named ``name`` for ``account`` to create its submissions' groups in
    (v2: one group, memory and pids enabled below it; v1: one in each of the memory, pids and
    cpuacct trees); the folders to put in :data:`PARENTS_VARIABLE`. Undo with :func:`undelegate`."""
    import pwd

    entry = pwd.getpwnam(account)
    if _v2_root() is not None:
        SubmissionGroup._enable_v2_controllers(ROOT)
        folders, owned = [ROOT / name], ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")
    elif all((ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        folders, owned = [ROOT / c / name for c in V1_CONTROLLERS], ("cgroup.procs", "tasks")
    else:
        return []
    for folder in folders:
        folder.mkdir(mode=0o755, exist_ok=True)
        for path in (folder, *(folder / f for f in owned if (folder / f).exists())):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    return folders


def undelegate(folders: list[Path]) -> None:
    """Remove delegated groups, with any group a grader left in them (closed as its grader
    would: its processes killed, then removed)."""
    for name in sorted({child.name for folder in folders for child in folder.glob(f"{PREFIX}-*")}):
        left = SubmissionGroup(name, memory_mb=0, tasks=0)
        left.version = 2 if _v2_root() is not None else 1
        left.folders = [folder / name for folder in folders if (folder / name).is_dir()]
        left.close()
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def remove_groups_of_dead_graders(roots: list[Path]) -> None:
    """Remove the groups a grader that was killed left behind (empty once its processes are gone:
    they die with it). A group's name carries its grader's process id; live graders' are kept."""
    for root in roots:
        for folder in root.glob(f"{PREFIX}-*"):
            try:
                pid = int(folder.name.split("-")[2])
                os.kill(pid, 0)
            except ProcessLookupError:
                try:
                    folder.rmdir()
                except OSError:
                    pass   # processes still in it: another grader's turn, or the next sweep
            except (ValueError, IndexError, PermissionError):
                pass


def joined(folders: list[Path], argv: list[str]) -> list[str]:
    """``argv`` started inside the group whose folders are ``folders``: a shell writes its
    process id into each ``cgroup.procs`` file, then becomes ``argv`` (``exec``), so nothing
    runs outside the group."""
    joins = " && ".join(f"echo $$ > {shlex.quote(str(folder / 'cgroup.procs'))}" for folder in folders)
    return ["/bin/sh", "-c", f'{joins} && exec "$@"', "distlab-join-cgroup", *argv]


class SubmissionGroup:
    """A control group capping one submission's processes together (see the module)::

        with SubmissionGroup("s1-00-first-steps", memory_mb=8192, tasks=512, cpu_s=1800) as group:
            subprocess.Popen(group.wrap(argv))   # the process and all it starts are inside
        group.cpu_cap_reached                    # True if the grader ended them for CPU time
    """

    CPU_CHECKS_PER_S = 4
    """How often the grader reads the group's CPU time: a group of N busy processes overshoots
    its ``cpu_s`` by at most about N / 4 CPU-seconds before it is ended."""

    def __init__(self, label: str, memory_mb: int, tasks: int, cpu_s: float | None = None):
        self.label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:60]
        self.memory_mb, self.tasks, self.cpu_s = memory_mb, tasks, cpu_s
        self.folders: list[Path] = []   # one (v2) or three (v1: see V1_CONTROLLERS)
        self.version = 0
        self.cpu_cap_reached = False
        self._stop_watching = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> "SubmissionGroup":
        name = f"{PREFIX}-{os.getpid()}-{time.monotonic_ns()}-{self.label}"
        v2 = _v2_root()
        remove_groups_of_dead_graders(group_roots())
        try:
            if v2 is not None:
                self.version = 2
                self._enable_v2_controllers(v2)
                self.folders = [v2 / name]
                self.folders[0].mkdir(mode=0o755)
                (self.folders[0] / "memory.max").write_text(str(self.memory_mb * 2**20))
                self._write_if_there(self.folders[0] / "memory.swap.max", "0")
                (self.folders[0] / "pids.max").write_text(str(self.tasks))
            else:
                self.version = 1
                roots = _v1_roots()
                self.folders = [roots[controller] / name for controller in V1_CONTROLLERS]
                for folder in self.folders:
                    folder.mkdir(mode=0o755)
                memory = self._folder("memory")
                (memory / "memory.limit_in_bytes").write_text(str(self.memory_mb * 2**20))
                self._write_if_there(memory / "memory.memsw.limit_in_bytes", str(self.memory_mb * 2**20))
                (self._folder("pids") / "pids.max").write_text(str(self.tasks))
        except BaseException:
            self.close()
            raise
        if self.cpu_s is not None:
            self._watcher = threading.Thread(target=self._watch_cpu_time, name=f"cpu-cap-{self.label}", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _folder(self, controller: str) -> Path:
        """The group's folder for ``controller``: its only one in v2, that tree's in v1."""
        return self.folders[0] if self.version == 2 else self.folders[V1_CONTROLLERS.index(controller)]

    def cpu_seconds(self) -> float | None:
        """The CPU time (user and system) every process that was ever in the group has used,
        the ended ones included; ``None`` where it cannot be read."""
        try:
            if self.version == 2:
                for line in (self._folder("cpu") / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
                return None
            return int((self._folder("cpuacct") / "cpuacct.usage").read_text()) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def _watch_cpu_time(self) -> None:
        """End the group's processes once together they have used more than ``cpu_s``."""
        while not self._stop_watching.wait(1 / self.CPU_CHECKS_PER_S):
            used = self.cpu_seconds()
            if used is not None and used > self.cpu_s:
                self.cpu_cap_reached = True
                self._write_if_there(self._folder("pids") / "pids.max", "0")   # no fork succeeds in it now
                self._kill_everything()   # and, until the group closes, whatever still gets in
                while not self._stop_watching.wait(0.05):
                    self._kill_everything()
                return

    @staticmethod
    def _enable_v2_controllers(root: Path) -> None:
        control = root / "cgroup.subtree_control"
        enabled = set(control.read_text().split())
        for controller in ("memory", "pids"):
            if controller not in enabled:
                control.write_text(f"+{controller}")

    @staticmethod
    def _write_if_there(path: Path, value: str) -> None:
        if path.exists():   # swap accounting may be compiled out or switched off
            try:
                path.write_text(value)
            except OSError:
                pass

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the group (see :func:`joined`)."""
        return joined(self.folders, argv)

    def pids(self) -> list[int]:
        """The processes in the group now."""
        found: set[int] = set()
        for folder in self.folders:
            try:
                found.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(found)

    def memory_peak_mb(self) -> float | None:
        """The most memory the group held at once, where the system records it."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self._folder("memory") / name).read_text()) / 2**20
        except (OSError, IndexError, ValueError):
            return None

    def out_of_memory_kills(self) -> int:
        """How many of the group's processes the out-of-memory killer ended."""
        try:
            if self.version == 2:
                events = (self._folder("memory") / "memory.events").read_text()
            else:
                events = (self._folder("memory") / "memory.oom_control").read_text()
        except (OSError, IndexError):
            return 0
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def _kill_everything(self) -> list[int]:
        """SIGKILL every process in the group now; the ones it found."""
        left = self.pids()
        kill_file = self.folders[0] / "cgroup.kill" if self.folders else None
        if left and self.version == 2 and kill_file.exists():
            kill_file.write_text("1")
        else:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return left

    def close(self, wait_s: float = 10.0) -> None:
        """Stop watching its CPU time, kill every process still in the group, wait until it is
        empty, remove it."""
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join()
        if not self.folders:
            return
        deadline = time.monotonic() + wait_s
        while self._kill_everything():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass
        self.folders = []
