"""Protected files and processes: an audit hook that a student's code cannot remove.

Python calls an audit hook (:pep:`578`, ``sys.addaudithook``) before opening a file, listing a
directory, starting a process, sending a signal, ... Once added, it cannot be removed from
Python code. :func:`protect` installs ours, which refuses:

* any file operation under a protected path (the solutions, the gradebook and the other
  students' folders, the ``.git`` folder that holds every solution ever committed), and on the
  source of every forbidden module (:data:`distlab.grade.boundary.forbid.forbidden_paths`). A relative
  path counts for every folder it could be relative to: the current one, and each folder the
  process holds open, since ``os.open(name, dir_fd=fd)`` tells the hook ``name`` but not ``fd``;
* starting processes beyond ``max_spawns`` (0 on ranks: an exercise never needs one);
* signals to any process but its own descendants (a rank killing torchrun or the grader).

Limits of the approach, said plainly: this guards Python-level access. Code that loads C
functions with ``ctypes`` and makes raw system calls gets past an audit hook; that is why
the grader also runs each rank under resource caps (:mod:`distlab.grade.boundary.limits`), decides
the verdict in a process the student's code never runs in (:mod:`distlab.grade.boundary.cleanroom`),
and starts everything that runs student code inside an operating-system boundary
(:mod:`distlab.grade.boundary.bubblewrap`), where the protected files do not even exist.
"""

from __future__ import annotations

import os
import sys

from distlab.grade.boundary.forbid import NOT_ALLOWED, forbid, forbidden_paths, raiser, replace_everywhere

_FILE_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir",
                "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.link", "os.symlink",
                "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move", "sqlite3.connect",
                "os.chdir", "glob.glob"}
_SPAWN_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                 "os.fork", "os.forkpty", "pty.spawn", "os.startfile"}

_state = {"installed": False, "protected": [], "allowed": [], "spawns_left": None,
          "allow_command": None, "guard_signals": False, "may_kill_self": True}


def _is_descendant(pid: int) -> bool:
    import psutil

    from distlab.runtime.processes import init_of_own_pids

    if init_of_own_pids():   # a rank in its room: all of its namespace but itself is below it
        return pid != 1 and _in_own_pids(pid)
    try:
        return any(p.pid == os.getpid() for p in psutil.Process(pid).parents())
    except psutil.Error:
        return True  # already gone: nothing to protect


def _in_own_pids(pid: int) -> bool:
    """Whether ``pid`` names a process (not a thread) of this process's own process-id namespace."""
    try:
        os.close(os.pidfd_open(pid))
        return True
    except OSError:
        return False


_FOLDER_EVENTS = {"os.chdir", "os.listdir", "os.scandir"}
"""Events that also take an open folder's descriptor instead of a path (``os.fchdir(fd)``, ``os.listdir(fd)``)."""


def _open_folders() -> list[str]:
    """The folders this process holds open: a relative path may be meant against any of them.

    Python's ``os.open(name, dir_fd=fd)`` reports only ``name`` to the audit hook, not ``fd``;
    so a relative path is checked against the current folder *and* every folder a descriptor
    of this process points to (``/proc/self/fd``). The descriptor it names is one of those.
    """
    found = []
    try:
        descriptors = os.listdir("/proc/self/fd")  # an absolute path: its own check ends here
    except OSError:
        return found
    for fd in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and os.path.isdir(target):
            found.append(target)
    return found


