"""How much does distlab add on top of a bare torchrun launch?

Prints, from one run of this script (medians over --repeat launches each):

* bare ``torchrun --standalone --nproc-per-node=N`` of a script that only joins a gloo
  process group and calls a barrier;
* ``distlab.run(noop, nprocs=N)``, which does the same plus pickling the function, the
  result files, output streaming and cleanup;
* their ratio (the target is at most 1.3);
* ``distlab.run(noop, launcher="fork")``: ranks forked from one process that imported torch
  once (what the grader's clean room uses), in wall-clock time and in CPU time of all the
  processes a launch starts, each as a ratio to torchrun's (CPU is what a busy grading
  machine runs out of);
* the same fork launch, its agent one of the spares this process forked in advance
  (:mod:`distlab.runtime.launchers.spares`, what the clean room does): wall and CPU as a
  ratio to a fork launch whose agent is a new process;
* ``pool.run(noop)`` on a warm :class:`distlab.Pool` (target: at most 0.5 s);
* a notebook-like sequence of ``--cells`` cells, each a small all_reduce: cold (one launch
  per cell) next to pooled (one launch, then warm calls), and their ratio.

Usage: ``python benchmarks/launch.py [--nprocs 4] [--repeat 5]``. On 2 cores the noise
between launches is large (all ranks import torch at once), hence medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import distlab
from distlab.runtime.launchers import spares
from distlab.runtime.launchers.forked import preload

BARE_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def noop():
    return None


def small_all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    dist.all_reduce(t)
    return t[0].item()


def time_it(fn, repeat: int, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock seconds of each of ``repeat`` calls; with ``cpu``, also appends to it the CPU
    seconds of the processes each call started and waited for (ranks, agents)."""
    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return times


def bare_torchrun(script: str, nprocs: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nprocs}", script], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20)
    args = parser.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(BARE_SCRIPT)
    cpu_torchrun, cpu_forked = [], []
    try:
        rows = {
            "bare torchrun (init gloo + barrier)": time_it(lambda: bare_torchrun(f.name, args.nprocs), args.repeat),
            "distlab.run(noop)": time_it(lambda: distlab.run(noop, nprocs=args.nprocs), args.repeat, cpu_torchrun),
            "distlab.run(noop, launcher='fork')": time_it(
                lambda: distlab.run(noop, nprocs=args.nprocs, launcher="fork"), args.repeat, cpu_forked),
        }
    finally:
        os.unlink(f.name)
    cpu_spare = []
    preload(pool=False)           # what a fork agent imports, once, before the spares are forked
    made = spares.keep(args.repeat)
    spare_times = time_it(lambda: distlab.run(noop, nprocs=args.nprocs, launcher="fork"), made, cpu_spare)
    start = time.perf_counter()
    with distlab.Pool(nprocs=args.nprocs) as pool:
        pool_start = time.perf_counter() - start
        pool.run(noop)
        rows["pool.run(noop), warm"] = time_it(lambda: pool.run(noop), args.repeat)

    print(f"{args.nprocs} ranks on {os.cpu_count()} cores, median of {args.repeat} launches each")
    for name, times in rows.items():
        print(f"  {name:<40} {statistics.median(times):7.3f} s   (min {min(times):.3f}, max {max(times):.3f})")
    bare, ours, forked, pooled = (statistics.median(t) for t in rows.values())
    print(f"  ratio distlab.run / bare torchrun          {ours / bare:7.2f}   (target <= 1.3)")
    cpu_ours, cpu_fork = statistics.median(cpu_torchrun), statistics.median(cpu_forked)
    print(f"  CPU per launch: torchrun {cpu_ours:.1f} s, fork {cpu_fork:.1f} s")
    print(f"  ratio fork / torchrun: wall {forked / ours:.2f}, CPU {cpu_fork / cpu_ours:.2f}")
    if made:
        spare, cpu_of_spare = statistics.median(spare_times), statistics.median(cpu_spare)
        print(f"  fork, agent a spare ({made} launches)         {spare:7.3f} s   CPU {cpu_of_spare:.2f} s")
        print(f"  ratio spare / new agent: wall {spare / forked:.2f}, CPU {cpu_of_spare / cpu_fork:.2f}")
    else:
        print("  no spare agent could be made (this process runs threads)")
    print(f"  pool start (once)                          {pool_start:7.3f} s")

    cold = time_it(lambda: [distlab.run(small_all_reduce, nprocs=args.nprocs) for _ in range(args.cells)], 1)[0]

    def pooled_sequence():
        with distlab.Pool(nprocs=args.nprocs) as pool:
            for _ in range(args.cells):
                pool.run(small_all_reduce)
    warm = time_it(pooled_sequence, 1)[0]
    print(f"{args.cells} cells, each an all_reduce of 1024 floats on {args.nprocs} ranks:")
    print(f"  cold (a launch per cell)                   {cold:7.2f} s")
    print(f"  pooled (one launch, then warm calls)       {warm:7.2f} s")
    print(f"  ratio cold / pooled                        {cold / warm:7.1f}")


if __name__ == "__main__":
    main()
