"""The course's settings for every student's Jupyter server (hub/jupyter is first on the
servers' JUPYTER_CONFIG_PATH, see hub/jupyterhub_config.py).

- nbgrader's instructor-only parts (formgrader, the course list) are off: students hand in
  through the Assignments tab, they do not grade.
- ``course_sessions`` (beside this file) starts a notebook's kernel when its URL is opened, so
  that JupyterLab never asks a student to pick a kernel (see that module for why it would).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)
c.ServerApp.jpserver_extensions.update({
    "course_sessions": True,
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.course_list": False,
})
