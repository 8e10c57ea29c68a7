"""How long autograding takes: per assignment on one machine, and a class on the cluster.

    python benchmarks/autograde.py                 # or: make bench-autograde
    python benchmarks/autograde.py --cluster [--students N]
    python benchmarks/autograde.py --room [--rounds N]

Per assignment: for every assignment in solutions/, in a throw-away course (its own work
folder, the real nbgrader config), this grades one correct submission alone, then a class of
three (correct, blank, and correct again), through ``python -m distlab.grade`` as an instructor
would, and prints the seconds, split into nbgrader's own start-up, the kernel run and the
clean room. Target: at most 60 s per chapter notebook on 2 cores.

``--against GIT_REF [SLUG ...]``: the same one-submission grading, of these assignments (default:
all), also with the code and notebooks of ``GIT_REF`` (``git archive``'d into a temporary
folder), alternately, twice each, and the ratio of the mean times: how much a change
costs a notebook's grading (issue 43's relay: ``--against <the commit before it> 00-first-steps
02-collectives 03-ddp``; target: within 20 %).

``--cluster``: a class of N correct submissions of chapter 0, graded three ways into a
PostgreSQL gradebook: serially on this machine, with ``--slurm`` on one node of the private
cluster, and with ``--slurm`` on both nodes. The cluster runs with its cores split
(``DISTLAB_CLUSTER_SPLIT_CORES=1``: each node has its own half of this machine's cores, one job
at a time), so that two nodes have twice the machine of one, as on a real cluster. Prints
students per minute for each and the two-node speed-up (target: at least 1.7x), and checks the
guide's wall-time model ``T(N, K) = c + ceil(N / K) * t_job`` (one job per node at a time): ``c``
and ``t_job`` come from the one-node run, the model predicts the two-node run.

``--room``: what each graded rank's private room (:mod:`distlab.grade.boundary.rank_room`) costs. One
correct submission of chapters 0, 2 and 3 is graded with the rooms and without them
(``DISTLAB_RANK_ROOM=off``), alternately, N rounds each, and the ratio of the median times is
printed per chapter (target: at most 1.20).
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


def grade(work: Path, *args: str, env: dict | None = None, repo: Path = REPO) -> tuple[float, str]:
    env = dict(os.environ, DISTLAB_GRADE_WORK=str(work), **(env or {}))
    if repo != REPO:   # another checkout's package first, for the grader and for its ranks
        env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "distlab.grade", *args], cwd=repo, env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"`grade {' '.join(args)}` failed:\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc.stdout + proc.stderr


def clean_room_seconds(log: str) -> float:
    return sum(float(s) for s in re.findall(r"Clean room finished in ([0-9.]+) s", log))


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", action="store_true", help="a class on the private Slurm cluster")
    parser.add_argument("--students", type=int, default=6, help="class size for --cluster (default 6)")
    parser.add_argument("--room", action="store_true", help="grading time with the ranks' rooms / without")
    parser.add_argument("--rounds", type=int, default=2, help="gradings of each kind per chapter for --room")
    parser.add_argument("--against", metavar="GIT_REF", help="compare with the grading of GIT_REF, as a ratio")
    parser.add_argument("slugs", nargs="*", help="with --against: only these assignments")
    args = parser.parse_args()
    if args.cluster:
        return cluster_benchmark(args.students)
    if args.room:
        return room_benchmark(args.rounds)
    if args.against:
        return against(args.against, args.slugs)
    per_assignment()


def one_submission(repo: Path, slug: str) -> float:
    """Seconds to autograde the solution of ``slug`` alone, with ``repo``'s code and notebooks."""
    root = Path(tempfile.mkdtemp(prefix="distlab-bench-grade-"))
    try:
        work = root / "work"
        grade(work, "release", slug, "--to", str(work / "release"), repo=repo)
        (root / "incoming" / "s1").mkdir(parents=True)
        shutil.copy(repo / "solutions" / slug / f"{slug}.ipynb", root / "incoming" / "s1" / f"{slug}.ipynb")
        grade(work, "collect", slug, "--from", str(root / "incoming"), repo=repo)
        seconds, _ = grade(work, "autograde", slug, repo=repo)
        return seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


