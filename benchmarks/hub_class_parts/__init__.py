"""The parts of benchmarks/hub_class.py (a whole class at a deadline on the course hub), one job each.

- :mod:`.student`: one simulated student, what they did and the marker their notebook carries;
- :mod:`.lab`: a student in the lab through the hub: log in, Start, open chapter 0, run a cell, log off;
- :mod:`.kernel`: a kernel's websocket as JupyterLab holds it, and a cell sent through it;
- :mod:`.hand_in`: the hand-in and the feedback, as the student's own Unix user, in a process group
  that has ended when the call returns;
- :mod:`.instructor`: the instructor's commands, and what they collected and graded;
- :mod:`.meter`: what the machine does meanwhile (memory, the hub's CPU), and what the course left behind;
- :mod:`.report`: the invariants the run broke, and the figures printed.

Importing the package puts the tests' folders of support modules, ``hub`` and ``scripts`` on
``sys.path``: the parts use the course hub (hub/demo.py), the grading helpers of the tests and
the PostgreSQL gradebook (scripts/postgres_server.py), as the benchmark always has.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
for folder in ("tests/book", "tests/grade", "tests/hub", "tests/runtime", "hub", "scripts"):
    sys.path.insert(0, str(REPO / folder))
