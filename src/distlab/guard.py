"""What a student's code may not do while it is graded: forbidden APIs, protected files, processes.

Two mechanisms, both installed on every rank by the grader through
``distlab.launch.rank_setup("distlab.guard", "protect", when="call", ...)`` (after the process
group exists, and before the student's function is even unpickled: unpickling looks up every
class and function it refers to, and a lookup made earlier would find the real ones):

1. **Forbidden APIs** (:func:`forbid`): e.g. no ``dist.all_reduce`` in the ring all-reduce
   exercise, no torch DDP in the DDP exercise, no distlab reference implementation in any
   exercise. Each named API is replaced, *everywhere it can be reached from Python*, by a
   function that raises :class:`ForbiddenError` ("... is not allowed in this exercise"):

   * a collective such as ``torch.distributed.all_reduce``: the public function, its twin in
     ``torch.distributed.distributed_c10d``, the method of the ``ProcessGroup`` object that
     it calls (``group.allreduce``), the dispatcher op (``torch.ops.c10d.allreduce_``) and the
     functional collective (``torch.distributed._functional_collectives.all_reduce``);
   * a class such as ``torch.nn.parallel.DistributedDataParallel``: in every module that
     exports it;
   * a module such as ``distlab.collectives``: replaced in ``sys.modules`` (and on its parent
     package) by a module whose every attribute raises, and its source file is protected so it
     cannot be read and executed by hand.

2. **An audit hook** (:pep:`578`, ``sys.addaudithook``): Python calls it before opening a
   file, listing a directory, starting a process, ... Once added, it cannot be removed from
   Python code. Ours refuses:

   * any file operation under a protected path (the solutions, the gradebook and the other
     students' folders, the ``.git`` folder that holds every solution ever committed);
   * starting processes beyond ``max_spawns`` (0 on ranks: an exercise never needs one);
   * signals to any process but its own descendants (a rank killing torchrun or the grader).

Limits of the approach, said plainly: this guards Python-level access. Code that loads C
functions with ``ctypes`` and makes raw system calls gets past an audit hook; that is why
the grader also runs each rank under resource caps (:mod:`distlab.limits`), decides the
verdict in a process the student's code never runs in (:mod:`distlab.grade.cleanroom`), and
checks the gradebook after every submission (:mod:`distlab.grade.gradebook_guard`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

NOT_ALLOWED = "is not allowed in this exercise"


class ForbiddenError(RuntimeError):
    """Raised when the student's code calls something the exercise forbids."""


class ForbiddenAttributeError(ForbiddenError, AttributeError):
    """A forbidden module's special attribute (``__file__``, ``__path__``, ...) was asked for.

    It is also an ``AttributeError`` so that library code that merely *probes* modules, such as
    ``hasattr(module, "__file__")`` in :mod:`inspect` (which torch's optimizers reach), sees "no
    such attribute" and goes on, while a student who asks for the path still reads why not.
    """


# -- forbidden APIs ----------------------------------------------------------------------------

# For each torch.distributed collective: (ProcessGroup method, dispatcher ops, functional twins).
_COLLECTIVE_ALIASES = {
    "all_reduce": ("allreduce", ("c10d.allreduce_", "_c10d_functional.all_reduce",
                                 "_c10d_functional.all_reduce_"), ("all_reduce", "all_reduce_inplace")),
    "all_reduce_coalesced": ("allreduce_coalesced", ("c10d.allreduce_coalesced_",), ()),
    "reduce": ("reduce", ("c10d.reduce_",), ()),
    "broadcast": ("broadcast", ("c10d.broadcast_", "_c10d_functional.broadcast"), ("broadcast",)),
    "all_gather": ("allgather", ("c10d.allgather_", "_c10d_functional.all_gather_into_tensor"),
                   ("all_gather_tensor", "all_gather_into_tensor")),
    "all_gather_into_tensor": ("_allgather_base", ("c10d._allgather_base_",
                                                   "_c10d_functional.all_gather_into_tensor"),
                               ("all_gather_tensor",)),
    "reduce_scatter": ("reduce_scatter", ("c10d.reduce_scatter_",
                                          "_c10d_functional.reduce_scatter_tensor"),
                       ("reduce_scatter_tensor",)),
    "reduce_scatter_tensor": ("_reduce_scatter_base", ("c10d._reduce_scatter_base_",
                                                       "_c10d_functional.reduce_scatter_tensor"),
                              ("reduce_scatter_tensor",)),
    "all_to_all": ("alltoall", ("c10d.alltoall_",), ()),
    "all_to_all_single": ("alltoall_base", ("c10d.alltoall_base_", "_c10d_functional.all_to_all_single"),
                          ("all_to_all_single",)),
    "gather": ("gather", ("c10d.gather_",), ()),
    "scatter": ("scatter", ("c10d.scatter_",), ()),
    # torch 2.13's new names for the single-tensor versions, and the coalesced methods of the
    # process group (a list of tensors in one call): other roads to the same collectives.
    "all_gather_single": ("all_gather_single", (), ()),
    "reduce_scatter_single": ("reduce_scatter_single", (), ()),
    "all_gather_coalesced": ("allgather_coalesced", (), ()),
    "all_gather_into_tensor_coalesced": ("allgather_into_tensor_coalesced", (), ()),
    "all_gather_single_coalesced": ("all_gather_single_coalesced", (), ()),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", (), ()),
    "reduce_scatter_single_coalesced": ("reduce_scatter_single_coalesced", (), ()),
    "send": ("send", ("c10d.send",), ()),
    "recv": ("recv", ("c10d.recv_",), ()),
    "isend": ("send", ("c10d.send",), ()),
    "irecv": ("recv", ("c10d.recv_",), ()),
    "barrier": ("barrier", ("c10d.barrier",), ()),
}


