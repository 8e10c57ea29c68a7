"""The nbgrader plugins of the distlab course (installed by ``grader/nbgrader_config.py``).

* :class:`KernelExecute` replaces nbgrader's ``Execute``: the notebook runs in a kernel from
  this project's ``.venv`` started through :mod:`distlab.grade.boundary.kernel` (caps + guard), with
  nbgrader's per-cell timeout; autograder *test* cells are skipped there.
* :class:`CleanRoomTests` runs right after it: it hands the notebook to the clean room
  (:mod:`distlab.grade.boundary.cleanroom`, a separate process), and writes each test cell's output and
  verdict into the notebook, where nbgrader's ``SaveAutoGrades`` scores them as usual
  (an error output: 0 points; none: full points).
* :class:`SaveAutoGradesAtOnce` (:mod:`distlab.grade.pipeline.save_grades`) replaces nbgrader's
  ``SaveAutoGrades``: one transaction per student notebook instead of one commit per cell.
* What the kernel and the clean room print reaches the grader's log marked, neutralised and
  capped, and the kernel's cell outputs are capped as they are kept
  (:mod:`distlab.grade.boundary.student_output`).

Both execution plugins leave no process behind: the nbgrader process is made a child
subreaper, and after each notebook every process still below it is killed. Each runs its
processes in one control group of the submission (:mod:`distlab.grade.boundary.cgroups`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from jupyter_client.manager import KernelManager
from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, Execute, NbGraderPreprocessor, OverwriteCells
from traitlets import Integer, List, Type, Unicode

from distlab.grade import config
from distlab.grade.boundary import (
    bubblewrap,
    kernel_messages,
    limits,
    pipes,
    sandbox_keeper,
    scratch,
    student_output,
    submission_caps,
)
from distlab.grade.pipeline.grading_kernel import GradingKernelManager
from distlab.grade.pipeline.save_grades import SaveAutoGradesAtOnce  # noqa: F401 - its own module; named here for the config
from distlab.grade.pipeline.source_rules import forbidden_in_source
from distlab.relay import schedule
from distlab.runtime import processes


def is_test_cell(cell) -> bool:
    """An autograder test: a grade cell that is not an answer, holding code."""
    return cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)


class KernelExecute(student_output.CappedCellOutputs, Execute):
    """nbgrader's Execute, with the kernel under caps and the test cells left to the clean room."""

    kernel_memory_mb = Integer(6144, help="Address-space cap of the grading kernel (MiB)").tag(config=True)
    kernel_processes = Integer(24, help="Most live processes below the kernel (its ranks included)").tag(config=True)
    kernel_output_mb = Integer(64, help="Largest file the kernel and its ranks may write (MiB)").tag(config=True)

    # Not configurable: no setting (Execute.kernel_manager_class, which the hub sets for nbgrader's
    # other kernels, and which nbconvert applies after __init__) may swap this kernel out.
    kernel_manager_class = Type(GradingKernelManager, klass=KernelManager)

    def __init__(self, *args, **kwargs):
        kwargs["kernel_manager_class"] = GradingKernelManager   # nbgrader's Execute passes its own
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources, km=None):
        self._kernel_died = False
        self._group = None   # the phase's control group, once made
        processes.become_subreaper()
        graded = resources.setdefault("metadata", {}).get("path") or os.getcwd()
        # The kernel works in a folder of its own, never in the graded one: that one holds the
        # notebook with its test cells restored (hidden tests included), which raw system calls
        # would read past any Python guard; and nbgrader, as root, writes the graded notebook,
        # sets permissions and copies the feedback there, through whatever link student code
        # might leave. The kernel gets a copy of the student's other files; nothing it writes
        # comes back.
        with tempfile.TemporaryDirectory(prefix="distlab-kernel-folder-", ignore_cleanup_errors=True) as folder:
            bubblewrap.copy_submitted_files(graded, folder)
            os.environ["DISTLAB_GRADE_KERNEL"] = json.dumps({
                "memory_mb": self.kernel_memory_mb, "processes": self.kernel_processes,
                "output_mb": self.kernel_output_mb, "protected": config.protected_paths(),
                "allowed": [folder],
            })
            resources["metadata"]["path"] = folder   # where nbclient starts the kernel
            try:
                with submission_caps.phase(self, resources, "kernel") as self._group:   # on it and its ranks
                    return super().preprocess(nb, resources, km=km)
            finally:
                resources["metadata"]["path"] = graded
                os.environ.pop("DISTLAB_GRADE_KERNEL", None)
                limits.kill_descendants()   # before the folder goes: nothing still writes there

    async def _async_handle_timeout(self, timeout, cell=None):
        self._unanswered = True   # the kernel did not answer the cell in its time limit
        return await super()._async_handle_timeout(timeout, cell)

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell) or (cell.cell_type == "code" and self._kernel_died):
            cell.outputs = []
            cell.execution_count = None
            return cell, resources
        self._unanswered = False
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
            scratch.explain(cell)   # a write past the caps of the kernel's folder: say which
            kernel_messages.explain(cell, self.kc)   # a message past the cap: refused unread
            return cell, resources
        except Exception as exc:  # noqa: BLE001
            # a refused message took the rest of the cell's output with it
            if kernel_messages.only_output_lost(exc, cell, self.kc, answered=not self._unanswered):
                return cell, resources
            # The student's code killed or wrecked its kernel (os._exit, SIGKILL, the memory
            # cap, builtins replaced so the kernel cannot even reply...). The cells after it
            # cannot run there; the tests never did: the clean room runs them.
            self._kernel_died = True
            what = submission_caps.why_ended(self._group) or (
                "died" if isinstance(exc, DeadKernelError) else f"stopped responding ({type(exc).__name__})")
            self.log.warning("The kernel %s in cell %d: %s", what, index, exc)
            cell.outputs = [NotebookNode({"output_type": "error", "ename": type(exc).__name__,
                                          "evalue": f"the kernel {what} while running this cell",
                                          "traceback": [f"{type(exc).__name__}: the kernel {what} while running "
                                                        "this cell; the cells after it were not run in the kernel"]})]
            return cell, resources


