"""Each graded rank in a room of its own: no channel to the other ranks but the ones the grader gives.

The clean room (:mod:`distlab.grade.boundary.cleanroom`) runs a student's function on N ranks, all in one
sandbox (:mod:`distlab.grade.boundary.bubblewrap`), all as the same user. Inside that sandbox they shared
everything a user can share: a file one rank wrote in ``/tmp``, ``/dev/shm``, the working folder
or ``$HOME`` was there for the next; SysV shared memory and message queues; the loopback, where a
rank could start a ``TCPStore`` of its own, or use the one the ranks met through, as a mailbox;
and the run folder through which the ranks get their calls. A chapter-2 "ring" could then move
every tensor through a file and send a dummy message of the right size to satisfy the byte
counts. Linux namespaces close these, one kind of sharing each. Every rank, before any student
code runs, is moved into namespaces of its own:

===========  ==================================================================================
user         Made first (:func:`prepare`, a ``start`` step: the rank has one thread then, which
             Linux requires), with the same account mapped to itself. It gives the rank the right
             to make the namespaces below, and nothing outside them. Once the room is built the
             rank gives up every capability, so it cannot undo a mount, join another namespace or
             make a new one that would help.
process id  Made with the user namespace; the process forks, and its child, the first process
             of the new namespace, is the rank from then on, in a session of its own
             (:mod:`distlab.grade.boundary.rank_keeper`: the parent stays outside as its keeper, which the
             launcher sees as the rank). No other rank, no agent and no grader has a number
             there: ``kill``, ``ptrace``, ``prlimit`` and every other call that names a process
             reach only what the rank started, and ``kill(0, ...)`` only its own session. (Not
             for ranks that may join NCCL: :func:`distlab.grade.boundary.rank_keeper.wanted`.)
network     A new, empty network: not even a loopback that is up. The gloo connections made before
             (the process group) keep working, because an open socket stays in the network it was
             made in; nothing new can be opened to anyone: a ``TCPStore`` or a gloo group of the
             rank's own has nobody to talk to, and abstract Unix sockets (which belong to a network
             namespace) are private too. The connection to the store the ranks met through is shut
             down first: it would be a shared mailbox. Every chapter's ranks lose the network, those
             that make process groups and device meshes of their own too (chapters 4, 5 and 7): they
             are graded on the grader's relay (:mod:`distlab.relay`), whose ``new_group`` needs no
             store and no new connection.
IPC          A new IPC namespace: SysV shared memory, semaphores and message queues, and POSIX message
             queues, are the rank's alone.
mount        Every folder the sandbox leaves writable (``/tmp``, ``/dev/shm``, the working folder,
             ``$HOME``, ``$TMPDIR`` and any other writable mount) is covered by a memory file system
             of the rank's own, capped in bytes and in files (:data:`FOLDER_MB`,
             :data:`FOLDER_FILES`; past either, a write fails with "No space left on device"). The
             working folder's files are copied into the rank's copy. So a file (or a path Unix
             socket, or a FIFO) that one rank makes is never seen by another, and a rank that
             writes 20,000 files or 10 GB stops at the cap, in memory its own control group pays
             for, never on the host's disk. What is read-only (the system, Python, torch, the
             course's ``src/`` and ``data/``) is shown as before.
===========  ==================================================================================

The run folder. The ranks got their calls and returned their results through files in one
folder (:mod:`distlab.runtime.rundir`), and every rank could read and write all of it: another
rank's output, its results, a file of its own. Two ways to close it: move the protocol to
descriptors (a pipe per rank), or give each rank its own part of the folder. The second is
chosen: the watcher, the pool and the Slurm launchers all speak the folder protocol, and a
rank's own part keeps them unchanged. Each rank makes ``rank-<k>`` in the run folder and its
mount namespace shows that folder *at the run folder's path*, so the worker's code and paths
are the same inside; the names the watcher reads (``state-<k>.json``, a call's ``result-<k>``
and ``error-<k>``) are links into it, and the pool copies each call's files into every rank's
folder (:func:`distlab.runtime.rundir.share_call`). A rank's output files were opened before
the room and stay open; it cannot reach another's.

Threads. A namespace belongs to a thread, not to a process, and threads keep the namespaces
they started in. The room is entered by the rank's main thread; the rank's own Python threads
(the caps' watchdog, the state writer) are stopped before and started again from inside, so no
Python code of the rank runs outside (a student can make those threads run their code by
replacing a function they call). Any other Python thread makes the room refuse to open.

Also closed: ``/proc`` and ``ptrace``. The rank becomes undumpable, so another rank of the same
user cannot read its memory, its descriptors or its files through ``/proc/<pid>/`` (``root``,
``cwd``, ``fd``, ``mem``), nor trace it; and it runs with ``no_new_privs``.

What remains, said plainly:

* a run that is not on the grader's own backend (every chapter's is; a chapter a course adds
  may not be) keeps the connections gloo made before the room: a rank can write whatever it
  likes on them (the clean room counts those bytes, :mod:`distlab.grade.boundary.wire`);
* gloo's and the math library's native threads, started before the room, stay outside it: a
  rank that rewrites its own machine code to run in one of them could open files or sockets
  in the sandbox's shared view (no Python-level road leads there);
* the ranks still see each other's names and states in the sandbox's ``/proc`` (not contents,
  and they cannot signal what they see): a ``/proc`` of the rank's own namespace cannot be
  mounted where the grader runs as root, because ``bwrap`` covers ``/proc/sys`` and three
  more entries there, and Linux refuses a new ``/proc`` to a user namespace that sees one
  partly covered (measured: EPERM). Our code in a rank counts and ends its processes by what
  ``/proc`` shows (:func:`distlab.runtime.processes.init_of_own_pids`). The ranks share the
  machine's CPUs, so timing between them is observable: slow covert channels, bits per second,
  not a way to move tensors within a test's time limit;
* ranks on NCCL keep the loopback and ``/dev/shm`` (NCCL connects two GPUs when they first talk,
  through both; files, IPC and the run folder are private there too).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import threading
from pathlib import Path

from distlab.grade.boundary import rank_keeper
from distlab.runtime import private_network
from distlab.runtime import rundir as files

FOLDER_MB = 256
"""Bytes each private folder of a rank may hold (MiB): in memory, charged to the submission."""
FOLDER_FILES = 10_000
"""Files and folders each private folder of a rank may hold."""
ALWAYS_PRIVATE = ("/tmp", "/dev/shm")
VARIABLE = "DISTLAB_RANK_ROOM"

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
_MS_RDONLY, _MS_REMOUNT = 1, 32
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24
_CAPABILITY_VERSION_3 = 0x20080522
_NOT_ON_PROC = ("/proc", "/sys", "/dev")


class RoomError(RuntimeError):
    """The rank's private room could not be made: the rank does not run student code."""


