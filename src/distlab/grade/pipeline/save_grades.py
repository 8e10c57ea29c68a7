"""nbgrader's ``SaveAutoGrades``, writing each student's scores in one transaction (an nbgrader
plugin of the course, installed by ``grader/nbgrader_config.py`` through :mod:`distlab.grade.pipeline.nbplugins`)."""

from __future__ import annotations

from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor, SaveAutoGrades


class SaveAutoGradesAtOnce(SaveAutoGrades):
    """nbgrader's ``SaveAutoGrades``, writing a student's scores and comments in one transaction.

    nbgrader commits after every cell, so a grading job killed halfway (a node failure, a
    time limit) left some cells with this run's scores and the rest with the last run's or
    none. Here each cell's write is only flushed (sent to the database inside the open
    transaction); the commit comes once, after the last cell, and an error rolls the whole
    student back. A server database (``DISTLAB_GRADE_DB_URL``) also makes the write atomic
    for other readers: they see all of this student's new scores or none.
    """

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        self.notebook_id, self.assignment_id = info["notebook"], info["assignment"]
        self.student_id, self.db_url = info["student"], info["db_url"]
        self.gradebook = Gradebook(self.db_url)
        with self.gradebook:
            session = self.gradebook.db
            session.commit = session.flush  # for the cells below: write, but do not commit yet
            try:
                nb, resources = NbGraderPreprocessor.preprocess(self, nb, resources)
            except BaseException:
                session.rollback()
                raise
            finally:
                del session.commit         # the session's own commit again
            session.commit()
        return nb, resources
