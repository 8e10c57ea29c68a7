"""nbgrader configuration of the distlab course (nbgrader 0.9.6).

Run nbgrader through ``python -m distlab.grade`` (or ``make grade-*``), which points
nbgrader at this file; running ``nbgrader ...`` from inside ``grader/`` works too.

Folders (relative to the repository root, which is the course root):

* ``solutions/<slug>/<slug>.ipynb``  instructor version (source): solutions + hidden tests
* ``notebooks/<slug>/<slug>.ipynb``  student version (release), generated, never hand-edited
* ``grader/work/``                   git-ignored: submitted/, autograded/, feedback/,
                                     the gradebook ``gradebook.db`` and the exchange inbox

How grading differs from plain nbgrader (see ``src/distlab/grade/``):

* the notebook runs in a kernel started from this project's ``.venv`` under per-process
  resource caps, with a per-cell timeout, but the *test* cells are not run there:
* the test cells run in a separate clean-room process that never executes student code
  in-process; the student's functions run on fresh ranks under caps and guards, and come
  back as plain data (tensors, numbers, strings, containers) decoded with a safe loader.
  What the student's kernel does (monkey-patching torch, distlab.grade.checks, distlab.run, the
  traceback display, ...) therefore cannot change a verdict.
* both the kernel and the clean room (with its ranks) run inside bubblewrap's namespaces
  (distlab.grade.boundary.bubblewrap): no solutions, gradebook, other students, home or network there.
"""

import os
import sys
import warnings

from sqlalchemy.exc import SAWarning

# nbgrader's gradebook code makes SQLAlchemy warn "Object of type <SubmittedAssignment> not in
# session" three times per student and run: harmless, and they buried the grading log.
warnings.filterwarnings("ignore", category=SAWarning, module=r"nbgrader\.")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, "src"))  # this checkout's distlab, even if not installed

from distlab.grade import config as _grading  # noqa: E402
from distlab.grade.pipeline import feedback as _feedback  # noqa: E402
from distlab.grade.pipeline import nbplugins as _plugins  # noqa: E402

c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

WORK = _grading.private_work_dir(_REPO)  # 0700: its gradebook holds the hidden tests

c.CourseDirectory.course_id = _grading.COURSE_ID
c.CourseDirectory.root = _REPO
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
# Absolute: nbgrader joins them to the root, and its log then shows real paths (a relative
# one printed as <repository>/../../srv/... when the work folder lives elsewhere).
c.CourseDirectory.submitted_directory = os.path.join(WORK, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(WORK, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(WORK, "feedback")
c.CourseDirectory.solution_directory = os.path.join(WORK, "released-solutions")
# The gradebook: sqlite in the work folder, or a database server (DISTLAB_GRADE_DB_URL).
c.CourseDirectory.db_url = _grading.db_url()
# The exchange students fetch from and submit to (nbgrader's shared multi-user exchange): on
# the course hub it is a folder every user can write (hub/README.md); by default a private one.
c.Exchange.root = _grading.exchange_root()
# Collect: grader/work/downloaded/<slug>/archive/ holds one <student_id>.zip (or a folder
# <student_id>/) per student with <slug>.ipynb inside; `nbgrader zip_collect` extracts and
# copies them to submitted/<student_id>/<slug>/.
# (zip_collect joins this one to the root as text: it must stay relative; the log tidies the path.)
c.ZipCollectApp.downloaded_directory = os.path.relpath(os.path.join(WORK, "downloaded"), _REPO)
c.FileNameCollectorPlugin.named_regexp = _grading.COLLECT_REGEXP

# Late submissions (after the due date `publish --due` sets): the course's policy is that a
# late submission scores 0; nbgrader records how late it was. ("none" keeps the points.)
c.LateSubmissionPlugin.penalty_method = "zero"

# Release: the student version must not carry outputs of the instructor's runs.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.GenerateAssignment.create_assignment = True

# Autograde: student cells run in the .venv kernel under caps, with a per-cell timeout;
# test cells run in the clean room (distlab.grade.boundary.cleanroom), which decides the scores.
c.Execute.timeout = _grading.CELL_TIMEOUT_S
c.Execute.interrupt_on_timeout = True
c.OverwriteCells.add_missing_cells = True  # a deleted test cell comes back (and is run)
# nbgrader's list, with OverwriteCells replaced: the hidden tests a released cell lacks are not an edit.
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    _plugins.ExpectHiddenTests,
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.LimitOutput.max_lines = 200
c.Autograde.autograde_preprocessors = [
    _plugins.KernelExecute,     # student cells in the kernel, test cells skipped
    _plugins.CleanRoomTests,    # test cells in the clean room: outputs + verdicts
    "nbgrader.preprocessors.IgnorePattern",
    "nbgrader.preprocessors.LimitOutput",
    _plugins.SaveAutoGradesAtOnce,  # one transaction per student notebook, not one per cell
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# Feedback: never show hidden tests, nor what a hidden test printed or raised in detail.
# Each test is named after its task and what it checks, formulas render with MathJax from the
# student's own server, not a CDN (distlab.grade.pipeline.feedback, hub/jupyter/course_feedback.py).
c.HTMLExporter.template_name = _feedback.TEMPLATE_NAME
c.HTMLExporter.extra_template_basedirs = [str(_feedback.TEMPLATES)]
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    _feedback.NameTests,
    _feedback.HideHiddenTestDetails,
    _feedback.QuietClearHiddenTests,
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