def wanted() -> bool:
    """Whether graded ranks get their rooms: always, unless the instructor sets
    ``DISTLAB_RANK_ROOM=off`` (to measure what the room costs, ``benchmarks/autograde.py --room``,
    or on a machine that refuses a user namespace inside the sandbox; only for trusted students)."""
    return os.environ.get(VARIABLE, "on").strip().lower() not in ("off", "0", "no", "none", "false")


def around(start_steps: list[dict]) -> list[dict]:
    """``start_steps`` (:func:`distlab.runtime.options.rank_setup` steps) with the room's around
    them, inside the grading sandbox: the user namespace first, while the rank has one thread
    (before the caps start theirs); the rest once its process group is up."""
    from distlab.grade.boundary import bubblewrap

    if not bubblewrap.enabled() or not wanted():   # trusted students only: no room
        return list(start_steps)
    return [{"module": __name__, "function": "prepare", "when": "start", "kwargs": {}}, *start_steps,
            {"module": __name__, "function": "enter", "when": "joined", "kwargs": {"network": True}}]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise RoomError(f"the rank's private room: {what} failed ({os.strerror(errno)})")


def prepare() -> None:
    """First thing on the rank, while it has one thread: a user namespace of its own, the same
    account inside, and a process-id namespace of its own, whose first process (pid 1) becomes
    the rank while this one stays behind as its keeper (:mod:`distlab.grade.boundary.rank_keeper`)."""
    if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
        raise RoomError("the rank's private room must be prepared before the rank starts a thread")
    uid, gid = os.getuid(), os.getgid()
    own_pids = rank_keeper.wanted()
    _check(_libc().unshare((_CLONE_NEWPID if own_pids else 0) | (0 if uid == 0 else _CLONE_NEWUSER)),
           "unshare(CLONE_NEWUSER | CLONE_NEWPID)")
    if uid != 0:
        private_network.map_to_itself(uid, gid)
    if own_pids:
        rank_keeper.split_off()


def enter(run_dir: str, rank: int, network: bool = True, folder_mb: int = FOLDER_MB,
          folder_files: int = FOLDER_FILES) -> None:
    """Move this rank into its room (see the module's docstring); a ``joined`` setup step, run
    after the process group is up and before the first call."""
    from distlab.grade.boundary import limits
    from distlab.relay import link as relay_link_module
    from distlab.runtime.rank_state import RankState

    libc = _libc()
    run_dir = os.path.realpath(run_dir)
    cwd = os.path.realpath(os.getcwd())
    nccl = _uses_nccl()
    network = network and not nccl
    state = RankState.current
    if state is not None:
        state.stop_thread()
    watchdogs = limits.pause_watchdogs()
    relay_link = relay_link_module.paused_reader()   # the relay's reader thread, if this rank has one
    outside = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if outside:
        raise RoomError(f"threads would stay outside the rank's private room: {', '.join(outside)}")
    own = _own_folder(Path(run_dir), rank)
    covered = [f for f in _private_folders(cwd) if not (nccl and f == "/dev/shm")]
    if network:
        _shut_store_connection()
    _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | (_CLONE_NEWNET if network else 0)), "unshare")
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making the mounts private")
    view = os.open(own, os.O_PATH | os.O_DIRECTORY)
    work = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)
    kept = [(point, os.open(point, os.O_PATH)) for point in _read_only_inside(covered)]
    try:
        for folder in covered:
            options = f"size={int(folder_mb)}m,nr_inodes={int(folder_files)},mode=1777"
            _check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()),
                   f"a private folder on {folder}")
        _show_again(libc, kept)
        os.makedirs(cwd, exist_ok=True)
        _copy_files(work, cwd)
        os.makedirs(run_dir, exist_ok=True)
        _check(libc.mount(f"/proc/self/fd/{view}".encode(), run_dir.encode(), None, _MS_BIND, None),
               "showing the rank its own part of the run folder")
    finally:
        os.close(view)
        os.close(work)
        for _, fd in kept:
            os.close(fd)
    os.chdir(cwd)
    _seal(libc)
    limits.resume_watchdogs(watchdogs)
    relay_link_module.resume_reader(relay_link)
    if state is not None:
        state.start_thread()


