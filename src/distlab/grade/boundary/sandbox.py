"""What runs on a rank when the grader calls a student's function: the student's cells, then the call.

The clean room (:mod:`distlab.grade.boundary.cleanroom`) never runs student code itself. Where a test
says ``distlab.run(my_rank, nprocs=4)``, ``my_rank`` is a :class:`StudentFunction`: a small
picklable object holding the *source* of the student's cells and the function's name. On
each rank, calling it

1. runs those cells (the ones above the test cell, as the kernel did) in a fresh namespace,
   each with a time limit and with its exceptions caught, like a notebook that goes on
   after a failing cell;
2. looks the name up and calls the function with the test's arguments.

The clean room sends every call to the ranks through :func:`encoded_call`, so the value that
travels back is marked plain data (:func:`distlab.grade.boundary.safeload.encode`), the only form the
grader reads.

The rank is already capped (:mod:`distlab.grade.boundary.limits`) and guarded (:mod:`distlab.grade.boundary.protect`) when
this runs: whatever the cells do, they do it on the rank, not in the grader.
"""

from __future__ import annotations

import hashlib
import signal
import traceback

from distlab.grade.boundary import safeload

CELL_TIME_LIMIT_S = 10.0
"""Seconds one answer cell may take at module level on a rank (answer cells define functions)."""


class CellTimeout(Exception):
    pass


_namespaces: dict[str, tuple[dict, list[str]]] = {}
_timed_out: set[str] = set()
"""Cells (by source hash) that already ran past the limit on this rank: a notebook's tests run
the student's cells again for each task, and a cell that sleeps at the top level would cost
the limit every time. It is not run again; it counts as timed out, with what it defined lost."""


def _transform(source: str) -> str:
    """IPython syntax (``%magic``, ``!shell``) becomes plain Python calls; plain Python is kept."""
    try:
        compile(source, "<cell>", "exec")
        return source
    except SyntaxError:
        try:
            from IPython.core.inputtransformer2 import TransformerManager
        except ImportError:
            return source
        return TransformerManager().transform_cell(source)


def _on_alarm(signum, frame):
    raise CellTimeout(f"the cell ran longer than {CELL_TIME_LIMIT_S:g} s")


def _one_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def run_cells(cells: list[str], given: dict | None = None) -> tuple[dict, list[str]]:
    """Run the cells in a fresh ``__main__``-like namespace; return it and the problems met.

    ``given`` names are set *after* the cells ran, over whatever the student defined under
    those names: a later task's code then calls the instructor's version of an earlier task
    (see :func:`distlab.grade.checks.using_references`). Such a namespace is kept apart from
    the plain one.
    """
    given = dict(given or {})
    key = hashlib.sha256("\x00".join(cells + sorted(given)).encode()).hexdigest()
    if key in _namespaces:
        return _namespaces[key]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    problems = []
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for index, source in enumerate(cells):
            digest = hashlib.sha256(source.encode()).hexdigest()
            if digest in _timed_out:
                again = CellTimeout(f"the cell ran longer than {CELL_TIME_LIMIT_S:g} s "
                                    "(in an earlier run of these tests; not run again)")
                problems.append(f"cell {index}: {_one_line(again)}")
                continue
            try:
                code = compile(_transform(source), f"<cell {index}>", "exec")
                signal.setitimer(signal.ITIMER_REAL, CELL_TIME_LIMIT_S)
                try:
                    exec(code, namespace)  # noqa: S102 - student code, on a capped and guarded rank
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the notebook goes on
                if isinstance(exc, CellTimeout):
                    _timed_out.add(digest)
                problems.append(f"cell {index}: {_one_line(exc)}")
    finally:
        signal.signal(signal.SIGALRM, previous)
    namespace.update(given)
    _namespaces[key] = (namespace, problems)
    return namespace, problems


class StudentFunction:
    """Stands for the function ``name`` defined by ``cells``; calling it runs it (on a rank)."""

    def __init__(self, cells: list[str], name: str):
        self.cells, self.name = list(cells), name

    def __repr__(self) -> str:
        return f"<your function {self.name}>"

    def resolve(self, given: dict | None = None):
        """The student's object, defined on this rank; ``given`` replaces names it looks up."""
        namespace, problems = run_cells(self.cells, given)
        fn = namespace.get(self.name)
        if fn is None:
            detail = f" (errors while running your cells: {'; '.join(problems)})" if problems else ""
            raise NameError(f"`{self.name}` is not defined by the cells above this test{detail}")
        if not callable(fn):
            raise TypeError(f"`{self.name}` should be a function, got {type(fn).__name__}")
        return fn

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


def encoded_call(fn, *args, **kwargs) -> bytes:
    """Call ``fn`` on this rank and return its result as marked plain data.

    The clean room hands every ``distlab.run`` to the ranks through this function, so what
    comes back is data the grader can read safely, whatever the student's code returned.
    """
    return safeload.encode(fn(*args, **kwargs))


def fetch_values(cells: list[str]) -> dict:
    """Run the cells and return their top-level names: plain data, or what else they are.

    Used for concept questions (``answer = "b"``): the clean room asks a one-rank run for
    the values instead of running the cell itself.
    """
    import types

    namespace, _ = run_cells(cells)
    found = {}
    for name, value in namespace.items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            found[name] = "callable"
            continue
        try:
            safeload.encode(value)  # only plain data goes back (encoded_call encodes it all)
            found[name] = value
        except Exception:  # noqa: BLE001
            found[name] = f"not plain data ({type(value).__name__})"
    return found
