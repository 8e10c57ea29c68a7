"""The clean room: run a notebook's test cells in a process that never runs student code.

``python -m distlab.grade.boundary.cleanroom VERDICT_FD``, started by the nbgrader plugin
:class:`distlab.grade.pipeline.nbplugins.CleanRoomTests` once per notebook, in a fresh temporary
folder. The job comes on its standard input, a pipe from the grader: the notebook's cells
(the student's, as submitted) and, from the gradebook, the instructor's locked cells and
test cells. For every test cell, in order:

1. The instructor's locked cells above it (imports, helpers) run *here*: they are trusted.
2. The test cell runs here too, in a namespace where every name the student defined is a
   stand-in: a function becomes a :class:`~distlab.grade.boundary.sandbox.StudentFunction` (its cells
   run on the ranks, never here), a value (a concept question's answer) is fetched from a
   one-rank run as plain data. Builtins and the instructor's names cannot be shadowed.
3. Every ``distlab.run`` goes through :func:`distlab.grade.boundary.sandbox.encoded_call` under the
   instructor's caps and the guard, each rank in a room of its own (:mod:`distlab.grade.boundary.rank_room`),
   its results read back with the data-only loader (:mod:`distlab.grade.boundary.safeload`). The ranks stay warm between the runs of
   one notebook (:class:`WarmRanks`); a run that hung or broke a collective gets new ones.
4. The verdict (passed or not) and the cell's output, made safe to show, are recorded.

The bytes each run puts on the wire are counted here too, by the operating system, on the
sandbox's private loopback (:mod:`distlab.grade.boundary.wire`): a test that limits the bytes a rank
sends checks that count as well as the ranks' own record, which their code can edit.

Where a test runs its ranks on the relay (``checks.run_ranks(..., network="relay")``, chapters
0, 2 and 3), this process is their network: each rank's only link to the others is one end of
a socket pair whose other end a router thread here serves (:mod:`distlab.relay`), and the test
reads that router's record of every message and collective, which no rank can reach: it lives
in this process's memory, and this process is not dumpable.

Nothing the student's kernel did reaches this process, so monkey-patching ``torch.allclose``
or ``distlab.grade.checks`` there, or silencing tracebacks, changes nothing here. Hidden tests
draw their inputs from a seed chosen here (:mod:`distlab.grade.boundary.seed`); the relay's
seed, when the instructor grades with one, comes in the job, never in this process's
environment, which its ranks would inherit (:mod:`distlab.relay.schedule`).

When everything is done, every process left below this one is killed (this process is a
child subreaper, so escaped grandchildren are below it too), and only then is the verdict
written, to descriptor ``VERDICT_FD``: the write end of another pipe of the grader.

Why pipes and not files: the ranks run the student's code as the same user as this process,
in the same folder. A verdict file there could be written first by a rank (the grader once
read one forged that way), and a job file could be read. A pipe's ends are descriptors: the
ranks never get them (the job's is replaced by ``/dev/null`` once read, the verdict's is not
inherited), and this process is not dumpable (:func:`distlab.grade.boundary.limits.make_undumpable`),
so a rank cannot reach them through ``/proc/<pid>/fd`` either, nor read the hidden tests from
``/proc/<pid>/mem``. The grader also takes a verdict only from a clean room that exited with
status 0: a rank that kills it leaves its notebook without one.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import os
import re
import signal
import sys
import time
import traceback

from distlab.grade.boundary.warm_ranks import LAUNCHER, WarmRanks  # noqa: F401 - part of this module's API

OUTPUT_LIMIT_CHARS = 20_000
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
GENERIC_HIDDEN_MESSAGE = "a hidden test failed (hidden tests check more cases than the visible ones)"


class TestCellTimeout(Exception):
    pass


def _top_level_definitions(cells: list[str]) -> set[str]:
    """Names bound by ``def`` at the top level of the cells (they become StudentFunctions)."""
    from distlab.grade.boundary.sandbox import _transform

    names = set()
    for source in cells:
        try:
            tree = ast.parse(_transform(source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
    return names


class TestNamespace(dict):
    """The test cell's globals: instructor names first, then builtins, then the student's names.

    A name the test uses but nobody trusted defined is looked up in the student's cells
    (``__missing__``), as a stand-in: never as the student's object itself.
    """

    def __init__(self):
        super().__init__(__name__="__distlab_test__", __builtins__=builtins)
        self.student_cells: list[str] = []
        self._values: dict[str, dict] = {}
        self.values_nprocs = lambda: 1  # how many ranks the values run takes (a warm size is free)
        self.values_backend = lambda: None  # and on which backend (the relay's pool may be the warm one)

    def __missing__(self, name):
        if hasattr(builtins, name) or name.startswith("__"):
            raise KeyError(name)
        from distlab.grade.boundary.sandbox import StudentFunction

        cells = self.student_cells
        if name in _top_level_definitions(cells):
            return StudentFunction(cells, name)
        values = self._student_values(cells)
        if name not in values:
            raise KeyError(name)
        value = values[name]
        if value == "callable":
            return StudentFunction(cells, name)
        if isinstance(value, str) and value.startswith("not plain data"):
            raise NameError(f"`{name}` is {value}; the grader reads answers as plain data "
                            "(numbers, strings, lists, tensors)")
        return value

    def _student_values(self, cells):
        key = "\x00".join(cells)
        if key not in self._values:
            import distlab
            from distlab.grade.boundary import sandbox

            self._values[key] = distlab.run(sandbox.fetch_values, cells, nprocs=self.values_nprocs(),
                                            backend=self.values_backend(), timeout=60)[0]
        return self._values[key]


def _hidden_lines(source: str) -> set[int]:
    """1-based line numbers inside ``### BEGIN/END HIDDEN TESTS`` blocks (markers included)."""
    hidden, inside = set(), False
    for number, line in enumerate(source.splitlines(), start=1):
        if HIDDEN_BEGIN in line:
            inside = True
        if inside:
            hidden.add(number)
        if HIDDEN_END in line:
            inside = False
    return hidden


