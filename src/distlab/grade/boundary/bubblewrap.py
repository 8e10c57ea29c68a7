"""The operating-system boundary around student code: Linux namespaces, set up by bubblewrap.

The guard in :mod:`distlab.grade.boundary.protect` works inside Python: code that loads C functions
with ``ctypes`` makes system calls it never sees, and then the grading user's whole file
system is writable. So the two processes that run student code, the grading kernel and the
clean room (whose ranks run the student's functions), start inside ``bwrap`` (Debian's
``bubblewrap``), which gives them their own view of the machine:

=============  ============================================================================
files          A new, empty root holding, read-only: the system (``/usr``, ``/etc``), this
               Python and its packages (``sys.prefix``), and the repository's ``src/`` and
               ``data/``. Nothing else exists: not the solutions, not ``grader/`` (the
               gradebook, the other students' folders), not ``.git``, not the exchange, not
               the grader's home. ``/tmp`` and ``/dev/shm`` are private, empty and capped
               (:data:`TMP_MB`, :data:`SHM_MB`: they live in memory). The only
               folders shared with the outside, writable, are the ones the caller names: the
               kernel's own folder (a copy of the submission's files, without the
               notebook) or the clean room's folder, each a memory file system capped in
               bytes and files (:mod:`distlab.grade.boundary.scratch`), and the kernel's sockets.
network        A new network namespace: only its own loopback. Ranks talk to each other over
               ``127.0.0.1`` inside it; the machine's services (a database, the hub, Slurm's
               daemons, even on the host's ``127.0.0.1``) and every other address are out of
               reach.
processes      A new PID namespace: the sandbox sees only its own processes, so it cannot
               signal anyone else's. ``--die-with-parent``: when the process that started
               ``bwrap`` dies, the kernel ends every process in the sandbox (once bwrap has
               asked for it: the grader starts it behind a keeper that holds from the
               start, :mod:`distlab.grade.boundary.sandbox_keeper`).
user           An unprivileged account. A grader running as root drops to ``nobody`` (uid
               65534) inside the sandbox, after the mounts are made; any other grader's
               processes appear as ``nobody`` in a user namespace without capabilities.
=============  ============================================================================

Sockets: a Unix socket is reached through the file system, not the network, so hiding
``/run`` and ``/tmp`` (where daemons keep theirs) matters as much as the network namespace.

Inside the clean room's sandbox, every graded rank goes one step further, once its process
group is up: namespaces of its own, so that the ranks share nothing but their process group
(:mod:`distlab.grade.boundary.rank_room`).

``DISTLAB_GRADE_SANDBOX=none`` grades without this boundary (the Python guard and the
resource caps stay): for a machine without bubblewrap or without user namespaces, and only
where the students are trusted.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

NOBODY = 65534
TMP_MB = 1024
"""Size of the sandbox's /tmp (its HOME, and the ranks' run folders). A memory file system:
without a cap, a submission could fill half the machine's memory with files."""
SHM_MB = 512
"""Size of the sandbox's /dev/shm (shared-memory tensors of DataLoader workers), for the same reason."""
SANDBOX_VARIABLE = "DISTLAB_GRADE_SANDBOX"
PASSED_VARIABLES = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "OMP_NUM_THREADS",
                    "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME",
                    "DISTLAB_GRADE_KERNEL", "DISTLAB_THREADS", "DISTLAB_BACKEND", "DISTLAB_PG_TIMEOUT",
                    "DISTLAB_START_TIMEOUT", "DISTLAB_MAX_OUTPUT_BYTES", "DISTLAB_CORPUS", "DISTLAB_RANK_ROOM"}
"""Variables the sandbox keeps; the rest of the grader's environment (tokens, passwords, Slurm's
job variables: inside, ranks start locally) stays out. So does the relay's seed
(``DISTLAB_RELAY_SEED``): the ranks must not know it, and the clean room gets it in its job
(:mod:`distlab.relay.schedule`)."""
PASSED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "NVIDIA_")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                "/dev/nvidia-caps", "/dev/dri", "/dev/infiniband")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


def enabled() -> bool:
    """Whether student code is graded inside the boundary (the default)."""
    return os.environ.get(SANDBOX_VARIABLE, "bwrap").strip().lower() not in ("none", "off", "0")


def _readable_roots(repo: str) -> list[str]:
    """Folders shown read-only: this Python, its packages, and the repository's code and data."""
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.join(repo, "src"), os.path.join(repo, "data")}
    if os.environ.get("DISTLAB_CORPUS"):  # a corpus of the instructor's choice (distlab.data.corpus)
        roots.add(os.path.dirname(os.path.realpath(os.environ["DISTLAB_CORPUS"])))
    repo = os.path.realpath(repo)
    for entry in sys.path:  # e.g. a user site-packages, or an editable install elsewhere
        real = os.path.realpath(entry) if os.path.isabs(entry) else ""
        inside_repo = real == repo or real.startswith(repo + os.sep)  # grader/ must stay hidden
        if not inside_repo:
            roots.add(real)
    shown_anyway = ("/usr", "/etc")  # bound whole, below
    roots = sorted(r for r in roots if os.path.isdir(r) and not any(r == s or r.startswith(s + os.sep)
                                                                     for s in shown_anyway))
    # A folder inside another one already shown needs no mount of its own.
    return [r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots)]


def passed_environment() -> dict[str, str]:
    """The variables of the grader's environment that the sandbox keeps (:data:`PASSED_VARIABLES`)."""
    return {name: value for name, value in os.environ.items()
            if name in PASSED_VARIABLES or name.startswith(PASSED_PREFIXES)}


