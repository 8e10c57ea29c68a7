"""The folders a graded submission writes: memory file systems capped in bytes and in files.

The grading kernel works in a folder of its own (a copy of the submission's other files) and
the clean room in another; both are shared with the sandbox (:mod:`distlab.grade.boundary.bubblewrap`)
and writable there. On the grading host's ``/tmp`` they would be capped only per file (the
``RLIMIT_FSIZE`` of :mod:`distlab.grade.boundary.limits`): a submission could write ten thousand small
files, or a hundred thousand, until the host's disk or its inodes ran out, for every other
student and for the grader.

So neither folder is on the host's disk while student code runs. ``python -m
distlab.grade.boundary.scratch SPEC -- COMMAND...`` (the grader puts it in front of ``bwrap``) enters a
mount namespace of its own (and, for a grader that is not root, a user namespace of its own
with the same account in it, as bubblewrap does), mounts over each folder of SPEC a ``tmpfs``
with ``size`` (:data:`FOLDER_MB`) and ``nr_inodes`` (:data:`FOLDER_FILES`) set, copies what the
folder held into it, and runs COMMAND there. Past either cap a write fails with ``ENOSPC``
("No space left on device"), which the grader explains in the cell that met it
(:func:`explain`). These file systems vanish with the last process of the namespace, and the
host's folder is as the grader left it. The grader looks in only where it must: the grading
kernel binds its sockets in a capped folder of its own (``sockets`` of :func:`wrap`), and the
grader connects to them through the namespace's first process (:func:`seen_from_outside`).

A memory file system's pages are charged to the memory control group of the process that
writes them: the submission's (:mod:`distlab.grade.boundary.cgroups`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys

from distlab.runtime import private_network

FOLDER_MB = 256
"""Bytes one such folder may hold (MiB)."""
FOLDER_FILES = 10_000
"""Files and folders one such folder may hold."""
SOCKETS_MB, SOCKETS_FILES = 1, 64
"""The caps of the grading kernel's socket folder (:mod:`distlab.grade.boundary.kernel_sockets`), which
holds its connection file and seven sockets: a submission may write there too."""
NOBODY = 65534
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 16384, 1 << 18


def wrap(argv: list[str], folders: list[str], sockets: str | None = None) -> list[str]:
    """``argv`` (a ``bwrap`` command line) run with each of ``folders`` capped (see above), and
    ``sockets``, a kernel's socket folder, capped smaller (:data:`SOCKETS_MB`, :data:`SOCKETS_FILES`)."""
    spec = [{"path": os.path.realpath(f), "mb": FOLDER_MB, "files": FOLDER_FILES} for f in folders]
    if sockets:
        spec.append({"path": os.path.realpath(sockets), "mb": SOCKETS_MB, "files": SOCKETS_FILES})
    return [sys.executable, "-m", __name__, json.dumps(spec), "--", *argv]


def seen_from_outside(pid: int, path: str) -> str:
    """``path`` inside a capped folder, as a process outside reaches it: through the mounts of
    ``pid`` (the process that :func:`wrap`'s command line became, ``bwrap``'s first), at
    ``/proc/PID/root/PATH``. That is how the grader reaches the sockets its kernel binds there."""
    return f"/proc/{pid}/root{os.path.realpath(path)}"


NOTE = (f"[grader] The folders a graded notebook may write hold at most {FOLDER_MB} MiB in {FOLDER_FILES} "
        f"files each; this write went past that. (The kernel's socket folder holds {SOCKETS_MB} MiB in "
        f"{SOCKETS_FILES} files.)\n")
"""What the grader adds to a cell whose output says a write failed for lack of space."""


def explain(cell) -> None:
    """Add :data:`NOTE` to a graded cell whose outputs show ``ENOSPC`` ("No space left on device")."""
    text = json.dumps(cell.get("outputs", []))
    if "No space left on device" in text and NOTE.strip() not in text:
        from nbformat.notebooknode import NotebookNode

        cell.outputs.append(NotebookNode({"output_type": "stream", "name": "stderr", "text": NOTE}))


def _own_namespace(libc) -> tuple[int, int]:
    """Enter a mount namespace of our own; return the uid and gid who own the capped folders."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNS | (0 if uid == 0 else _CLONE_NEWUSER)) != 0:
        raise OSError(ctypes.get_errno(), "unshare: cannot make a mount namespace for the capped folders")
    if uid != 0:
        private_network.map_to_itself(uid, gid)
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "cannot make the mounts private")
    return (NOBODY, NOBODY) if uid == 0 else (uid, gid)   # a root grader's sandbox runs as nobody


def _cap(libc, entry: dict, owner: tuple[int, int]) -> None:
    path = entry["path"]
    held = os.open(path, os.O_RDONLY | os.O_DIRECTORY)   # what the folder holds, once covered
    try:
        options = f"size={entry['mb']}m,nr_inodes={entry['files']},mode=0700,uid={owner[0]},gid={owner[1]}"
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"cannot mount a capped folder on {path}")
        try:
            shutil.copytree(f"/proc/self/fd/{held}", path, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:   # the submission's own files are past the caps
            print(f"[distlab.grade.boundary.scratch] not every submitted file fits in {path}: {exc}"[:500], file=sys.stderr)
        if os.getuid() == 0:
            for parent, dirs, files in os.walk(path):
                for name in [parent] + [os.path.join(parent, n) for n in dirs + files]:
                    os.chown(name, *owner, follow_symlinks=False)
    finally:
        os.close(held)


def main(argv: list[str]) -> None:
    spec, command = json.loads(argv[0]), argv[argv.index("--") + 1:]
    libc = ctypes.CDLL(None, use_errno=True)
    owner = _own_namespace(libc)
    for entry in spec:
        _cap(libc, entry, owner)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
