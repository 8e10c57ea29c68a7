"""Sending functions and values between the notebook and the ranks.

We use cloudpickle: a function defined in a notebook (in ``__main__``) is sent *by value*,
its code, the globals it uses and its closure travel with it, so a rank can run it without
having the notebook. Functions from importable modules (``torch``, ``distlab``, a ``.py``
file next to the notebook) are sent by reference and imported on the rank.

When something cannot be pickled (an open file, a lock, a generator, a live process group),
we say *which* argument, global or closure variable it is, instead of pickle's bare
"cannot pickle '_thread.lock' object".

Tensors coming back from a rank are moved to the CPU (a notebook without GPUs can still
read them) and detached from autograd (a graph cannot travel between processes).
"""

from __future__ import annotations

import io
import pickle
import sys

import cloudpickle


class NotPicklableError(TypeError):
    """Something handed to :func:`distlab.run` cannot be sent to another process."""


def why_not_picklable(value) -> str | None:
    """Why ``value`` cannot be pickled, or ``None`` if it can."""
    try:
        cloudpickle.dumps(value)
        return None
    except Exception as exc:  # pickling can fail with almost any exception type
        return f"{type(exc).__name__}: {exc}"


def _culprits_in_function(fn) -> list[str]:
    """Name the globals and closure variables of ``fn`` that cannot be pickled."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = []
    fn_globals = getattr(fn, "__globals__", {})
    names = set(code.co_names)
    for const in code.co_consts:  # names used by nested functions and comprehensions
        if hasattr(const, "co_names"):
            names.update(const.co_names)
    for name in sorted(names):
        if name in fn_globals:
            why = why_not_picklable(fn_globals[name])
            if why:
                found.append(f"the global variable `{name}` ({type(fn_globals[name]).__name__}): {why}")
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        why = why_not_picklable(value)
        if why:
            found.append(f"the closure variable `{name}` ({type(value).__name__}): {why}")
    return found


def dumps_call(fn, args: tuple, kwargs: dict) -> bytes:
    """Pickle ``(fn, args, kwargs)`` for the ranks, or raise :class:`NotPicklableError` naming the culprit."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        problems = []
        if why_not_picklable(fn):
            inner = _culprits_in_function(fn)
            name = getattr(fn, "__qualname__", repr(fn))
            problems += [f"function `{name}` uses {c}" for c in inner] or [f"the function `{name}`: {why_not_picklable(fn)}"]
        for i, arg in enumerate(args):
            why = why_not_picklable(arg)
            if why:
                problems.append(f"positional argument {i} ({type(arg).__name__}): {why}")
        for key, arg in kwargs.items():
            why = why_not_picklable(arg)
            if why:
                problems.append(f"keyword argument `{key}` ({type(arg).__name__}): {why}")
        detail = "; ".join(problems) or f"{type(exc).__name__}: {exc}"
        raise NotPicklableError(
            "distlab cannot send this call to the ranks, because it cannot be pickled: "
            f"{detail}. Create such objects inside the function instead (each rank makes its own)."
        ) from exc


def _same(value):
    return value


class _ResultPickler(cloudpickle.Pickler):
    """Pickles a rank's result; tensors travel detached and on the CPU."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            needs_detach = obj.requires_grad and obj.grad_fn is not None
            if needs_detach or obj.device.type not in ("cpu", "meta"):
                return _same, (obj.detach().cpu(),)
        return super().reducer_override(obj)


def dumps_result(value) -> bytes:
    buffer = io.BytesIO()
    _ResultPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


loads = pickle.loads