class CleanRoomTests(NbGraderPreprocessor):
    """Runs the notebook's test cells in the clean room and records outputs and verdicts."""

    rank_memory_mb = Integer(3072, help="Address-space cap of each graded rank (MiB)").tag(config=True)
    rank_processes = Integer(4, help="Most live processes below each graded rank").tag(config=True)
    rank_output_mb = Integer(16, help="Largest file (its printed output included) a graded rank may write (MiB)").tag(config=True)
    rank_wall_s = Integer(300, help="Wall-clock seconds a graded rank may live").tag(config=True)
    rank_cpu_s = Integer(600, help="CPU seconds a graded rank may use").tag(config=True)
    test_timeout_s = Integer(config.TEST_CELL_TIMEOUT_S, help="Seconds per test cell in the clean room").tag(config=True)
    forbidden = List(Unicode(), [], help="APIs that raise 'not allowed in this exercise' on graded ranks, "
                                         "for every assignment (a notebook adds its own in its metadata: "
                                         "{'distlab': {'forbidden': [...]}}, read from the instructor's "
                                         "source notebook, never the submission)").tag(config=True)

    def caps(self) -> dict:
        return {"memory_mb": self.rank_memory_mb, "processes": self.rank_processes,
                "output_mb": self.rank_output_mb, "wall_s": self.rank_wall_s, "cpu_s": self.rank_cpu_s,
                "label": "this rank"}

    def preprocess(self, nb: NotebookNode, resources: dict):

        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], info["assignment"])
            trusted = [{"grade_id": c.name, "source": c.source} for c in source.source_cells
                       if c.locked and c.cell_type == "code"]
            answers = {c.name for c in source.solution_cells}
            test_ids = {c.name for c in source.grade_cells if c.name not in answers}
            tests = [{"grade_id": c.name, "source": c.source} for c in source.source_cells
                     if c.name in test_ids and c.cell_type == "code"]
        cells = [{"grade_id": cell.metadata.get("nbgrader", {}).get("grade_id"), "source": cell.source}
                 for cell in nb.cells if cell.cell_type == "code"]
        forbidden = list(self.forbidden) + forbidden_in_source(self.config, info["assignment"], info["notebook"])
        job = {"cells": cells, "trusted_cells": trusted, "test_cells": tests, "caps": self.caps(),
               "protected": config.protected_paths(), "forbidden": forbidden,
               "test_timeout": self.test_timeout_s, "assignment": info["assignment"]}
        with submission_caps.phase(self, resources, "clean room") as group:   # on the clean room and its ranks
            verdicts, problem = self.run_clean_room(job, len(tests))
        problem = f"the clean room {why}" if (why := submission_caps.why_ended(group)) else problem
        for cell in nb.cells:
            if not is_test_cell(cell):
                continue
            verdict = verdicts.get(cell.metadata.nbgrader["grade_id"])
            if verdict is None:
                verdict = {"passed": False, "outputs": [{
                    "output_type": "error", "ename": "GradingError", "evalue": problem or "no verdict",
                    "traceback": [f"GradingError: the grader could not check this cell: {problem or 'no verdict'}"]}]}
            cell.outputs = [NotebookNode(o) for o in verdict["outputs"]]
            if not verdict["passed"] and not any(o["output_type"] == "error" for o in verdict["outputs"]):
                cell.outputs.append(NotebookNode({"output_type": "error", "ename": "TestFailed", "evalue": "",
                                                  "traceback": ["TestFailed"]}))
        return nb, resources

    def clean_room_command(self, verdict_fd: int) -> list[str]:
        """The clean room's command line (before the sandbox and its keeper), its verdict to go to
        the pipe ``verdict_fd``."""
        return [sys.executable, "-m", "distlab.grade.boundary.cleanroom", str(verdict_fd)]

    def run_clean_room(self, job: dict, n_tests: int) -> tuple[dict, str | None]:
        """Start the clean-room process; return its verdicts (``{}`` and why, if it failed).

        The job (hidden tests included) goes to it on a pipe, its standard input, and the
        verdict comes back on another, never through a file its ranks could read or write
        (see :mod:`distlab.grade.boundary.cleanroom`). A verdict counts only if it exited with status 0.
        """
        processes.become_subreaper()
        budget = n_tests * self.test_timeout_s + 60
        # the relay's seed goes in the job: ranks forked from the clean room would find it in its environment
        job = dict(job, relay_seed=schedule.seed_from_environment())
        with tempfile.TemporaryDirectory(prefix="distlab-cleanroom-") as room:
            os.chmod(room, 0o700)
            verdict_in, verdict_out = os.pipe()
            start = time.monotonic()
            argv = self.clean_room_command(verdict_out)
            if bubblewrap.enabled():  # its ranks run student code: inside the boundary, with it
                bubblewrap.hand_over(room)
                argv = scratch.wrap(bubblewrap.command(argv, writable=[room], cwd=room), [room])
            # its own session (ended as one group), and a keeper: if the grader dies, nothing it started grades on
            leash = sandbox_keeper.Leash()
            argv = submission_caps.wrap_for_current(sandbox_keeper.wrap(argv, leash.read_fd))
            drain = student_output.Drain("the clean room")   # what it prints is never nbgrader's own output
            options = leash.popen_options()
            options["pass_fds"] += (verdict_out,)
            try:
                proc = subprocess.Popen(argv, cwd=room, env=schedule.without_seed(os.environ),
                                        start_new_session=True, stdin=subprocess.PIPE,
                                        stdout=drain.write_fd, stderr=drain.write_fd, **options)
            finally:
                os.close(verdict_out)  # the clean room holds the only write end now
                drain.started()
                leash.started()
            reader = pipes.Reader(verdict_in)
            problem = None
            try:
                pipes.send(proc, json.dumps(job).encode())
                proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                problem = f"the clean room did not finish within {budget} s"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            finally:
                leash.close()
                limits.kill_descendants()
                drain.close()
            self.log.info("Clean room finished in %.1f s", time.monotonic() - start)
            answer = reader.result(timeout=10)
            if problem is None and proc.returncode != 0:
                problem = f"the clean room ended with code {proc.returncode}, so its verdict does not count"
            if problem is not None:
                return {}, problem
            try:
                return json.loads(answer), None
            except ValueError as exc:
                return {}, f"the clean room ended with no readable verdict ({exc})"


class ExpectHiddenTests(OverwriteCells):
    """nbgrader's ``OverwriteCells`` (every locked cell gets the instructor's version back), silent
    where the only difference is the hidden tests.

    The gradebook keeps a test cell *with* its hidden tests; the student version never had
    them, because releasing removed them. nbgrader compares the two and warns "checksum ...
    has changed!" for every such cell of every student, although nobody edited anything. Here
    a locked cell whose source is exactly the gradebook's minus its hidden-test block is
    restored without a word; any other difference (an edited test) is still reported.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and utils.is_locked(cell):
            try:
                source = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                source = None
            if source is not None and source.locked and released_version(source.source) == cell.source:
                cell.source = source.source
        return super().preprocess_cell(cell, resources, cell_index)


def released_version(source: str) -> str:
    """``source`` as releasing leaves it: without its hidden-test block."""
    cell = NotebookNode({"cell_type": "code", "source": source, "metadata": {}})
    ClearHiddenTests()._remove_hidden_test_region(cell)
    return cell.source
