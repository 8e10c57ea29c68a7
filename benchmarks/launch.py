"""How much does distlab add on top of a bare torchrun launch?

Prints, from one run of this script (medians over --repeat launches each):

* bare ``torchrun --standalone --nproc-per-node=N`` of a script that only joins a gloo
  process group and calls a barrier;
* ``distlab.run(noop, nprocs=N)``, which does the same plus pickling the function, the
  result files, output streaming and cleanup;
* their ratio (the target is at most 1.3).

Usage: ``python benchmarks/launch.py [--nprocs 4] [--repeat 5]``. On 2 cores the noise
between launches is large (all ranks import torch at once), hence medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import distlab

BARE_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def noop():
    return None


def time_it(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
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
    args = parser.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(BARE_SCRIPT)
    try:
        rows = {
            "bare torchrun (init gloo + barrier)": time_it(lambda: bare_torchrun(f.name, args.nprocs), args.repeat),
            "distlab.run(noop)": time_it(lambda: distlab.run(noop, nprocs=args.nprocs), args.repeat),
        }
    finally:
        os.unlink(f.name)

    print(f"{args.nprocs} ranks on {os.cpu_count()} cores, median of {args.repeat} launches each")
    for name, times in rows.items():
        print(f"  {name:<40} {statistics.median(times):6.2f} s   (min {min(times):.2f}, max {max(times):.2f})")
    bare, ours = (statistics.median(t) for t in rows.values())
    print(f"  ratio distlab.run / bare torchrun          {ours / bare:6.2f}   (target <= 1.3)")


if __name__ == "__main__":
    main()