def redact(text: str, hidden_source: list[str]) -> str:
    """Remove any line of hidden-test code that appears in ``text``."""
    for line in hidden_source:
        line = line.strip()
        if len(line) >= 8 and line in text:
            text = text.replace(line, "[hidden test code]")
    return text


def _describe_failure(exc: BaseException, grade_id: str, source: str) -> str:
    """One safe line: the exception, or a generic message when a hidden assert failed."""
    from distlab.grade.failures import CheckFailed

    filename = f"<test {grade_id}>"
    line_in_test = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == filename:
            line_in_test = lineno
    hidden = line_in_test in _hidden_lines(source)
    hidden_source = [source.splitlines()[n - 1] for n in sorted(_hidden_lines(source))]
    name = type(exc).__name__
    message = str(exc)
    from distlab.runtime.errors import RankError

    if isinstance(exc, RankError):
        message = _student_view(exc)
    if hidden and isinstance(exc, AssertionError) and not isinstance(exc, CheckFailed):
        message = GENERIC_HIDDEN_MESSAGE
    text = f"{name}: {message}" if message else name
    return redact(text, hidden_source)


def _student_view(exc) -> str:
    """A RankError's message with only the student's frames (``<cell N>``) left in its traceback."""
    lines = [f"rank {exc.rank} raised {exc.exc_type}: {exc.remote_message}"]
    frames = re.split(r"(?m)^(?=  File )", exc.remote_traceback or "")
    mine = [f.rstrip() for f in frames if f.startswith('  File "<cell')]
    if mine:
        lines += ["", f"Traceback on rank {exc.rank} (your code):"] + mine
    lines += [f"(rank {r} failed afterwards: {s})" for r, s in sorted(exc.others.items())]
    return "\n".join(lines)


