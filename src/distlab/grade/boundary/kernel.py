"""The grading kernel: ``python -m distlab.grade.boundary.kernel -f CONNECTION_FILE``.

A plain IPython kernel of this Python (the project's ``.venv``), started by
:class:`distlab.grade.pipeline.grading_kernel.GradingKernelManager`, that first caps and guards itself
with what the grader put in ``DISTLAB_GRADE_KERNEL`` (a JSON object):

* resource caps (:func:`distlab.grade.boundary.limits.apply`): memory, processes below it, output size;
  the ranks a student's cell starts inherit the memory and output caps;
* the guard (:func:`distlab.grade.boundary.protect.protect`): no file operation on the solutions, the
  grader's folder (gradebook, other students) or git history (the kernel's own folder stays
  usable: a copy of the submission's files without the notebook, which holds the restored
  test cells); no process started except torchrun for ``distlab.run``, at most a few others.

Then it removes that variable from its environment and runs ipykernel as usual, on the Unix
sockets its manager chose (:mod:`distlab.grade.boundary.kernel_sockets`: no TCP port at all).
"""

from __future__ import annotations

import json
import os
import sys


def _is_torchrun(args) -> bool:
    try:
        argv = list(args[1])
        return argv[1:3] == ["-m", "torch.distributed.run"]
    except (IndexError, TypeError):
        return False


def setup_from_environment() -> None:
    raw = os.environ.pop("DISTLAB_GRADE_KERNEL", None)
    if not raw:
        return
    cfg = json.loads(raw)
    from distlab.grade.boundary import limits, protect

    limits.apply(memory_mb=cfg.get("memory_mb"), processes=cfg.get("processes"),
                 output_mb=cfg.get("output_mb"), label="the grading kernel")
    protect.deny_files(cfg.get("denied_files", []))
    protect.protect(paths=cfg.get("protected", []), allowed=cfg.get("allowed", []),
                  max_spawns=cfg.get("max_spawns", 4), allow_command=_is_torchrun)


def main() -> None:
    setup_from_environment()
    from ipykernel import kernelapp

    from distlab.grade.boundary.kernel_sockets import subprocess_output_through_private_socket

    subprocess_output_through_private_socket(sys.argv)

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    sys.argv[0] = "distlab-grading-kernel"
    main()
