"""How each student's server starts: batchspawner's ``batchspawner-singleuser``, minus two pieces of
start-up work that every server paid for and no student uses.

The Slurm job runs ``<server python> hub/jupyter/course_singleuser.py <course env>/bin/jupyterhub-singleuser``
(``batchspawner_singleuser_cmd`` in hub/jupyterhub_config.py): this file, then batchspawner's own
``main`` in the same process (it tells the hub the server's port and runs
``jupyterhub-singleuser``), so the server is exactly the one batchspawner starts. Its folder,
first on ``sys.path`` as a script's is, is the one jupyter_server_config.py beside it puts
there anyway for the course's server extensions.

Why. A server's start is CPU work, and a class presses Start at the same moment: 30 servers
started on 2 cores all became ready together after 87 s, about 5 s of CPU each
(benchmarks/hub_class.py). Measured on one start (``jupyterhub-singleuser`` as an unprivileged
user with the job's environment, ``python -X importtime`` and cProfile), 2.5 s of those 5 went to:

* **An IRI grammar, 2 s.** jsonschema checks the ``iri`` and ``iri-reference`` formats with
  ``rfc3987_syntax`` when that is installed (jupyter_events asks for jsonschema's format
  extras), and ``rfc3987_syntax`` builds an Earley parser of RFC 3987 with lark as it is
  imported. Jupyter Server imports jsonschema for its event schemas, none of which has an IRI
  field. Without the module jsonschema registers no checker for those two formats, which
  leaves them unchecked (a format without a checker is an annotation); every other format is
  checked as before. The kernels are processes of their own and are not touched.
* **Yarn's configuration, 0.5 s.** Importing JupyterLab's server (``jupyterlab.labapp``) asks
  for the application's version, and with it the npm registry that ``jupyter labextension
  install`` would use, by running ``node yarn.js config --json`` whenever ``node`` is on the
  ``PATH`` (it is, in /usr/bin). A student's server never builds JupyterLab nor installs
  source extensions, and the compute nodes have no internet: the registry is yarn's default
  without asking node, as it is wherever node is not installed.

What a student uses is all still there: JupyterLab with the course's extensions, the
Assignments tab, the launch link (course_launch), the time-limit warning, the feedback page,
nbgitpuller, the terminal (tests/hub/test_hub.py, tests/hub/test_course_sessions.py).
"""

from __future__ import annotations

import sys


def skip_start_up_work_no_student_uses() -> None:
    """The two cuts of the module's docstring, made before anything imports jsonschema or
    JupyterLab. A JupyterLab without the function it replaces is left as it is."""
    sys.modules.setdefault("rfc3987_syntax", None)   # `import rfc3987_syntax` raises ImportError
    import jupyterlab.commands as lab

    if callable(getattr(lab, "_yarn_config", None)):
        lab._yarn_config = lambda logger: {"yarn config": {}, "npm config": {}}


def main() -> None:
    skip_start_up_work_no_student_uses()
    from batchspawner.singleuser import main as batchspawner_singleuser

    batchspawner_singleuser()


if __name__ == "__main__":
    main()
