"""Grading distlab's exercise notebooks with nbgrader, in a way students' code cannot fool.

The top of this package is what a reader looks for first: :mod:`distlab.grade.checks` (what the
exercises' tests assert, the module students' notebooks import, with its pieces
:mod:`distlab.grade.failures`, :mod:`distlab.grade.references` and
:mod:`distlab.grade.relay_checks`), :mod:`distlab.grade.exercise` (what every notebook's setup
cell shares), the instructor's commands :mod:`distlab.grade.__main__` (``python -m
distlab.grade``) and the settings every room reads (:mod:`distlab.grade.config`). The rest lives
in four rooms of one concern each; each room's docstring says what it holds and guarantees.

* :mod:`distlab.grade.boundary`, the trust boundary, one folder to read whole: the grading
  kernel and the clean room that runs the hidden tests (:mod:`distlab.grade.boundary.cleanroom`,
  which never runs a line of student code itself), bubblewrap's namespaces, control groups and
  per-process caps, each rank in a room of its own, the guards inside Python (forbidden APIs and
  collectives, protected files), bytes counted on the wire, and what a student's processes print
  on its way to the instructor.
* :mod:`distlab.grade.pipeline`, nbgrader's plumbing: the plugins ``grader/nbgrader_config.py``
  installs (the notebook's cells in the grading kernel, its tests in the clean room), nbgrader
  run as its own process, the release of the student notebooks, the feedback page.
* :mod:`distlab.grade.course`, the class: collecting from the exchange, grading a class on
  Slurm, the grades as CSV.
* :mod:`distlab.grade.author`, writing and publishing the course: new chapters, page checks,
  the chapter lists, the student edition.

The rooms lean one way (``python scripts/package_map.py --depth 3`` draws them): the commands
use every room; the pipeline and the checks build on the boundary; the boundary uses nothing of
the others but the settings and the failure a check raises. A submission meets them in this
order: ``autograde`` (:mod:`distlab.grade.__main__`) runs nbgrader through
:mod:`distlab.grade.pipeline.run_nbgrader`; :mod:`distlab.grade.pipeline.nbplugins` runs the
student's cells in :mod:`distlab.grade.boundary.kernel` and the tests in
:mod:`distlab.grade.boundary.cleanroom`, whose checks come from :mod:`distlab.grade.checks`.
"""
