"""Grading distlab's exercise notebooks with nbgrader, in a way students' code cannot fool.

The pieces, in the order a submission meets them:

* :mod:`distlab.grade.__main__` (``python -m distlab.grade``): the instructor's commands:
  release (:mod:`distlab.grade.pipeline.release`), collect, autograde, feedback, export. Each is a
  thin, printed wrapper around the nbgrader command of the same job, run with
  ``grader/nbgrader_config.py`` by :mod:`distlab.grade.pipeline.run_nbgrader`.
* :mod:`distlab.grade.pipeline.nbplugins`: the nbgrader plugins that config installs. The student's
  cells run in a kernel started by :mod:`distlab.grade.boundary.kernel` (resource caps, a guard on
  files and processes); the *test* cells are skipped there and run instead by
* :mod:`distlab.grade.boundary.cleanroom`: a fresh process that never runs a line of the student's
  code itself. It runs the instructor's test cells; where a test names a student function,
  it gets a stand-in (:class:`distlab.grade.boundary.sandbox.StudentFunction`) that, on each rank,
  runs the student's cells and calls the real function there. Results come back as plain
  data through :mod:`distlab.grade.boundary.safeload` (a pickle loader that can build no objects
  but tensors, numbers, strings and containers).
* :mod:`distlab.grade.boundary.bubblewrap`: the kernel and the clean room (with its ranks) start
  inside an operating-system sandbox: a private file system view, network, process table
  and an unprivileged user, so what gets past the Python guard still reaches nothing. On
  its private loopback, :mod:`distlab.grade.boundary.wire` counts the bytes the ranks send, outside them.
* :mod:`distlab.grade.boundary.submission_caps`: each of those two phases runs in a control group of its
  own (:mod:`distlab.grade.boundary.cgroups`), which caps the memory, tasks and CPU time of all its
  processes together.

What the rank-side pieces are, which tests and the clean room both use:

* :mod:`distlab.grade.checks`: what tests assert (values, gradients against the reference,
  bytes on the wire, memory), with tolerances stated and messages safe to show;
* :mod:`distlab.grade.boundary.forbid`: forbidden APIs (a reference or torch's built-in doing the work),
  and :mod:`distlab.grade.boundary.forbid_collectives`: a forbidden collective, at every layer that sends;
* :mod:`distlab.grade.boundary.protect`: protected files and processes (an audit hook);
* :mod:`distlab.grade.boundary.limits`: resource caps for one process (memory, processes, output, time).
"""
