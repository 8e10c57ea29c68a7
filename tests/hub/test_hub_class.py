"""A small class at a deadline on the course hub: benchmarks/hub_class.py with 3 students.

The benchmark brings up its own course (hub/demo.py's ``course_hub``, prefix ``dlk``: accounts,
a private Slurm cluster sized for the class, the hub, a PostgreSQL gradebook) and takes it all
down again. Three students (an odd class: two servers on one node, one on the other) log in
through the hub's API, start their servers at once, open chapter 0 through the book's launch
link and run a ``%%distributed -n 2`` cell in their server's Slurm job; at the deadline two
hand in the solution and one the blank notebook. The instructor
collects, grades on the cluster (``autograde --slurm``), makes and returns feedback, and each
student fetches theirs. Here the invariants are asserted on the figures ``main`` returns; the
timing targets belong to the full-size run (``python benchmarks/hub_class.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hub_support
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import hub_class  # noqa: E402

STUDENTS = 3  # an odd class: two servers on one node, one on the other
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a hang guard: about 4 minutes on 2 cores


def test_a_class_hands_in_at_the_deadline_and_everyone_gets_their_own_grade():
    figures = hub_class.main(["--students", str(STUDENTS), "--course", hub_support.course_name(hub_class.COURSE),
                              "--artifacts", str(REPO / "artifacts" / "hub-class")])
    detail = {k: figures[k] for k in ("failures", "errors", "refused", "phases_s")}
    assert figures["served"] == STUDENTS, detail                       # none refused: the cluster fits them
    assert figures["cells_ok"] == STUDENTS, detail                     # ranks ran as steps of each server's job
    assert figures["fetched_by_link"] == STUDENTS, detail              # the launch link fetched the assignment
    assert figures["submissions_made"] == STUDENTS, detail
    assert figures["submissions_collected"] == figures["submissions_made"], detail
    assert figures["misattributed"] == [], detail
    expected = {name: (hub_class.FULL_MARKS if i % 2 == 0 else 0.0, 0.0)
                for i, name in enumerate(sorted(figures["grades"], key=lambda n: int(n.rsplit("student", 1)[1])))}
    assert figures["grades"] == expected, detail                       # half full marks, half blank, none late
    assert figures["feedback_fetched"] == STUDENTS, detail             # each got their own, with their score
    assert figures["left_behind"] == [], detail                        # no process of the course survives it
    assert figures["failures"] == [], detail
    assert figures["spawn_s"]["n"] == STUDENTS and figures["first_cell_s"]["n"] == STUDENTS
    assert figures["submit_s"]["n"] == STUDENTS                         # every hand-in ended before the deadline