def _uses_nccl() -> bool:
    """NCCL connects a pair of ranks when they first talk, over sockets and ``/dev/shm``: its
    ranks keep the network and ``/dev/shm`` (the rest of the room stands)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower()


def _own_folder(run_dir: Path, rank: int) -> Path:
    """Make ``rank-<k>`` and point the names the watcher reads at it (before the room: this is
    the last moment the rank sees the whole run folder)."""
    own = files.rank_dir(run_dir, rank)
    own.mkdir(mode=0o700, exist_ok=True)
    names = [files.state_file(run_dir, rank)]
    if (run_dir / files.PAYLOAD).exists():   # a single run: its call is at the top
        for name in (files.PAYLOAD, files.OPTIONS):
            shutil.copyfile(run_dir / name, own / name)
        names += [files.result_file(run_dir, rank), files.error_file(run_dir, rank)]
    for path in names:
        target = own / path.name
        if path.exists() and not path.is_symlink():
            shutil.copyfile(path, target)
        link = path.with_name(f".{path.name}.link")
        os.symlink(os.path.relpath(target, run_dir), link)
        os.replace(link, path)
    return own


def _private_folders(cwd: str) -> list[str]:
    """The folders to cover: the usual ones, the working folder, and every writable mount;
    none inside another (covering the outer one hides it already), outermost first."""
    wanted = set(ALWAYS_PRIVATE) | {cwd}
    for name in ("HOME", "TMPDIR"):
        if os.environ.get(name):
            wanted.add(os.path.realpath(os.environ[name]))
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            point, options = fields[4].replace("\\040", " "), fields[5].split(",")
            if "rw" in options and os.path.isdir(point) and os.access(point, os.W_OK):
                wanted.add(point)
    wanted = {w for w in wanted if w != "/" and os.path.isdir(w)
              and (w == "/dev/shm" or not any(w == p or w.startswith(p + "/") for p in _NOT_ON_PROC))}
    return sorted((w for w in wanted if not any(w.startswith(o + "/") for o in wanted)),
                  key=lambda p: (p.count("/"), p))


def _read_only_inside(covered: list[str]) -> list[str]:
    """The read-only mounts inside a folder the room covers, outermost first: the course's code
    and Python when they live there (a clone in ``/tmp``, a virtual environment in a home). The
    sandbox shows them read-only; covering their folder would hide them from the rank."""
    points = set()
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            if "ro" in fields[5].split(",") and any(point.startswith(folder + "/") for folder in covered):
                points.add(point)
    return sorted(points, key=lambda p: (p.count("/"), p))


def _show_again(libc, kept: list[tuple[str, int]]) -> None:
    """Bind each read-only mount of :func:`_read_only_inside` (held open before its folder was
    covered) back at its place on top of the rank's own folder, and make sure it is still
    read-only there: a writable one would be a place every rank sees."""
    for point, fd in kept:
        os.makedirs(point, exist_ok=True)
        _check(libc.mount(f"/proc/self/fd/{fd}".encode(), point.encode(), None, _MS_BIND, None),
               f"showing {point} again, read-only")
        if not os.statvfs(point).f_flag & os.ST_RDONLY:
            _check(libc.mount(None, point.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None),
                   f"making {point} read-only")


def _copy_files(source_fd: int, folder: str) -> None:
    """The working folder's files, into the rank's copy of it (as far as the caps allow)."""
    try:
        shutil.copytree(f"/proc/self/fd/{source_fd}", folder, symlinks=True, dirs_exist_ok=True)
    except (OSError, shutil.Error):
        pass


def _shut_store_connection() -> None:
    """Shut down this rank's connection to the rendezvous store (every rank reads and writes
    the same keys there): the process group no longer needs it."""
    port = int(os.environ.get("MASTER_PORT", "0") or 0)
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                    sock.shutdown(socket.SHUT_RDWR)
        except (OSError, IndexError, TypeError):
            continue


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _seal(libc) -> None:
    """Give up what could undo the room: every capability (so no mount can be removed and no
    namespace joined), new privileges through ``exec``, and being readable through ``/proc``."""
    from distlab.runtime import processes

    processes.set_dumpable(False)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "dropping the capabilities")
