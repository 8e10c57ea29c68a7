"""What the grader's process cap costs: one count of a capped process's descendants, two ways.

    python benchmarks/watchdog.py

The watchdog of :func:`distlab.grade.boundary.limits.apply` counts the descendants of every capped rank
and kernel 50 times a second. This prints the CPU time of one count made by walking the
process's own part of the tree (``/proc/<pid>/task/<tid>/children``, what the watchdog does)
and by psutil's ``children(recursive=True)`` (which reads every process on the machine), side
by side in one run, for a process with three children, and what each would cost an idle rank:
the share of a core spent counting at 50 counts a second.
"""

from __future__ import annotations

import subprocess
import time

import psutil

from distlab.grade.boundary import limits

COUNTS = 500
PER_SECOND = 1 / limits.WATCH_INTERVAL_S


def cpu_per_count(count) -> float:
    start = time.process_time()
    for _ in range(COUNTS):
        count()
    return (time.process_time() - start) / COUNTS


def main() -> None:
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        time.sleep(0.2)
        walk = cpu_per_count(limits.live_descendant_count)
        scan = cpu_per_count(lambda: len(limits.descendants()))
    finally:
        for child in children:
            child.kill()
            child.wait()
    print(f"{len(psutil.pids())} processes on this machine, 3 children, {COUNTS} counts each way")
    print(f"  walk of our own tree (the watchdog): {walk * 1e3:7.3f} ms per count, "
          f"{walk * PER_SECOND:6.1%} of a core at {PER_SECOND:.0f} counts/s")
    print(f"  psutil, every process read:          {scan * 1e3:7.3f} ms per count, "
          f"{scan * PER_SECOND:6.1%} of a core")
    print(f"  ratio psutil / walk: {scan / walk:.1f}")


if __name__ == "__main__":
    main()