def against(ref: str, slugs: list[str]) -> None:
    """This checkout's grading next to ``ref``'s, alternately, twice per assignment: the ratio."""
    slugs = slugs or sorted(p.name for p in (REPO / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())
    other = Path(tempfile.mkdtemp(prefix="distlab-bench-ref-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
    try:
        print(f"{'assignment':<20} {ref[:12] + ' s':>14} {'this s':>8} {'ratio':>7}")
        for slug in slugs:
            times = {"ref": [], "this": []}
            for _ in range(2):
                times["ref"].append(one_submission(other, slug))
                times["this"].append(one_submission(REPO, slug))
            ref_s, this_s = (sum(t) / len(t) for t in (times["ref"], times["this"]))
            print(f"{slug:<20} {ref_s:14.1f} {this_s:8.1f} {this_s / ref_s:6.2f}x", flush=True)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def cluster_benchmark(students: int) -> None:
    import math
    import statistics

    sys.path.insert(0, str(REPO / "scripts"))
    import postgres_server
    import slurm_cluster

    slug, target = "00-first-steps", 1.7
    root = Path(tempfile.mkdtemp(prefix="distlab-bench-cluster-", dir="/tmp"))
    split = dict(os.environ, **{slurm_cluster.SPLIT_CORES_VARIABLE: "1"})
    try:
        # the server runs as nobody: its folder must not be inside our private one; it listens
        # where the nodes reach this machine (the cluster's network, scripts/cluster_network.py)
        with slurm_cluster.running_cluster(root / "c", env=split) as cluster, \
                postgres_server.running_postgres(Path(tempfile.mkdtemp(prefix="distlab-pg-", dir="/tmp")),
                                                 address=cluster["network"]["controller_address"],
                                                 clients=cluster["network"].get("subnet")) as pg:
            os.environ["SLURM_CONF"] = cluster["slurm_conf"]
            env = {"DISTLAB_GRADE_DB_URL": pg.url}
            work = root / "work"
            grade(work, "release", slug, env=env)
            incoming = root / "incoming"
            for i in range(students):
                (incoming / f"s{i:02d}").mkdir(parents=True)
                shutil.copy(REPO / "solutions" / slug / f"{slug}.ipynb", incoming / f"s{i:02d}" / f"{slug}.ipynb")
            grade(work, "collect", slug, "--from", str(incoming), env=env)
            print(f"{students} students, {slug}; machine: {len(os.sched_getaffinity(0))} cores; "
                  f"each node: {len(slurm_cluster.node_cores(0))} core(s), one job at a time")
            runs = {}
            for label, args in (("serial, this machine (all cores)", ["autograde", slug]),
                                ("--slurm, 1 node", ["autograde", slug, "--slurm", "--regrade", "--cpus",
                                                     str(len(slurm_cluster.node_cores(0))), "--partition",
                                                     slurm_cluster.NODES[0]]),
                                ("--slurm, 2 nodes", ["autograde", slug, "--slurm", "--regrade", "--cpus",
                                                      str(len(slurm_cluster.node_cores(0)))])):
                seconds, log = grade(work, *args, env=env)
                jobs = [float(s) for s in re.findall(r": [0-9.]+ / [0-9.]+ \(([0-9.]+) s on ", log)]
                runs[label] = (seconds, jobs)
                print(f"{label:<36} {seconds:7.1f} s  {60 * students / seconds:5.2f} students/min"
                      + (f"  (job {statistics.median(jobs):.1f} s median)" if jobs else ""), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    (one, one_jobs), (two, _) = runs["--slurm, 1 node"], runs["--slurm, 2 nodes"]
    speedup = one / two
    print(f"two nodes / one node: {speedup:.2f}x ({'meets' if speedup >= target else 'BELOW'} the {target}x target)")
    t_job = statistics.mean(one_jobs)
    c = one - students * t_job
    predicted = c + math.ceil(students / 2) * t_job
    print(f"model T(N, K) = c + ceil(N/K) * t_job with c = {c:.1f} s, t_job = {t_job:.1f} s (1-node run): "
          f"2 nodes predicted {predicted:.1f} s, measured {two:.1f} s ({100 * (two - predicted) / two:+.0f}%)")


def room_benchmark(rounds: int, target: float = 1.2) -> None:
    import statistics

    print(f"machine: {os.cpu_count()} cores; one correct notebook, {rounds} gradings with and without rooms")
    for slug in ("00-first-steps", "02-collectives", "03-ddp"):
        root = Path(tempfile.mkdtemp(prefix="distlab-bench-room-"))
        try:
            work = root / "work"
            grade(work, "release", slug, "--to", str(work / "release"))
            (root / "in" / "s1").mkdir(parents=True)
            shutil.copy(REPO / "solutions" / slug / f"{slug}.ipynb", root / "in" / "s1" / f"{slug}.ipynb")
            grade(work, "collect", slug, "--from", str(root / "in"))
            times: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(rounds):
                for room in ("off", "on"):   # alternately: a change in the machine's load hits both
                    seconds, _ = grade(work, "autograde", slug, env={"DISTLAB_RANK_ROOM": room})   # --force: again
                    times[room].append(seconds)
            on, off = statistics.median(times["on"]), statistics.median(times["off"])
            print(f"{slug:<20} with rooms {on:6.1f} s, without {off:6.1f} s: ratio {on / off:.2f} "
                  f"({'within' if on / off <= target else 'OVER'} {target:.2f})", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def per_assignment() -> None:
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
