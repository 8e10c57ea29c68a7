"""The book's two ring all-reduces (point-to-point messages in Python) next to gloo's built-in all_reduce.

The simple ring (distlab.collectives.all_reduce) and the faster ring
(distlab.collectives.faster_ring: no temporaries, a reused scratch buffer; --segments pieces
per chunk, pipelined) and gloo each sum a tensor of --numel float32 (default 16M = 64 MiB) across --nprocs ranks (default 4).
Each launch times --repeat rounds of each, alternating, with a barrier before every round;
the script reports medians over all rounds of all --launches launches, the throughput of each
as bus bandwidth (the convention of NCCL's tests: bytes × 2(N-1)/N per second), and the
ratio of each ring's throughput to gloo's (the target for the faster ring: at least 0.8).

On a 2-core machine with 4 ranks, both are bound by memory copies and loopback TCP on
oversubscribed cores, not by a network; run-to-run noise is large, hence the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import distlab

GLOO = "gloo all_reduce"
TARGET = 0.8


def time_all(numel: int, repeat: int, segments: list[int]) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from distlab.collectives import all_reduce, faster_ring

    variants = {"simple ring": all_reduce.ring_all_reduce}
    for k in segments:
        variants[f"faster ring, {k} segment{'s' if k > 1 else ''}"] = (
            lambda t, k=k: faster_ring.faster_ring_all_reduce(t, segments=k))
    variants[GLOO] = dist.all_reduce
    tensor = torch.ones(numel)
    times = {name: [] for name in variants}
    for _ in range(repeat):
        for name, op in variants.items():
            tensor.fill_(1.0)
            dist.barrier()
            start = time.perf_counter()
            op(tensor)
            elapsed = time.perf_counter() - start
            slowest = torch.tensor([elapsed], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective ends when its last rank does
            times[name].append(slowest.item())
            assert tensor[0].item() == dist.get_world_size()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--numel", type=int, default=16 * 2**20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--segments", type=int, nargs="+", default=[1, 2], help="pieces per chunk (faster ring)")
    args = parser.parse_args()

    merged: dict[str, list[float]] = {}
    for _ in range(args.launches):
        per_rank = distlab.run(time_all, args.numel, args.repeat, args.segments, nprocs=args.nprocs, timeout=600)
        for name, values in per_rank[0].items():
            merged.setdefault(name, []).extend(values)

    n, nbytes = args.nprocs, args.numel * 4
    print(f"all-reduce of {args.numel} float32 ({nbytes / 2**20:.0f} MiB) on {n} ranks, {os.cpu_count()} cores; "
          f"median of {len(next(iter(merged.values())))} rounds over {args.launches} launches")
    medians = {name: statistics.median(values) for name, values in merged.items()}
    for name in medians:
        busbw = nbytes * 2 * (n - 1) / n / medians[name]
        ratio = "" if name == GLOO else f"   throughput / gloo's {medians[GLOO] / medians[name]:5.2f}"
        print(f"  {name:<28} {medians[name]:7.3f} s   bus bandwidth {busbw / 1e9:6.2f} GB/s{ratio}")
    best = min((name for name in medians if name.startswith("faster")), key=medians.get)
    print(f"  best faster ring / gloo: {medians[GLOO] / medians[best]:.2f} (target >= {TARGET}), {best}")


if __name__ == "__main__":
    main()
