"""nbgrader's settings for everyone on the course hub (students' servers and the nbgrader CLI).

The job's JUPYTER_CONFIG_PATH starts with this folder (hub/jupyterhub_config.py), so the
Assignments tab and `nbgrader fetch_assignment / submit / fetch_feedback` find the course and
its exchange without any setup by the student.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # course_exchange, beside this file

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

# One course per hub here; CENTRE: the id your instructors release under.
c.CourseDirectory.course_id = "distlab"
# nbgrader's shared multi-user exchange: a folder every user may write, on a filesystem every
# node mounts. nbgrader makes its own sub-folders: outbound/ (released, readable by all),
# inbound/ (submissions: students may write but not list it), feedback/ (one file per
# submission, named by a hash of the submitted notebook, which only its author has).
c.Exchange.root = os.environ.get("DISTLAB_HUB_EXCHANGE", "/srv/nbgrader/exchange")
# What a hand-in leaves out of the exchange: JupyterLab's checkpoints above all (a hidden copy
# of every notebook the student opened). These are nbgrader's defaults, named here because the
# hand-in depends on them; course_exchange's submit compares only what is copied with the
# release, so a checkpoint no longer shows as an "EXTRA" notebook at every submit.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]
c.ExchangeFactory.submit = "course_exchange.SubmitWhatIsCopied"
# A notebook nbgrader runs (the Assignments tab's Validate button) gets a kernel on Unix sockets in
# a private folder, as every kernel of the course (distlab.grade.boundary.kernel_sockets), not on TCP
# ports any account on the node could listen to.
c.Execute.kernel_manager_class = "distlab.grade.boundary.kernel_sockets.PrivateSocketsKernelManager"
