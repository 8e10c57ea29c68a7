"""How long autograding takes: one submission of each assignment, and a class of three.

    python benchmarks/autograde.py            # or: make bench-autograde

For every assignment in solutions/, in a throw-away course (its own work folder, the real
nbgrader config), this grades one correct submission alone, then a class of three (correct,
blank, and correct again), through ``python -m distlab.grade`` as an instructor would, and
prints the seconds, split into nbgrader's own start-up, the kernel run and the clean room.
Target: at most 60 s per chapter notebook on 2 cores.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def grade(work: Path, *args: str) -> tuple[float, str]:
    env = dict(os.environ, DISTLAB_GRADE_WORK=str(work))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "distlab.grade", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"`grade {' '.join(args)}` failed:\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc.stdout + proc.stderr


def clean_room_seconds(log: str) -> float:
    return sum(float(s) for s in re.findall(r"Clean room finished in ([0-9.]+) s", log))


def main() -> None:
    slugs = sorted(p.name for p in (REPO / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())
    print(f"machine: {os.cpu_count()} cores; target {TARGET_S:.0f} s per notebook")
    print(f"{'assignment':<20} {'what':<28} {'total s':>8} {'per nb s':>9} {'clean room s':>13}")
    worst = 0.0
    for slug in slugs:
        root = Path(tempfile.mkdtemp(prefix="distlab-bench-grade-"))
        try:
            work = root / "work"
            grade(work, "release", slug, "--to", str(work / "release"))
            solution = (REPO / "solutions" / slug / f"{slug}.ipynb").read_bytes()
            blank = (work / "release" / slug / f"{slug}.ipynb").read_bytes()
            for label, students in (("one submission", {"s1": solution}),
                                    ("class of 3 (full, blank, full)", {"s1": solution, "s2": blank, "s3": solution})):
                incoming = root / f"incoming-{len(students)}"
                for student, data in students.items():
                    (incoming / student).mkdir(parents=True, exist_ok=True)
                    (incoming / student / f"{slug}.ipynb").write_bytes(data)
                grade(work, "collect", slug, "--from", str(incoming))
                seconds, log = grade(work, "autograde", slug)
                per = seconds / len(students)
                worst = max(worst, per)
                print(f"{slug:<20} {label:<28} {seconds:8.1f} {per:9.1f} {clean_room_seconds(log):13.1f}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    verdict = "within" if worst <= TARGET_S else "OVER"
    print(f"slowest: {worst:.1f} s per notebook ({verdict} the {TARGET_S:.0f} s target)")


if __name__ == "__main__":
    main()
