"""What distlab's call recorder adds to each torch.distributed call inside a rank.

On every rank, distlab wraps torch.distributed's functions (distlab.tools.comm) to count bytes
and to keep state-<rank>.json saying which call the rank is in, so that a timeout can name
it (distlab.runtime.rank_state). This prints, from one run, the median time per call of
``dist.all_reduce`` on a small tensor (latency-bound: the overhead shows most) through the
wrapper and through torch's own function, alternating blocks of --calls calls, and the ratio
(target: at most 1.5); then the same for the launch of an async all-reduce alone, which is
what a DDP gradient hook pays while backward waits for it (target: at most 2; it was 25
when every call wrote the state file, before distlab.runtime.rank_state).
"""

from __future__ import annotations

import argparse
import statistics
import time

import distlab

TARGETS = {"": 1.5, ", async launch": 2.0}


def time_calls(calls: int, blocks: int, numel: int) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from distlab.tools import comm

    variants = {"through distlab's recorder": dist.all_reduce, "torch's own all_reduce": comm.original("all_reduce")}
    tensor = torch.ones(numel)
    times = {f"{name}{what}": [] for name in variants for what in ("", ", async launch")}
    for _ in range(blocks):
        for name, all_reduce in variants.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                all_reduce(tensor)
            times[name].append((time.perf_counter() - start) / calls)
            launches = []
            for _ in range(calls):
                start = time.perf_counter()
                work = all_reduce(tensor, async_op=True)
                launches.append(time.perf_counter() - start)
                work.wait()
            times[f"{name}, async launch"].append(statistics.median(launches))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--numel", type=int, default=256)
    args = parser.parse_args()
    per_rank = distlab.run(time_calls, args.calls, args.blocks, args.numel, nprocs=args.nprocs, timeout=600)
    medians = {name: statistics.median(v for rank in per_rank for v in rank[name]) for name in per_rank[0]}
    print(f"all_reduce of {args.numel} float32 on {args.nprocs} ranks, median per call "
          f"({args.blocks} blocks of {args.calls} calls, all ranks)")
    for name, seconds in medians.items():
        print(f"  {name:<44} {seconds * 1e6:9.1f} µs")
    for what, target in TARGETS.items():
        ratio = medians[f"through distlab's recorder{what}"] / medians[f"torch's own all_reduce{what}"]
        print(f"  recorder / torch's own{what or ', blocking call'}: {ratio:.2f} (target <= {target})")


if __name__ == "__main__":
    main()
