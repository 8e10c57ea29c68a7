"""One simulated student of benchmarks/hub_class.py: what they did, how long each step took, and
the marker line their notebook carries so that whoever reads a submission knows its author."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import grading_support
import requests

SLUG = grading_support.SLUG
FULL_MARKS = 6.0


@dataclass
class Student:
    """A simulated student: what they did and how long each step took (None: not reached)."""
    name: str
    password: str
    correct: bool                      # hands in the solution (else the blank release)
    api: requests.Session = field(default_factory=requests.Session, repr=False)
    login_s: float | None = None
    spawn_s: float | None = None
    open_s: float | None = None        # launch link: nbgitpuller, fetch, the notebook's kernel
    load_ext_s: float | None = None    # kernel ready and distlab imported
    cell_s: float | None = None        # the %%distributed -n 2 cell
    cell_ok: bool = False
    reconnects: int = 0                # kernel websockets that dropped or did not open in time
    fetched_by_link: bool = False
    submitted: bool = False
    submitted_at: float | None = None
    submit_s: float | None = None     # the hand-in's nbgrader commands, start to the end of their group
    submit_ended: bool = False         # no process of the hand-in was left running
    feedback_ok: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def marker(self) -> str:
        """The line their notebook carries, so that whoever reads a submission knows its author."""
        return f"Handed in by {self.name} for the hub-class benchmark."

    @property
    def expected_score(self) -> float:
        return FULL_MARKS if self.correct else 0.0


def authors(text: str) -> list[str]:
    """The students a notebook or feedback page names as its author (their markers in it)."""
    return re.findall(r"Handed in by (\S+) for the hub-class benchmark", text)
