"""``distlab.grade.pipeline.nbgrader_app``: nbgrader's command line, minus two costs that buy nothing.

It must stay nbgrader: the gradebook it creates is stamped with the schema revision nbgrader's
own ``alembic heads`` reports (a wrong stamp would make a later ``nbgrader db upgrade`` replay
or skip migrations), and the grammar it skips never loads.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from distlab.grade.pipeline import nbgrader_app

VENV_BIN = Path(sys.executable).parent


def test_the_head_read_in_process_is_what_alembic_heads_prints(tmp_path):
    from nbgrader import dbutil

    ini = tmp_path / "alembic.ini"
    dbutil.write_alembic_ini(str(ini), f"sqlite:///{tmp_path / 'unused.db'}")
    printed = subprocess.run([str(VENV_BIN / "alembic"), "-c", str(ini), "heads"], capture_output=True,
                             text=True, check=True).stdout
    assert printed.split()[0] == nbgrader_app.alembic_head()
    assert "(head)" in printed and len(printed.strip().splitlines()) == 1, printed   # one head, no branches


def test_a_new_gradebook_is_stamped_without_the_alembic_command_and_without_the_grammar(tmp_path):
    """Before the change nbgrader ran ``alembic heads`` as a subprocess, found through ``PATH``:
    with the virtual environment's ``bin`` off ``PATH`` it failed with FileNotFoundError."""
    db = tmp_path / "gradebook.db"
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: print('grammar loaded:', sys.modules.get('rfc3987_syntax') is not None))\n"
        "from distlab.grade.pipeline.nbgrader_app import main\n"
        "main()\n")
    env = dict(os.environ, PATH="/usr/bin:/bin")
    result = subprocess.run([sys.executable, str(probe), "db", "student", "add", "alice",
                             f"--CourseDirectory.db_url=sqlite:///{db}", "--CourseDirectory.course_id=c"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "grammar loaded: False" in result.stdout, result.stdout
    with sqlite3.connect(db) as connection:
        assert connection.execute("select version_num from alembic_version").fetchall() == [(nbgrader_app.alembic_head(),)]
        assert connection.execute("select id from student").fetchall() == [("alice",)]
