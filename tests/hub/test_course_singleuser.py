"""hub/jupyter/course_singleuser.py: a student's server starts without the work no student uses,
and with everything else.

Each check runs in a fresh Python (the cuts change ``sys.modules`` and JupyterLab's module for
the rest of a process). tests/hub/test_hub.py starts real servers through it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "hub" / "jupyter" / "course_singleuser.py"
CUTS = f"""
import runpy, subprocess
launcher = runpy.run_path({str(LAUNCHER)!r})
launcher["skip_start_up_work_no_student_uses"]()
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CUTS + code], capture_output=True, text=True, timeout=120)


def test_jsonschema_checks_every_format_but_the_iri_ones():
    done = run("""
import jsonschema
try:
    import rfc3987_syntax
except ImportError:
    print("no rfc3987_syntax")
checker = jsonschema.Draft7Validator.FORMAT_CHECKER
print(sorted(f for f in ("iri", "iri-reference") if f in checker.checkers))
print(sorted(f for f in ("uri", "uri-reference", "date-time", "email", "ipv4", "regex") if f not in checker.checkers))
print(checker.conforms("not a uri", "uri"), checker.conforms("https://example.org/a", "uri"))
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["no rfc3987_syntax", "[]", "[]", "False True"], done.stdout


def test_jupyterlabs_server_imports_without_running_node():
    done = run("""
ran = []
def no_subprocess(*args, **kwargs):   # JupyterLab logs a failed yarn and goes on: record each try
    ran.append(args[0])
    raise OSError("no subprocess here")
subprocess.check_output = subprocess.run = subprocess.Popen = no_subprocess
import jupyterlab.labapp
from jupyterlab.commands import YARN_DEFAULT_REGISTRY, AppOptions
print(ran, AppOptions().registry == YARN_DEFAULT_REGISTRY, ran)
""")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("[] True []"), done.stdout + done.stderr[-2000:]


def test_the_hub_starts_each_server_through_it():
    config = (REPO / "hub" / "jupyterhub_config.py").read_text()
    assert "batchspawner_singleuser_cmd = f\"{server_python} {HERE / 'jupyter' / 'course_singleuser.py'}\"" in config
