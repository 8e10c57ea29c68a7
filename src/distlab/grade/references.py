"""Grading a task on its own: a later task runs with the reference of the earlier tasks it calls.

An exercise's Task 2 often calls Task 1 (an ``OverlappedDDP`` broadcasts with Task 1's
``broadcast_parameters``). Checked with the student's own Task 1, one bug would cost the
points of both tasks. The test of the later task gives the reference of the earlier ones (in
a hidden block of its test cell), and :func:`using_references` installs them for the call.
Part of :mod:`distlab.grade.checks`'s API (``checks.using_references``).
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def using_references(yours, references: dict | None):
    """Your functions and classes, ready to call on this rank, with the names of earlier tasks
    they use (``references``: name -> the instructor's version) looked up as the reference.

    So a later task is graded on its own: an ``OverlappedDDP`` whose ``__init__`` calls Task 1's
    ``broadcast_parameters`` is checked with a correct broadcast, and a bug in Task 1 costs
    Task 1's points only. With no references, your own versions are used (a student's notebook
    runs its visible tests with the student's own earlier tasks).

    In the grader your code arrives as a :class:`~distlab.grade.boundary.sandbox.StudentFunction`, which
    defines it in a namespace of its own with the references set over your names; an object
    defined in your notebook has its module globals patched for the duration and restored.
    """
    references = dict(references or {})
    resolved, patched = [], []
    for obj in yours:
        if type(obj).__name__ == "StudentFunction":
            resolved.append(obj.resolve(references))
            continue
        resolved.append(obj)
        namespace = _globals_of(obj)
        if namespace is not None and references and all(namespace is not g for g, _ in patched):
            patched.append((namespace, {name: namespace.get(name, _MISSING) for name in references}))
    for namespace, _ in patched:
        namespace.update(references)
    try:
        yield resolved
    finally:
        for namespace, before in patched:
            for name, value in before.items():
                if value is _MISSING:
                    namespace.pop(name, None)
                else:
                    namespace[name] = value


_MISSING = object()


def _globals_of(obj) -> dict | None:
    """The module globals a function, or a class's methods, look names up in."""
    import inspect

    if inspect.isfunction(obj):
        return obj.__globals__
    if inspect.isclass(obj):
        for member in vars(obj).values():
            function = getattr(member, "__func__", member)
            if inspect.isfunction(function):
                return function.__globals__
    return None
