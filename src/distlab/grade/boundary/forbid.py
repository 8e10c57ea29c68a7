"""Forbidden APIs: what an exercise switches off while a student's code runs on a rank.

E.g. no ``dist.all_reduce`` in the ring all-reduce exercise, no torch DDP in the DDP
exercise, no distlab reference implementation in any exercise. :func:`forbid` replaces each
named API, *everywhere it can be reached from Python*, by something that raises
:class:`ForbiddenError` ("... is not allowed in this exercise"):

* a collective such as ``torch.distributed.all_reduce``: at every layer that can send, from
  the public function down to the process group's and the backend's methods and the
  dispatcher's kernels (:mod:`.forbid_collectives`);
* a class or function such as ``torch.nn.parallel.DistributedDataParallel``: in every loaded
  module that holds it (its own, a re-export, an alias);
* a module or package such as ``distlab.collectives``: it and every module in it are replaced
  in ``sys.modules`` by a stand-in whose every attribute raises; every other loaded module
  that holds one of them, *or any class or function defined in them*
  (``from distlab.tensor_parallel.model import parallelize_gpt`` in chapter 7's code), gets a
  raising stand-in instead; and their source files are protected (:mod:`.protect`) so they
  cannot be read and executed by hand.

The grader installs it on every rank through :func:`distlab.grade.boundary.protect.protect_rank`,
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


_originals: dict[str, dict[int, tuple]] = {}
"""What was forbidden in this process, by name: ``{id(original): (fingerprint, kind, label)}``
for the module or object itself and, for a module, every class and function defined in it.

Only ids and descriptions, never the objects: a record of the real modules would hand them to
the very code they are forbidden to (``forbid._originals["distlab.collectives"]``). On a warm
pool :mod:`distlab.runtime.isolation` puts the real objects back into the modules that held
them after every call (``distlab.parallel3d.train.parallelize_gpt``), while ``sys.modules``
keeps the stand-in: the next call finds those holders again by id. The fingerprint (type,
module, name) makes sure an id that a dead object left behind and a new object took is not
mistaken for it."""


def _fingerprint(obj) -> tuple:
    return (type(obj).__name__, getattr(obj, "__module__", None), getattr(obj, "__qualname__", None),
            getattr(obj, "__name__", None))


def _remember(key: str, obj, kind: str, label: str) -> None:
    _originals.setdefault(key, {})[id(obj)] = (_fingerprint(obj), kind, label)


def _stand_in(kind: str, label: str, module_stand_in=None):
    if kind == "module":
        return module_stand_in
    return _forbidden_class(label) if kind == "class" else raiser(label)


def _forbid_module(name: str) -> dict[int, tuple]:
    """Put a stand-in in ``sys.modules`` for a module and every module in it; return what to replace.

    The replacements cover the modules themselves and every class and function *defined* in
    them, so that no other module keeps one within reach.
    """
    if name not in _originals:
        _import_whole(name)
    stand_in = ForbiddenModule(name)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        real = sys.modules[key]
        if not isinstance(real, ForbiddenModule) and key not in _originals:
            _remember_module(key, real)
        sys.modules[key] = stand_in
    replacements: dict[int, tuple] = {}
    for key, originals in _originals.items():
        if key == name or key.startswith(name + "."):
            for ident, (fingerprint, kind, label) in originals.items():
                replacements[ident] = (fingerprint, _stand_in(kind, label, stand_in))
    return replacements


def _remember_module(key: str, module: types.ModuleType) -> None:
    """Record a real module, what is defined in it, and its source file (now protected)."""
    _remember(key, module, "module", key)
    path = getattr(module, "__file__", None)
    if path:
        forbidden_paths.add(os.path.realpath(os.path.dirname(path) if hasattr(module, "__path__") else path))
    for attr, value in vars(module).items():
        if (inspect.isfunction(value) or isinstance(value, type)) and getattr(value, "__module__", None) == key:
            _remember(key, value, "class" if isinstance(value, type) else "function", f"{key}.{attr}")


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


def _forbid_object(name: str) -> dict[int, tuple]:
    """A class or function given by its dotted name: return its replacement, keyed by the original."""
    if name not in _originals:
        module_name, _, attr = name.rpartition(".")
        original = getattr(importlib.import_module(module_name), attr)
        _remember(name, original, "class" if isinstance(original, type) else "function", name)
    return {ident: (fingerprint, _stand_in(kind, label)) for ident, (fingerprint, kind, label)
            in _originals[name].items()}


def replace_everywhere(replacements: dict[int, object]) -> None:
    """Wherever a loaded module holds an original (``from distlab import tensor_parallel``, a
    parent package's attribute, a re-export such as ``torch.distributed.DeviceMesh``, an alias),
    put its stand-in instead: otherwise the original stays one attribute away.

    ``replacements`` maps ``id(original)`` to its stand-in, or to ``(fingerprint, stand-in)``
    when the original is known by its id only (see :data:`_originals`)."""
    for mod in list(sys.modules.values()):
        try:
            for attr, value in list(vars(mod).items()):
                replacement = replacements.get(id(value))
                if replacement is None:
                    continue
                if isinstance(replacement, tuple):
                    fingerprint, replacement = replacement
                    if _fingerprint(value) != fingerprint:
                        continue
                setattr(mod, attr, replacement)
        except Exception:  # noqa: BLE001 - stand-ins and odd modules that refuse vars() or setattr
            continue


def forbid(*names: str) -> None:
    """Make each named API raise :class:`ForbiddenError` from now on, in this process.

    A name is a ``torch.distributed`` collective (``"torch.distributed.all_reduce"``), a class
    or function by its dotted path (``"torch.nn.parallel.DistributedDataParallel"``), or a
    module (``"distlab.collectives"``).
    """
    from distlab.grade.boundary.forbid_collectives import COLLECTIVES, forbid_collective

    replacements: dict[int, tuple] = {}
    for name in names:
        short = name.removeprefix("torch.distributed.").removeprefix("dist.")
        if short in COLLECTIVES:
            forbid_collective(short, raiser)
        elif _is_module(name):
            replacements.update(_forbid_module(name))
        else:
            replacements.update(_forbid_object(name))
    replace_everywhere(replacements)  # one pass over the loaded modules for all the names


def _is_module(name: str) -> bool:
    """Whether a forbidden name is a module (else a class or function)."""
    if name in _originals:  # forbidden before, on a warm rank (``find_spec`` would ask the stand-in)
        return any(kind == "module" for _, kind, _ in _originals[name].values())
    if isinstance(sys.modules.get(name), ForbiddenModule):
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False