def _parents(paths: list[str]) -> list[str]:
    """The folders above ``paths`` (not ``/``), outermost first, each once."""
    found = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda p: (p.count(os.sep), p))


def command(argv: list[str], writable: list[str], cwd: str, repo: str | None = None,
            env: dict[str, str] | None = None) -> list[str]:
    """``argv`` as a command line that runs it inside the boundary.

    Args:
        argv: the command (its program must be under a folder the sandbox shows, e.g.
            ``sys.executable``).
        writable: the folders shared with the outside, writable (made the sandbox user's
            when the grader is root, see :func:`hand_over`).
        cwd: the working folder inside (one of ``writable``, typically).
        repo: the repository (default: the one this distlab comes from).
        env: variables to set inside (``HOME`` and ``TMPDIR`` are the private ``/tmp``).
    """
    if repo is None:
        from distlab.grade import config

        repo = config.repo_root()
    repo = os.path.realpath(repo)
    as_root = os.geteuid() == 0
    # hostname "localhost": it resolves (sandbox-hosts) to the private loopback, as torch's rendezvous needs
    cmd = ["bwrap", "--die-with-parent", "--unshare-ipc", "--unshare-pid", "--unshare-net",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "localhost"]
    if as_root:  # mounts are made as root; the program itself runs as nobody (setpriv, below)
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
    hosts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox-hosts")
    cmd += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--ro-bind", hosts, "/etc/hosts"]
    for path in _MERGED_USR:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind", "/sys", "/sys",  # read-only: torch reads the CPU layout, gloo the network devices
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(SHM_MB * 2**20), "--tmpfs", "/dev/shm",
            "--perms", "1777", "--size", str(TMP_MB * 2**20), "--tmpfs", "/tmp"]
    for device in _GPU_DEVICES + tuple(f"/dev/nvidia{i}" for i in range(16)):
        if os.path.exists(device):
            cmd += ["--dev-bind", device, device]
    readable, writable = _readable_roots(repo), [os.path.realpath(f) for f in writable]
    for parent in _parents(readable + writable):  # bwrap would make them 0700: nobody could pass
        cmd += ["--perms", "0755", "--dir", parent]
    for root in readable:
        cmd += ["--ro-bind", root, root]
    for folder in writable:
        cmd += ["--bind", folder, folder]
    cmd += ["--clearenv"]  # the grader's environment may hold tokens and passwords
    # DISTLAB_PRIVATE_NETWORK=0: ranks started inside stay in the sandbox's network, private
    # already, where the clean room counts every byte they send (distlab.grade.boundary.wire)
    inside = {"HOME": "/tmp", "TMPDIR": "/tmp", "DISTLAB_PRIVATE_NETWORK": "0"}
    for name, value in {**passed_environment(), **inside, **(env or {})}.items():
        cmd += ["--setenv", name, value]
    cmd += ["--chdir", os.path.realpath(cwd), "--"]
    if as_root:
        cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
                "--no-new-privs", "--"]
    return cmd + list(argv)


def hand_over(folder: str) -> None:
    """Make ``folder`` (and what it holds) writable by the sandbox's user.

    A root grader's sandbox runs as nobody, which must be able to write the folder the
    grader prepared for it; any other grader's sandbox is the grader itself, so nothing
    changes.
    """
    if os.geteuid() != 0:
        return
    # bwrap enters the working folder after giving up root's right to pass any folder
    os.chmod(folder, os.stat(folder).st_mode | 0o111)
    for parent, dirs, files in os.walk(folder):
        for name in [parent] + [os.path.join(parent, n) for n in dirs + files]:
            os.chown(name, NOBODY, NOBODY, follow_symlinks=False)


def copy_submitted_files(graded: str, folder: str) -> None:
    """Fill the grading kernel's own ``folder`` with the files of the graded folder ``graded``
    that are not notebooks (a data file the student handed in, say), as plain files: links are
    left out, never followed. The notebook stays behind: it holds the restored test cells."""
    if not os.path.isdir(graded):
        return
    for parent, dirs, files in os.walk(graded):   # never enters a link to a folder
        inside = os.path.join(folder, os.path.relpath(parent, graded))
        for name in dirs:
            if not os.path.islink(os.path.join(parent, name)):
                os.makedirs(os.path.join(inside, name), exist_ok=True)
        for name in files:
            source = os.path.join(parent, name)
            if not name.endswith(".ipynb") and not os.path.islink(source) and os.path.isfile(source):
                shutil.copyfile(source, os.path.join(inside, name), follow_symlinks=False)


@functools.lru_cache(maxsize=1)
def check() -> None:
    """Raise :class:`SandboxUnavailable` with what to do, unless a sandbox starts here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed: student code is graded inside it (apt-get install bubblewrap). "
            f"To grade without this boundary, only for trusted students, set {SANDBOX_VARIABLE}=none.")
    probe = command([sys.executable, "-c", "print('ok')"], writable=[], cwd="/tmp")
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise SandboxUnavailable("bubblewrap did not start a sandbox within 60 s") from exc
    if done.returncode != 0 or done.stdout.strip() != "ok":
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SandboxUnavailable(
            f"bubblewrap cannot start a sandbox here ({why}); it needs user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1) unless the grader runs as root. "
            f"To grade without this boundary, only for trusted students, set {SANDBOX_VARIABLE}=none.")


def starts_here(command: str, say) -> bool:
    """Before grading: can student code be graded inside the boundary here? One line if not."""
    if not enabled():
        say(f"{command}: grading WITHOUT the operating-system sandbox ({SANDBOX_VARIABLE}=none): "
            "student code can write wherever this account can")
        return True
    try:
        check()
        return True
    except SandboxUnavailable as exc:
        say(f"{command}: {exc}")
        return False
