"""What a warm pool puts back between two calls, so one call cannot change the next one's result.

A :class:`distlab.Pool` keeps its rank processes alive between calls, so anything a call
changes in a module stays changed. Between calls each rank therefore

* puts back every attribute of the modules and classes below that the call replaced
  (``dist.all_reduce = my_fake``, ``torch.allclose = lambda *a: True``), removes attributes
  a call added to those classes (``torch.Tensor.sum = ...`` shadows the inherited method), and
* restores torch's global settings: number of threads, default dtype, grad mode, and the
  warning filters (a call's ``warnings.filterwarnings("ignore")`` would silence every later one);

and before each call it re-seeds ``random``, ``torch`` and ``numpy`` (see the worker).

The watched modules are the ones below, ``builtins``, and every ``distlab`` module: so a call
that replaces ``builtins.sum`` or ``distlab.models.reference_gradients`` cannot change what a
later call computes with them.

What persists, by design: the process group (that is the point of a pool), imported modules,
CUDA/NCCL state, new attributes a call *added* to a module (importing ``torch.distributed.tensor``
adds one, and removing it would break later imports), subgroups created with ``new_group``,
files written to disk, and any module not watched. The grader runs one student's tests on one
pool per notebook (:mod:`distlab.grade.boundary.cleanroom`): whatever else persists there was done by
that student's own code, on ranks the grader never trusts for a verdict.
"""

from __future__ import annotations

import sys
import warnings

from distlab import chapters

WATCHED_MODULES = (
    "builtins", "torch", "torch.distributed", "torch.distributed.distributed_c10d", "torch.nn",
    "torch.nn.functional", "torch.autograd", "torch.optim", "torch.testing", "numpy", "numpy.testing",
)


PRELOADED = ("distlab.models", "distlab.tools", *chapters.packages(),
             "distlab.grade.checks", "distlab.grade.exercise", "distlab.grade.boundary.safeload", "distlab.grade.boundary.sandbox")
"""distlab modules and packages (every module in them) a pool's ranks import before their
first call: the shared ones, every chapter's reference package (:mod:`distlab.chapters`) and
what the exercises' tests run on ranks. A module first imported *during* a call has no earlier
state to go back to, so what that call did to it would stay; imported beforehand, it is
watched like the others."""


def preloaded_modules() -> list[str]:
    """Every module name :func:`preload` imports: the modules above, and the modules of the packages."""
    import importlib
    import pkgutil

    names = []
    for name in PRELOADED:
        names.append(name)
        module = importlib.import_module(name)
        if hasattr(module, "__path__"):
            names += [info.name for info in pkgutil.walk_packages(module.__path__, prefix=name + ".")]
    return names


def preload() -> None:
    import importlib

    for name in preloaded_modules():
        importlib.import_module(name)


def _targets():
    import types

    import torch

    names = list(WATCHED_MODULES) + sorted(n for n in sys.modules if n == "distlab" or n.startswith("distlab."))
    for name in names:
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType) and not type(module).__name__.startswith("Forbidden"):
            yield name, module
    yield "torch.Tensor", torch.Tensor
    yield "torch.nn.Module", torch.nn.Module


def snapshot() -> dict:
    """Remember the watched attributes and torch's global settings."""
    import torch

    saved = {name: dict(vars(target)) for name, target in _targets()}
    saved["settings"] = (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled())
    saved["warnings"] = warnings.catch_warnings()   # remembers the filters as it enters,
    saved["warnings"].__enter__()                   # puts them back as it exits
    return saved


def restore(saved: dict) -> None:
    """Put back every watched attribute a call replaced, and torch's global settings."""
    import torch

    for name, target in _targets():
        before = saved.get(name)
        if before is None:  # a module first imported during the call: nothing to restore
            continue
        now = vars(target)
        for key, value in before.items():
            if (name, key) in KEPT:
                continue
            if now.get(key, _MISSING) is not value:
                try:
                    setattr(target, key, value)
                except (AttributeError, TypeError):  # read-only slots of C types
                    pass
        if isinstance(target, type):  # on a class, a new attribute shadows an inherited method
            for key in set(now) - set(before):
                delattr(target, key)
    threads, dtype, grad = saved["settings"]
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    saved["warnings"].__exit__(None, None, None)


_MISSING = object()

KEPT = {("torch.distributed.distributed_c10d", "_group_count")}
"""Watched attributes that must keep a call's changes. ``new_group`` names each group by this
counter, and the groups themselves outlive the call: put back, the counter would hand a
later call's ``new_group`` a name already taken (``ValueError: The specified group name has
already been created``)."""