# Forbidding a collective forbids every other spelling of it too.
_SAME_COLLECTIVE = {
    "all_reduce": ("all_reduce_coalesced",),
    "all_gather": ("all_gather_coalesced",),
    "all_gather_into_tensor": ("all_gather_single", "all_gather_into_tensor_coalesced",
                               "all_gather_single_coalesced"),
    "reduce_scatter_tensor": ("reduce_scatter_single", "reduce_scatter_tensor_coalesced",
                              "reduce_scatter_single_coalesced"),
}


def _raiser(name: str, why: str = ""):
    def forbidden(*args, **kwargs):
        raise ForbiddenError(f"{name} {NOT_ALLOWED}{why}")
    forbidden.__name__ = forbidden.__qualname__ = name.rsplit(".", 1)[-1]
    forbidden.__doc__ = f"{name} {NOT_ALLOWED}."
    return forbidden


class _ForbiddenClassMeta(type):
    def __call__(cls, *args, **kwargs):
        raise ForbiddenError(f"{cls.__forbidden_name__} {NOT_ALLOWED}")

    def __getattr__(cls, attr):
        # The class's own constructors and helpers (DTensor.from_local, Function.apply) say why
        # too; an AttributeError as well, so library code that only probes a class goes on.
        raise ForbiddenAttributeError(f"{cls.__forbidden_name__} {NOT_ALLOWED}")


def _forbidden_class(name: str) -> type:
    return _ForbiddenClassMeta(name.rsplit(".", 1)[-1], (), {"__forbidden_name__": name})


class ForbiddenModule(types.ModuleType):
    """Stands in ``sys.modules`` for a forbidden module: every attribute access raises."""

    def __init__(self, name: str):
        super().__init__(name)
        object.__setattr__(self, "_forbidden_name", name)

    def __getattr__(self, attr):
        message = f"{object.__getattribute__(self, '_forbidden_name')} {NOT_ALLOWED}"
        if attr.startswith("__") and attr.endswith("__"):
            raise ForbiddenAttributeError(message)
        raise ForbiddenError(message)


_forbidden_files: set[str] = set()


