"""Paths and defaults of the grading setup (nbgrader_config.py reads them from here)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from urllib.parse import urlsplit

CELL_TIMEOUT_S = 60
"""Per-cell timeout in the student's kernel: a cell still running after it is interrupted
(it scores as an error) and grading goes on with the next cell."""

TEST_CELL_TIMEOUT_S = 180
"""Per-test-cell limit in the clean room. Each ``distlab.run`` in a test has its own timeout;
this is the backstop for a test that launches several runs."""

COLLECT_REGEXP = r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9.@+-]*)/(?:.*/)?(?P<file_id>[^/]+\.ipynb)$"
"""``nbgrader zip_collect``: ``archive/<student_id>.zip`` (or ``archive/<student_id>/``) holding
``<slug>.ipynb`` becomes ``submitted/<student_id>/<slug>/<slug>.ipynb``. Student ids are letters,
digits and ``. @ + -`` (no ``/``, no ``_`` at the start)."""


COURSE_ID = "distlab"
"""nbgrader's course id: the exchange keeps each course's files under it."""


def repo_root() -> str:
    """The course root: the repository this distlab comes from (``src/distlab/grade`` → ``.``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def work_dir(repo: str | None = None) -> str:
    """The git-ignored working folder (``DISTLAB_GRADE_WORK`` overrides ``grader/work``)."""
    return os.path.abspath(os.environ.get("DISTLAB_GRADE_WORK") or os.path.join(repo or repo_root(), "grader", "work"))


def private_work_dir(repo: str | None = None) -> str:
    """The working folder, made if missing, and readable by its owner alone (mode 0700).

    It holds the gradebook (with every hidden test), every submission and every graded
    notebook, so nobody else may even list it. Made 0700, everything nbgrader creates inside
    is out of other users' reach whatever their own modes; a folder found open to others
    (made by an older distlab, or by hand with a umask of 022) is closed.
    """
    path = work_dir(repo)
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


DB_URL_VARIABLE = "DISTLAB_GRADE_DB_URL"
_db_url: str | None = None


def db_url() -> str:
    """The gradebook's SQLAlchemy URL: ``DISTLAB_GRADE_DB_URL`` if set, else ``<work>/gradebook.db``.

    sqlite (the default) is one file on one machine. A class graded by many jobs at once
    writes from many nodes: that is a database server's job, e.g.
    ``postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE`` (psycopg 3 driver).

    The variable is read once and then removed from this process's environment: the URL
    holds the database password, and the kernels, ranks and clean rooms this process starts
    run student code, which must not find it there. (``python -m distlab.grade`` hands it to
    nbgrader explicitly, see :func:`nbgrader_environment`.)
    """
    global _db_url
    if DB_URL_VARIABLE in os.environ:
        _db_url = os.environ.pop(DB_URL_VARIABLE)
    return _db_url or "sqlite:///" + os.path.join(work_dir(), "gradebook.db")


def nbgrader_environment(env: dict) -> dict:
    """``env`` for an nbgrader child: with the gradebook URL if it is not the default."""
    url = db_url()
    return {**env, DB_URL_VARIABLE: url} if not url.startswith("sqlite:") else env


def shown_url(url: str) -> str:
    """A database URL fit for a log: the password replaced by ``***``."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def loopback_host(url: str) -> str | None:
    """The host of a database URL if it is this machine's loopback (``127.0.0.1``, ``localhost``,
    ``::1``), else None. Every node has a loopback of its own: from the grading jobs, that address
    is their own node."""
    host = urlsplit(url).hostname
    if not host:
        return None
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return None
    return host if addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses) else None


def exchange_root() -> str:
    """nbgrader's exchange: ``DISTLAB_GRADE_EXCHANGE`` on the course hub, else ``<work>/exchange``."""
    return os.path.abspath(os.environ.get("DISTLAB_GRADE_EXCHANGE") or os.path.join(work_dir(), "exchange"))


def protected_paths(repo: str | None = None) -> list[str]:
    """What student code may not touch while graded: solutions, grader files, git history, work folder."""
    repo = repo or repo_root()
    return [os.path.join(repo, "solutions"), os.path.join(repo, "grader"), os.path.join(repo, ".git"),
            work_dir(repo)]
