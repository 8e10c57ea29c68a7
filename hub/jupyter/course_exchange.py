"""nbgrader's submit, comparing the notebooks it hands in (not every notebook in the folder) with the release.

Why it exists. JupyterLab keeps a checkpoint of every notebook a student opens in a hidden
folder beside it, ``.ipynb_checkpoints/<name>-checkpoint.ipynb``. nbgrader's submit already
leaves that folder out of the copy it puts in the exchange (``CourseDirectory.ignore``, whose
defaults name it; hub/jupyter/nbgrader_config.py names them again). But before copying, it
compares the folder's notebooks with the released ones without that setting, so every
hand-in from a fetched assignment opened in JupyterLab logged a warning::

    Possible missing notebooks and/or extra notebooks submitted for assignment 00-first-steps:
        ... .ipynb_checkpoints/00-first-steps-checkpoint.ipynb: EXTRA

at the student's terminal (``nbgrader submit``) or in the server's job log (the Assignments
tab), about a file that was never handed in. A real extra or missing notebook still warns (or,
with nbgrader's ``strict``, refuses): that comparison is nbgrader's own, on the files the
exchange gets.

Loaded by nbgrader_config.py (``ExchangeFactory.submit``), which the students' servers and
their nbgrader commands read.
"""

from __future__ import annotations

import os

from nbgrader.exchange.default.submit import ExchangeSubmit
from nbgrader.utils import find_all_files


def notebooks_copied(folder: str, ignore: list[str]) -> list[str]:
    """The notebooks below ``folder`` that a copy with nbgrader's ``ignore`` globs keeps,
    relative to it and sorted (nbgrader's ``find_all_notebooks``, less the ignored)."""
    root = os.path.abspath(folder)
    return sorted(os.path.relpath(path, root) for path in find_all_files(root, exclude=ignore)
                  if os.path.splitext(path)[1] == ".ipynb")


class SubmitWhatIsCopied(ExchangeSubmit):
    """``nbgrader submit`` whose check for missing and extra notebooks skips the files that
    ``CourseDirectory.ignore`` keeps out of the hand-in."""

    def check_filename_diff(self) -> None:
        released = notebooks_copied(self.release_path, self.coursedir.ignore)
        submitted = notebooks_copied(self.src_path, self.coursedir.ignore)
        missing = [name for name in released if name not in submitted]
        extra = [name for name in submitted if name not in released]
        if not missing and not extra:
            return
        diff = ("Expected:\n\t" + "\n\t".join(f"{n}: {'MISSING' if n in missing else 'FOUND'}" for n in released)
                + "\nSubmitted:\n\t" + "\n\t".join(f"{n}: {'EXTRA' if n in extra else 'OK'}" for n in submitted))
        if missing and self.strict:
            self.fail(f"Assignment {self.coursedir.assignment_id} not submitted. "
                      f"There are missing notebooks for the submission:\n{diff}")
        self.log.warning("Possible missing notebooks and/or extra notebooks submitted for assignment "
                         f"{self.coursedir.assignment_id}:\n{diff}")
