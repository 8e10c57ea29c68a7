"""The verdict and the printout of benchmarks/hub_class.py: the invariants a run broke, and its
figures, one line each (spawn and first-cell times as p50, p95 and max; memory; the hub's CPU)."""

from __future__ import annotations

import math
import os
import statistics

from .student import FULL_MARKS, SLUG

SPAWN_TARGET_S = 60.0


GIB = 1024 ** 3


MIB = 1024 ** 2


def percentiles(values: list[float]) -> dict:
    """p50, p95 (nearest rank: the value 95% of the class did not exceed) and max; {} if none."""
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}


def failures(figures: dict) -> list[str]:
    """The invariants the run broke (empty: none)."""
    n, broken = figures["students"], []
    if figures["served"] != n:
        broken.append(f"served {figures['served']} of {n}")
    if figures["cells_ok"] != n:
        broken.append(f"the %%distributed cell ran right for {figures['cells_ok']} of {n}")
    if figures["submissions_made"] != n:
        broken.append(f"{figures['submissions_made']} of {n} submissions made")
    if figures["submissions_collected"] != figures["submissions_made"]:
        broken.append(f"collected {figures['submissions_collected']}, made {figures['submissions_made']}")
    if figures["misattributed"]:
        broken.append(f"mis-attributed: {figures['misattributed']}")
    if figures["grades_as_expected"] != figures["grades_expected"]:
        broken.append(f"grades as expected {figures['grades_as_expected']} of {figures['grades_expected']}")
    if figures["feedback_fetched"] != n:
        broken.append(f"{figures['feedback_fetched']} of {n} fetched their own feedback")
    if figures["left_behind"]:
        broken.append(f"{len(figures['left_behind'])} process(es) of the course left behind")
    return broken


def seconds(figure: dict) -> str:
    if not figure:
        return "-"
    return f"p50 {figure['p50']:.1f} s  p95 {figure['p95']:.1f} s  max {figure['max']:.1f} s  (n={figure['n']})"


def report(f: dict) -> None:
    """Print the figures, one line each, as the issue asks for them."""
    n, total = f["students"], f["memory_total_bytes"]
    declared = f["cluster_cpus_per_node"]
    print(f"\nhub_class: a class of {n} at a deadline, {SLUG}; this machine: {os.cpu_count()} cores, "
          f"{total / GIB:.1f} GiB; cluster: 2 nodes x {declared or os.cpu_count()} CPUs"
          + (" declared (the servers share the real cores)" if declared else ""))
    print(f"served            {f['served']} of {n}" + (f"; refused: {f['refused']}" if f["refused"] else ""))
    print(f"log-in (API)      {seconds(f['login_s'])}")
    spawn = f["spawn_s"]
    verdict = "meets" if spawn and spawn["p95"] <= SPAWN_TARGET_S else "MISSES"
    print(f"spawn             {seconds(spawn)}   target p95 <= {SPAWN_TARGET_S:.0f} s: {verdict}")
    print(f"chapter opened    {seconds(f['open_s'])}   (launch link; {f['fetched_by_link']} fetched by it)")
    print(f"%load_ext distlab {seconds(f['load_ext_s'])}")
    print(f"first cell        {seconds(f['first_cell_s'])}   (%%distributed -n 2 in the server's job: "
          f"{f['cells_ok']} of {n} right; kernel websockets reopened: {sum(f['reconnects'].values())}, "
          f"by {len(f['reconnects'])} students)")
    spread = f"{f['submit_spread_s']:.1f} s" if f["submit_spread_s"] is not None else "-"
    print(f"submissions       made {f['submissions_made']}, collected {f['submissions_collected']} (must be equal); "
          f"mis-attributed {len(f['misattributed'])}; all handed in within {spread}")
    print(f"submit            {seconds(f['submit_s'])}   (fetch and submit as the student, all at once; "
          f"ended at {f['nbgrader_timeout_s']:g} s)")
    print(f"grades            {f['grades_as_expected']} of {f['grades_expected']} as expected "
          f"({(n + 1) // 2} correct: {FULL_MARKS:g}, {n // 2} blank: 0)")
    print(f"feedback          {f['feedback_fetched']} of {n} fetched their own")
    print(f"hub process       CPU {f['hub_cpu_s']:.1f} s in all ({f['hub_cpu_class_s']:.1f} s from log-in to the "
          f"last submission); RSS {f['hub_rss_bytes'] / MIB:.0f} MiB, peak {f['hub_rss_peak_bytes'] / MIB:.0f} MiB")
    peaks = f["memory_peak_bytes"]
    class_peak = peaks.get("class", 0)
    per_student = (class_peak - f["memory_hub_up_bytes"]) / n
    holds = int((total - f["memory_hub_up_bytes"]) / per_student) if per_student > 0 else 0
    print(f"memory            in use before {f['memory_baseline_bytes'] / GIB:.1f} GiB, hub up "
          f"{f['memory_hub_up_bytes'] / GIB:.1f} GiB, all servers up {f['memory_with_servers_bytes'] / GIB:.1f} GiB; "
          f"peak {class_peak / GIB:.1f} GiB in class, {peaks.get('grading', 0) / GIB:.1f} GiB grading "
          f"(of {total / GIB:.1f} GiB)")
    print(f"                  about {per_student / GIB:.2f} GiB per student at the peak: this machine's memory "
          f"holds about {holds} such students")
    print("phases            " + ", ".join(f"{k} {v:.0f} s" for k, v in f["phases_s"].items()))
    print(f"left behind       {len(f['left_behind'])} process(es)")
    for name, errors in f["errors"].items():
        print(f"  {name}: {'; '.join(errors)[:400]}")
    print("result            " + ("all invariants hold" if not f["failures"] else "FAILED: " + "; ".join(f["failures"])))
