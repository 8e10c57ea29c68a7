"""The course's settings for every student's Jupyter server (hub/jupyter is first on the
servers' JUPYTER_CONFIG_PATH, see hub/jupyterhub_config.py).

- nbgrader's instructor-only parts (formgrader, the course list) are off: students hand in
  through the Assignments tab, they do not grade.
- ``course_launch`` (beside this file) sends the book's launch button to the student's fetched
  copy of a released assignment, the one the Assignments tab hands in (fetching it first).
- ``course_sessions`` starts a notebook's kernel when its URL is opened, so
  that JupyterLab never asks a student to pick a kernel (see that module for why it would).
- ``course_contents`` is the contents manager: a notebook reaches JupyterLab with the
  ``kernelspec`` and ``language_info`` its kernel will report, so opening it does not mark it
  modified.
- ``course_clock`` tells JupyterLab how long the server's Slurm job has left, and
  ``course_feedback`` serves a student's returned feedback as a page with MathJax from the
  course environment; the JupyterLab side of both is ``labextensions/distlab-course`` (one
  hand-written file, no build step), found through ``LabApp.extra_labextensions_path``.
- Kernels on Unix sockets, in Jupyter's runtime folder (mode 0700, made so below if it is
  not), not on TCP ports of the node's ``127.0.0.1``: any account on a node can find those in
  ``/proc/net/tcp`` and read a kernel's every cell and output from its IOPub port (no key is
  needed to listen). ``course_kernels`` moves ipykernel's one other port there too.
- Quiet job logs: a warning in a student's job log should mean something happened that a
  person can act on. These did not, and came with every server or every connection:
  * ``'extra_template_paths' was found in both NotebookApp and ServerApp`` (once per start):
    JupyterHub's single-user extension sets that trait for the classic notebook's templates,
    and JupyterLab's configuration shim reports it, a note to both projects' developers;
  * ``Skipping XSRF check for insecure request GET .../channels`` (every websocket):
    JupyterHub notes that the browser did not say the request's fetch mode; the request is a
    read or a websocket that JupyterHub has already authenticated;
  * ``Notebook ... is not trusted`` (every open and save): notebook trust (signatures) guards
    HTML and JavaScript outputs; every notebook a student clones or fetches starts untrusted,
    and JupyterLab shows its outputs as such anyway;
  * ``The websocket_ping_timeout (90000) cannot be longer than the websocket_ping_interval``
    (once per server): Jupyter Server's ping timeout (3 intervals, which its own check of
    late pongs needs: a timeout of one interval closed kernel connections under load)
    against a rule of Tornado's newer versions.
  The filter below drops exactly these messages, nothing else.
"""

import logging
import os
import sys
import tempfile
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)
HERE = Path(__file__).resolve().parent
c.ServerApp.jpserver_extensions.update({
    "course_launch": True,
    "course_sessions": True,
    "course_clock": True,
    "course_feedback": True,
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.course_list": False,
})
c.ServerApp.contents_manager_class = "course_contents.CourseContentsManager"
c.LabApp.extra_labextensions_path = [str(HERE / "labextensions")]
# Kernels on Unix sockets in the runtime folder, which only the student may enter. CENTRE: these
# lines are all it takes on your hub.
c.KernelManager.transport = "ipc"
c.KernelSpecManager.kernel_spec_class = "course_kernels.CourseKernelSpec"
runtime = jupyter_runtime_dir()
# A socket's path (<runtime>/kernel-<36-character id>-ipc-<n>) may be at most 107 bytes: a
# runtime folder deep in a long home path gives way to a private one in the node's /tmp.
if len(os.path.join(runtime, "kernel-00000000-0000-0000-0000-000000000000-ipc-99").encode()) > 107:
    runtime = c.ServerApp.runtime_dir = tempfile.mkdtemp(prefix="jupyter-runtime-")
os.makedirs(runtime, mode=0o700, exist_ok=True)
os.chmod(runtime, 0o700)


class NobodyCanActOnIt(logging.Filter):
    """Drop the log records (see above) that carry nothing a student or instructor can act on."""

    MESSAGES = ("'extra_template_paths' was found in both NotebookApp and ServerApp",
                "Skipping XSRF check for insecure request ", "The websocket_ping_timeout (")
    TRUST = " is not trusted"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        message = record.getMessage()
        if message.startswith("Notebook "):
            return not message.endswith(self.TRUST)
        return not message.startswith(self.MESSAGES)


# JupyterLab's and Notebook 7's loggers (the shim's note), Tornado's application and general
# loggers (JupyterHub's XSRF note, the ping rule; Jupyter Server renames them "ServerApp" when
# it sets up logging) and the server's own (trust).
for _name in ("LabApp", "JupyterNotebookApp", "tornado.application", "tornado.general", "ServerApp"):
    logging.getLogger(_name).addFilter(NobodyCanActOnIt())