def _forbid_collective(op: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    try:  # imported before any op is replaced: importing it looks those ops up
        fc = importlib.import_module("torch.distributed._functional_collectives")
    except ImportError:
        fc = None
    name = f"torch.distributed.{op}"
    for module in (dist, c10d):
        if hasattr(module, op):
            setattr(module, op, _raiser(name))
    method, ops, functional = _COLLECTIVE_ALIASES.get(op, (None, (), ()))
    if method is not None:
        from torch._C._distributed_c10d import ProcessGroup

        for cls in [ProcessGroup] + _all_subclasses(ProcessGroup):
            if method in cls.__dict__ or cls is ProcessGroup:
                try:
                    setattr(cls, method, _raiser(f"ProcessGroup.{method} (behind {name})"))
                except (AttributeError, TypeError):
                    pass
    for qualified in ops:
        namespace, opname = qualified.split(".")
        try:
            setattr(getattr(torch.ops, namespace), opname, _raiser(f"torch.ops.{qualified} (behind {name})"))
        except Exception:  # noqa: BLE001 - an op this torch build does not have
            pass
    if functional:
        for fname in functional:
            if fc is not None and hasattr(fc, fname):
                setattr(fc, fname, _raiser(f"torch.distributed._functional_collectives.{fname} (behind {name})"))


def _all_subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


_genuine: dict[str, object] = {}
"""The real module, class or function behind each forbidden name, recorded the first time it
is forbidden in this process. On a warm pool :mod:`distlab.isolation` puts the real object back
into the modules that held it after every call (``distlab.parallel3d.tensor_parallel``), while
``sys.modules`` keeps the stand-in: the next call finds those holders again through this record."""


def _forbid_module(name: str) -> dict[int, object]:
    """Put a stand-in in ``sys.modules`` for a module and its submodules; return what to replace."""
    try:
        module = importlib.import_module(name)
        path = getattr(module, "__file__", None)
        if path:
            _forbidden_files.add(os.path.realpath(path))
    except ImportError:
        pass
    stand_in = ForbiddenModule(name)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if not isinstance(sys.modules[key], ForbiddenModule):
            _genuine.setdefault(key, sys.modules[key])
        sys.modules[key] = stand_in
    return {id(real): stand_in for key, real in _genuine.items() if key == name or key.startswith(name + ".")}


def _forbid_object(name: str) -> dict[int, object]:
    """A class or function given by its dotted name: return its replacement, keyed by the original."""
    module_name, _, attr = name.rpartition(".")
    original = _genuine.setdefault(name, getattr(importlib.import_module(module_name), attr))
    return {id(original): _forbidden_class(name) if isinstance(original, type) else _raiser(name)}


def _replace_everywhere(replacements: dict[int, object]) -> None:
    """Wherever a loaded module holds an original (``from distlab import tensor_parallel``, a
    parent package's attribute, a re-export such as ``torch.distributed.DeviceMesh``, an alias),
    put its stand-in instead: otherwise the original stays one attribute away."""
    for mod in list(sys.modules.values()):
        try:
            for attr, value in list(vars(mod).items()):
                if id(value) in replacements:
                    setattr(mod, attr, replacements[id(value)])
        except Exception:  # noqa: BLE001 - stand-ins and odd modules that refuse vars() or setattr
            continue


def forbid(*names: str) -> None:
    """Make each named API raise :class:`ForbiddenError` from now on, in this process.

    A name is a ``torch.distributed`` collective (``"torch.distributed.all_reduce"``), a class
    or function by its dotted path (``"torch.nn.parallel.DistributedDataParallel"``), or a
    module (``"distlab.collectives"``).
    """
    replacements: dict[int, object] = {}
    for name in names:
        short = name.removeprefix("torch.distributed.").removeprefix("dist.")
        if short in _COLLECTIVE_ALIASES:
            for op in (short,) + _SAME_COLLECTIVE.get(short, ()):
                _forbid_collective(op)
        elif _is_module(name):
            replacements.update(_forbid_module(name))
        else:
            replacements.update(_forbid_object(name))
    _replace_everywhere(replacements)  # one pass over the loaded modules for all the names


def _is_module(name: str) -> bool:
    """Whether a forbidden name is a module (else a class or function)."""
    if name in _genuine:  # forbidden before, on a warm rank (``find_spec`` would ask the stand-in)
        return isinstance(_genuine[name], types.ModuleType)
    if isinstance(sys.modules.get(name), ForbiddenModule):
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


# -- the audit hook: protected paths and processes -----------------------------------------------

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

    try:
        return any(p.pid == os.getpid() for p in psutil.Process(pid).parents())
    except psutil.Error:
        return True  # already gone: nothing to protect


def _resolve(path) -> str | None:
    if isinstance(path, int):
        return None
    try:
        path = os.fsdecode(path)
    except TypeError:
        return None
    return os.path.realpath(path)


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_path(event: str, raw) -> None:
    path = _resolve(raw)
    if path is None:
        return
    if path in _forbidden_files:
        raise PermissionError(f"{event} on {raw} {NOT_ALLOWED} (the grader protects this file)")
    if any(_is_under(path, a) for a in _state["allowed"]):
        return
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
    _forbidden_files.update(os.path.realpath(p) for p in paths)


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

    Besides :func:`protect`, ``distlab.run`` is disabled on the rank: a rank must not start
    ranks of its own (a student's "try it" line left in an answer cell fails clearly instead).
    """
    if no_nested_runs:
        import distlab
        import distlab.launch

        stand_in = _raiser("distlab.run on a rank", " (call it from the notebook, not inside a rank)")
        distlab.run = distlab.launch.run = stand_in
    protect(paths=paths, max_spawns=max_spawns, forbidden=forbidden, may_kill_self=False)