def _run_test_cell(namespace: TestNamespace, grade_id: str, source: str, timeout: float) -> dict:
    captured = io.StringIO()

    def on_alarm(signum, frame):
        raise TestCellTimeout(f"the test cell ran longer than {timeout:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    error = None
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            exec(compile(source, f"<test {grade_id}>", "exec"), namespace)  # noqa: S102 - instructor code
    except BaseException as exc:  # noqa: BLE001 - every failure is a verdict, not a crash
        error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    hidden_source = [source.splitlines()[n - 1] for n in sorted(_hidden_lines(source))]
    text = redact(captured.getvalue(), hidden_source)
    if len(text) > OUTPUT_LIMIT_CHARS:
        text = text[:OUTPUT_LIMIT_CHARS] + f"\n... ({len(text) - OUTPUT_LIMIT_CHARS} more characters not shown)\n"
    outputs = []
    if text:
        outputs.append({"output_type": "stream", "name": "stdout", "text": text})
    if error is not None:
        line = _describe_failure(error, grade_id, source)
        outputs.append({"output_type": "error", "ename": type(error).__name__,
                        "evalue": line.split(": ", 1)[-1] if ": " in line else "",
                        "traceback": [line, "(this test ran in the grader's clean room, outside your kernel)"]})
    return {"passed": error is None, "outputs": outputs}


SPARE_AGENTS = 3
"""Spare agents forked at the start: a notebook's tests start one pool per world size they use
(usually two or three) and a new one after a call that broke its ranks; past these, an agent
starts as a new process."""



def grade(job: dict) -> dict:
    """Run every test cell of the job's notebook; return ``{grade_id: {"passed", "outputs"}}``."""
    import distlab
    from distlab.grade.boundary import rank_room, safeload, sandbox, seed
    from distlab.relay import schedule
    from distlab.runtime import options, serialize
    from distlab.runtime import run as run_module

    seed.draw_fresh()
    schedule.choose(job.get("relay_seed"))   # the relay's delays: the seed only this process knows
    serialize.loads = safeload.loads  # results of student code: data only (see safeload)
    real_run = run_module.run
    caps = job["caps"]
    limits_step = {"module": "distlab.grade.boundary.limits", "function": "apply", "when": "start", "kwargs": caps}
    once = rank_room.around([limits_step])   # each rank in a room of its own
    warm = WarmRanks(once, max_age_s=(caps.get("wall_s") or 600) / 2)

    def run_encoded(fn, *args, **kwargs):
        nprocs, backend = kwargs.get("nprocs", 2), kwargs.get("backend")
        plain = all(kwargs.get(k) in (None, "auto") for k in ("threads", "launcher")) \
            and backend in (None, "auto", "relay")
        if plain and isinstance(nprocs, int) and 1 <= nprocs <= 8:
            warm.ready(nprocs, "relay" if backend == "relay" else None)  # else: cold ranks, same caps
            kwargs["backend"] = "relay" if backend == "relay" else None
            kwargs["launcher"] = LAUNCHER  # the warm pool's: distlab.run picks it by launcher too
        return real_run(sandbox.encoded_call, fn, *args, **kwargs)

    distlab.run = run_module.run = run_encoded

    guard = {"paths": job["protected"] + [os.getcwd()], "max_spawns": 0, "forbidden": job.get("forbidden", [])}
    trusted = {c["grade_id"]: c["source"] for c in job["trusted_cells"]}
    tests = {c["grade_id"]: c["source"] for c in job["test_cells"]}
    namespace = TestNamespace()
    namespace.values_nprocs = warm.smallest_running
    namespace.values_backend = warm.backend_of_smallest
    student_cells, verdicts = [], {}
    for cell in job["cells"]:
        grade_id = cell.get("grade_id")
        if grade_id in tests:
            namespace.student_cells = list(student_cells)
            start = time.monotonic()
            with options.setup_steps(once), \
                    options.rank_setup("distlab.grade.boundary.protect", "protect_rank", when="call", **guard):
                verdicts[grade_id] = _run_test_cell(namespace, grade_id, tests[grade_id], job["test_timeout"])
            verdicts[grade_id]["seconds"] = round(time.monotonic() - start, 2)
            print(f"[clean room] {grade_id}: {'passed' if verdicts[grade_id]['passed'] else 'FAILED'} "
                  f"({verdicts[grade_id]['seconds']} s)", file=sys.stderr, flush=True)
            continue
        if grade_id in trusted:  # the instructor's locked cell: run here, and on the ranks
            source = trusted[grade_id]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(source, f"<locked {grade_id}>", "exec"), namespace)  # noqa: S102
            except Exception as exc:  # noqa: BLE001
                print(f"[clean room] locked cell {grade_id} raised {exc!r}", file=sys.stderr)
            student_cells.append(source)
        else:
            student_cells.append(cell["source"])
    warm.stop()
    for grade_id in tests:  # a test cell missing from the notebook fails
        verdicts.setdefault(grade_id, {"passed": False, "outputs": [], "seconds": 0})
    return verdicts


def main(argv: list[str]) -> int:
    """``python -m distlab.grade.boundary.cleanroom VERDICT_FD``: the job on standard input, the verdict
    written to descriptor ``VERDICT_FD`` (both pipes of the grader, see the module docstring)."""
    from distlab.grade.boundary import bubblewrap, limits, wire
    from distlab.runtime.launchers import forked, spares

    verdict_fd = int(argv[0])
    limits.make_undumpable()             # before the hidden tests are in memory
    forked.preload(pool=True)            # what every agent imports: the spares share it
    spares.keep(SPARE_AGENTS)            # before the job is read: they copy no secret
    if bubblewrap.enabled():             # alone on its own loopback: the bytes on it are the ranks'
        wire.start_metering()
    os.set_inheritable(verdict_fd, False)  # the ranks it starts do not get the verdict's pipe
    limits.become_subreaper()
    job = json.loads(sys.stdin.buffer.read())
    nothing = os.open(os.devnull, os.O_RDONLY)  # nor the job's
    os.dup2(nothing, 0)
    os.close(nothing)
    try:
        verdicts = grade(job)
    finally:
        limits.kill_descendants()
    with os.fdopen(verdict_fd, "w") as channel:
        json.dump(verdicts, channel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