def _real_paths(event: str, path) -> list[str]:
    """Every real path ``path`` may name for this event: one if absolute, one per folder if relative."""
    if isinstance(path, int):  # a descriptor: only a folder's lets the code reach further
        if event not in _FOLDER_EVENTS:
            return []
        try:
            return [os.path.realpath(os.readlink(f"/proc/self/fd/{path}"))]
        except OSError:
            return []
    try:
        path = os.fsdecode(path)
    except TypeError:
        return []
    if os.path.isabs(path):
        return [os.path.realpath(path)]
    folders = _open_folders()
    try:
        folders.insert(0, os.getcwd())
    except OSError:  # the current folder was removed
        pass
    return [os.path.realpath(os.path.join(folder, path)) for folder in dict.fromkeys(folders)]


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_path(event: str, raw) -> None:
    for path in _real_paths(event, raw):
        if any(_is_under(path, forbidden) for forbidden in forbidden_paths):
            raise PermissionError(f"{event} on {raw} {NOT_ALLOWED} (the grader protects this file)")
        if any(_is_under(path, a) for a in _state["allowed"]):
            continue
        for root in _state["protected"]:
            if _is_under(path, root):
                raise PermissionError(f"{event} on {raw} {NOT_ALLOWED} (the grader protects {root})")


def _hook(event: str, args) -> None:
    if event in _FILE_EVENTS:
        if event in ("os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"):
            for raw in args[:2]:
                _check_path(event, raw)
        elif args:
            _check_path(event, args[0])
    elif event in ("os.kill", "os.killpg") and _state["guard_signals"]:
        pid = args[0]
        if event == "os.kill" and pid == os.getpid() and _state["may_kill_self"]:
            return
        if pid > 0 and _is_descendant(pid):
            return
        raise PermissionError(f"sending a signal to process {pid} {NOT_ALLOWED} "
                              "(only to processes this one started)")
    elif event in _SPAWN_EVENTS:
        allow = _state["allow_command"]
        if allow is not None and event == "subprocess.Popen" and allow(args):
            return
        left = _state["spawns_left"]
        if left is None:
            return
        if left <= 0:
            raise PermissionError(f"starting a process ({event}) {NOT_ALLOWED}")
        _state["spawns_left"] = left - 1


def deny_files(paths) -> None:
    """Files no file operation may touch, even inside an allowed folder."""
    forbidden_paths.update(os.path.realpath(p) for p in paths)


def protect(paths=(), allowed=(), max_spawns: int | None = None, forbidden=(),
            allow_command=None, guard_signals: bool = True, may_kill_self: bool = True) -> None:
    """Install the guard in this process (once; later calls add to it, never remove).

    Args:
        paths: files or folders no file operation may touch.
        allowed: folders inside those that stay allowed (e.g. the notebook's own folder).
        max_spawns: how many processes this process may start (``None``: no limit).
        forbidden: API names for :func:`forbid`.
        allow_command: optional ``f(popen_args) -> bool``; spawns it accepts are not counted.
        guard_signals: refuse ``os.kill``/``os.killpg`` aimed at anything but this process's
            own descendants (a rank must not kill torchrun, the grader, other students...).
        may_kill_self: whether ``os.kill(os.getpid(), ...)`` stays allowed.
    """
    _state["guard_signals"] = _state["guard_signals"] or guard_signals
    _state["may_kill_self"] = _state["may_kill_self"] and may_kill_self
    _state["protected"] += [os.path.realpath(p) for p in paths]
    _state["allowed"] += [os.path.realpath(p) for p in allowed]
    if max_spawns is not None:
        left = _state["spawns_left"]
        _state["spawns_left"] = max_spawns if left is None else min(left, max_spawns)
    if allow_command is not None:
        _state["allow_command"] = allow_command
    if forbidden:
        forbid(*forbidden)
    if not _state["installed"]:
        sys.addaudithook(_hook)
        _state["installed"] = True


def protect_rank(paths=(), max_spawns: int = 0, forbidden=(), no_nested_runs: bool = True) -> None:
    """The guard of a graded rank (for ``rank_setup(..., when="call")``): JSON arguments only.

    Besides :func:`protect`, ``distlab.run`` is disabled on the rank, under every name that
    reaches it: a rank must not start ranks of its own (a student's "try it" line left in an
    answer cell fails clearly instead).
    """
    if no_nested_runs:
        from distlab.runtime import run

        replace_everywhere({id(run.run): raiser("distlab.run on a rank", " (call it from the notebook, not inside a rank)")})
    protect(paths=paths, max_spawns=max_spawns, forbidden=forbidden, may_kill_self=False)
