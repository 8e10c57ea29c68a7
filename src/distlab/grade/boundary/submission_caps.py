"""The caps a grader puts on each submission's processes together, one phase at a time.

Grading a notebook has two phases, and each runs student code in processes of its own: the
*kernel* runs the notebook's cells (and the ranks they start), then the *clean room* runs the
tests (and the ranks they start). :func:`phase` makes one control group for a phase
(:class:`~distlab.grade.boundary.cgroups.SubmissionGroup`) with the caps configured in
:class:`SubmissionCaps`, and logs what the phase used: the most memory it held at once and
its CPU time, which is how an instructor sizes the caps. A phase ended for its CPU time says
so where the student reads it (:func:`why_ended`).

The processes that join the group are started by nbclient's kernel manager and by
:class:`~distlab.grade.pipeline.nbplugins.CleanRoomTests`; both prefix their command with
:func:`wrap_for_current`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from traitlets import Integer
from traitlets.config import Configurable

from distlab.grade.boundary.cgroups import SubmissionGroup, available, joined

VARIABLE = "DISTLAB_GRADE_CGROUP"
"""Names the current submission's group folders (``os.pathsep``-separated) to the kernel manager,
which nbclient creates where :class:`phase` cannot hand it the group directly."""

_said_unavailable = False


class SubmissionCaps(Configurable):
    """The caps on one submission's processes together (``SubmissionCaps.memory_mb=...`` in
    ``grader/nbgrader_config.py`` or on the command line)."""

    memory_mb = Integer(8192, help="Memory a submission's processes may hold together: its kernel or its "
                                   "clean room, and all their ranks (MiB)").tag(config=True)
    tasks = Integer(1024, help="Processes and threads a submission's processes may have together "
                               "(torch starts a few dozen threads per rank)").tag(config=True)
    cpu_s = Integer(1800, help="CPU seconds a submission's processes may use together in one phase (its kernel "
                               "and its ranks; its clean room and its ranks): past it all of them are ended. An "
                               "honest chapter-0 kernel uses about 2 with its ranks, its clean room about 4"
                    ).tag(config=True)


@contextlib.contextmanager
def phase(preprocessor, resources: dict, what: str):
    """A :class:`SubmissionGroup` for one phase of grading a notebook (``"kernel"``, ``"clean
    room"``), with the caps configured for ``preprocessor``; ``None`` where no group can be
    made (said once in the log). Its folders are in :data:`VARIABLE` meanwhile."""
    global _said_unavailable
    caps = SubmissionCaps(parent=preprocessor)
    why_not = available()
    if why_not is not None:
        if not _said_unavailable:
            preprocessor.log.warning("No cap on a submission's processes together (%s): each process "
                                     "keeps its own caps", why_not)
            _said_unavailable = True
        yield None
        return
    info = resources.get("nbgrader", {})
    label = f"{info.get('student', '')}-{info.get('notebook', '')}-{what.replace(' ', '-')}"
    with SubmissionGroup(label, caps.memory_mb, caps.tasks, caps.cpu_s) as group:
        os.environ[VARIABLE] = os.pathsep.join(map(str, group.folders))
        try:
            yield group
        finally:
            os.environ.pop(VARIABLE, None)
            peak = group.memory_peak_mb()
            if peak is not None:
                preprocessor.log.info("The %s and its ranks held at most %.0f MiB at once (cap: %d MiB)",
                                      what, peak, caps.memory_mb)
            used = group.cpu_seconds()
            if used is not None:
                preprocessor.log.info("The %s and its ranks used %.1f CPU-s (cap: %d)", what, used, caps.cpu_s)
            if group.cpu_cap_reached:
                preprocessor.log.warning("The %s of this submission reached its CPU cap (%d CPU-s for all its "
                                         "processes together): the grader ended them", what, caps.cpu_s)
            kills = group.out_of_memory_kills()
            if kills:
                preprocessor.log.warning("The %s of this submission reached its memory cap (%d MiB for all "
                                         "its processes together): the system ended %d of them", what,
                                         caps.memory_mb, kills)


def wrap_for_current(argv: list[str]) -> list[str]:
    """``argv`` started inside the group :func:`phase` made (as :meth:`SubmissionGroup.wrap`), or
    unchanged outside a phase."""
    folders = os.environ.get(VARIABLE)
    return joined([Path(f) for f in folders.split(os.pathsep)], argv) if folders else argv


def why_ended(group: SubmissionGroup | None) -> str | None:
    """What to tell the student when the grader ended ``group``'s processes for their CPU time
    (a phrase that follows "the kernel" or "the clean room"), else ``None``."""
    if group is None or not group.cpu_cap_reached:
        return None
    return (f"was ended by the grader: with its ranks it used more than this submission's CPU budget "
            f"({group.cpu_s} CPU-seconds)")
