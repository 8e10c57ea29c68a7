"""Forbidden APIs: what an exercise switches off while a student's code runs on a rank.

E.g. no ``dist.all_reduce`` in the ring all-reduce exercise, no torch DDP in the DDP
exercise, no distlab reference implementation in any exercise. :func:`forbid` replaces each
named API, *everywhere it can be reached from Python*, by something that raises
:class:`ForbiddenError` ("... is not allowed in this exercise"):

* a collective such as ``torch.distributed.all_reduce``: the public function, its twin in
  ``torch.distributed.distributed_c10d``, the method of the ``ProcessGroup`` object that
  it calls (``group.allreduce``), the dispatcher op (``torch.ops.c10d.allreduce_``) and the
  functional collective (``torch.distributed._functional_collectives.all_reduce``);
* a class or function such as ``torch.nn.parallel.DistributedDataParallel``: in every loaded
  module that holds it (its own, a re-export, an alias);
* a module or package such as ``distlab.collectives``: it and every module in it are replaced
  in ``sys.modules`` by a stand-in whose every attribute raises; every other loaded module
  that holds one of them, *or any class or function defined in them*
  (``from distlab.tensor_parallel.model import parallelize_gpt`` in chapter 7's code), gets a
  raising stand-in instead; and their source files are protected (:mod:`.protect`) so they
  cannot be read and executed by hand.

The grader installs it on every rank through :func:`distlab.grade.protect.protect_rank`,
after the process group exists and before the student's function is even unpickled:
unpickling looks up every class and function it refers to, and a lookup made earlier would
find the real ones.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
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


def raiser(name: str, why: str = ""):
    """A function that raises :class:`ForbiddenError` naming ``name`` (and ``why``), whatever its arguments."""

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


forbidden_paths: set[str] = set()
"""Source files and package folders of forbidden modules (:mod:`.protect` refuses every file
operation on them)."""


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
            setattr(module, op, raiser(name))
    method, ops, functional = _COLLECTIVE_ALIASES.get(op, (None, (), ()))
    if method is not None:
        from torch._C._distributed_c10d import ProcessGroup

        for cls in [ProcessGroup] + _all_subclasses(ProcessGroup):
            if method in cls.__dict__ or cls is ProcessGroup:
                try:
                    setattr(cls, method, raiser(f"ProcessGroup.{method} (behind {name})"))
                except (AttributeError, TypeError):
                    pass
    for qualified in ops:
        namespace, opname = qualified.split(".")
        try:
            setattr(getattr(torch.ops, namespace), opname, raiser(f"torch.ops.{qualified} (behind {name})"))
        except Exception:  # noqa: BLE001 - an op this torch build does not have
            pass
    if functional:
        for fname in functional:
            if fc is not None and hasattr(fc, fname):
                setattr(fc, fname, raiser(f"torch.distributed._functional_collectives.{fname} (behind {name})"))


def _all_subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


_genuine: dict[str, object] = {}
"""The real module, class or function behind each forbidden name, recorded the first time it
is forbidden in this process. On a warm pool :mod:`distlab.runtime.isolation` puts the real object
back into the modules that held it after every call (``distlab.parallel3d.train.parallelize_gpt``),
while ``sys.modules`` keeps the stand-in: the next call finds those holders again through this record."""


def _forbid_module(name: str) -> dict[int, object]:
    """Put a stand-in in ``sys.modules`` for a module and every module in it; return what to replace.

    The replacements cover the modules themselves and every class and function *defined* in
    them, so that no other module keeps one within reach.
    """
    if name not in _genuine:
        _import_whole(name)
    stand_in = ForbiddenModule(name)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        if not isinstance(sys.modules[key], ForbiddenModule):
            _genuine.setdefault(key, sys.modules[key])
        sys.modules[key] = stand_in
    replacements: dict[int, object] = {}
    for key, real in _genuine.items():
        if not (key == name or key.startswith(name + ".")) or not isinstance(real, types.ModuleType):
            continue
        replacements[id(real)] = stand_in
        path = getattr(real, "__file__", None)
        if path:
            forbidden_paths.add(os.path.realpath(os.path.dirname(path) if hasattr(real, "__path__") else path))
        for attr, value in vars(real).items():
            if (inspect.isfunction(value) or isinstance(value, type)) and getattr(value, "__module__", None) == key:
                replacements[id(value)] = (_forbidden_class if isinstance(value, type) else raiser)(f"{key}.{attr}")
    return replacements


def _import_whole(name: str) -> None:
    """Import a module, and if it is a package, every module in it (so that all are known)."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=name + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module that cannot load is no road to the reference either
            continue


def _forbid_object(name: str) -> dict[int, object]:
    """A class or function given by its dotted name: return its replacement, keyed by the original."""
    module_name, _, attr = name.rpartition(".")
    original = _genuine.setdefault(name, getattr(importlib.import_module(module_name), attr))
    return {id(original): _forbidden_class(name) if isinstance(original, type) else raiser(name)}


def replace_everywhere(replacements: dict[int, object]) -> None:
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
    replace_everywhere(replacements)  # one pass over the loaded modules for all the names


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
