"""``python -m distlab.grade.pipeline.nbgrader_app ARGS``: nbgrader's own command line (``nbgrader ARGS``),
without two costs that buy nothing: a grammar it never uses, and a second Python to read one
string.

Every instructor command runs nbgrader in a process of its own, and a class costs several per
student (collect, autograde, feedback, export; the tests start about 230). Each one imported
nbformat, nbformat imports jsonschema, and jsonschema, because ``rfc3987_syntax`` is installed
(jupyter_events asks for jsonschema's format extras), imports that module to check the ``iri``
and ``iri-reference`` formats. Importing it builds an Earley parser of RFC 3987 with lark:
1.5 s of CPU of the 2.8 s that ``nbgrader --version`` took here (``python -X importtime``).

No schema nbgrader reads has an IRI field: the notebook format, nbgrader's cell metadata and
the gradebook are checked as before, and every other format keeps its checker. Without the
module jsonschema registers no checker for those two formats, so they would go unchecked
(a format without a checker is an annotation). The student's server makes the same cut
(hub/jupyter/course_singleuser.py); kernels never import jsonschema and are not touched.

When nbgrader creates a gradebook, it stamps the database with its newest migration. It learns
that revision by running ``alembic heads`` as a new process (``nbgrader.api.get_alembic_version``),
which imports alembic, SQLAlchemy and nbgrader again: about 4 s of CPU, once per new gradebook,
for the name of a file in nbgrader's own ``alembic/versions`` folder. It also needs the
``alembic`` command on ``PATH``. We read the same answer here, with alembic's own reader of
that folder, in the process that already imported it.

One thing is added: every line of a log record after its first (a traceback's, say) starts
with :data:`CONTINUED`. A record's text may hold a student's (an exception that quotes a
notebook), and the instructor's commands read nbgrader's status lines by their start
(:data:`distlab.grade.__main__.NOT_GRADED`): only a record's first line, which nbgrader
writes, can start like one.
"""

from __future__ import annotations

import logging
import sys

CONTINUED = "    | "
"""The start of each further line of a multi-line log record."""


def skip_the_iri_grammar() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, as if it were not
    installed. Call before anything imports jsonschema; a no-op if something already did."""
    sys.modules.setdefault("rfc3987_syntax", None)


def alembic_head() -> str:
    """The newest revision of nbgrader's gradebook schema, what ``alembic heads`` prints."""
    from alembic.script import ScriptDirectory
    from nbgrader import dbutil

    return ScriptDirectory(dbutil.ALEMBIC_DIR).get_current_head()


def read_the_alembic_head_in_process() -> None:
    """Make nbgrader stamp a new gradebook with :func:`alembic_head` instead of a subprocess."""
    from nbgrader import api

    api.get_alembic_version = alembic_head


def indent_continued_lines() -> None:
    """Make every log record's lines after the first start with :data:`CONTINUED`."""
    format_record = logging.Formatter.format

    def format_indented(self, record):
        return format_record(self, record).replace("\n", "\n" + CONTINUED)

    logging.Formatter.format = format_indented


def main() -> None:
    skip_the_iri_grammar()
    indent_continued_lines()
    read_the_alembic_head_in_process()
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv[0] = "nbgrader"
    nbgrader_main()


if __name__ == "__main__":
    main()
