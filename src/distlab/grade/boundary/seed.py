"""The seed hidden tests draw their inputs from, chosen where a student's code cannot reach it.

A hidden test asks :func:`distlab.grade.checks.grading_seed` for it. In a student's notebook it
stays :data:`FIXED`, so runs are reproducible; the clean room (:mod:`distlab.grade.boundary.cleanroom`)
draws a fresh one for every submission in its own process before any test runs, so inputs read
from a test file on disk are of no use. It lives here, beside the clean room that sets it, so
that the boundary needs nothing from :mod:`distlab.grade.checks`, which builds on the boundary.
"""

from __future__ import annotations

import secrets

FIXED = 20240601
"""The seed outside grading."""

_current = FIXED


def current() -> int:
    """The seed in effect in this process."""
    return _current


def draw_fresh() -> int:
    """A new seed for this process (the clean room's, once per submission); returns it."""
    global _current
    _current = secrets.randbelow(2**31)
    return _current
