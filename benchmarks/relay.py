"""What grading on the relay costs: the graded runs of chapters 0, 2 and 3, on the relay and on gloo.

    python benchmarks/relay.py [--repeat 5]

Since issue 43 the graded ranks of chapters 0, 2 and 3 talk only through the grader's relay
(:mod:`distlab.relay`): every message goes through a router thread in the clean room instead
of a TCP connection between ranks. What changed in a notebook's grading is the time of its
runs, so this times those runs, side by side, on warm pools of each kind (the clean room's
warm ranks), each run the way its hidden test makes it:

* chapter 0: a mean of 1 MiB per rank with one all-reduce, on 4 ranks;
* chapter 2: the book's ring all-reduce (point-to-point messages) of the hidden cases (64x33
  float32, 7 float64, 3x3 int64), on 4 ranks;
* chapter 3: three steps of bucketed, overlapped data parallelism on chapter 3's GPT
  (buckets of 0.02 MB), on 4 ranks.

It prints the median seconds of each over ``--repeat`` runs (after one warm-up run) and the
ratio relay / gloo, and, for a notebook's grading, the seconds the relay adds to one run of
each kind (grading time per notebook is measured by ``benchmarks/autograde.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import distlab


def chapter0_mean():
    import torch
    import torch.distributed as dist

    t = torch.randn(1 << 18)
    dist.all_reduce(t)
    return float(t[0])


def chapter2_ring():
    import torch

    from distlab.collectives import all_reduce

    for tensor in (torch.randn(64, 33), torch.randn(7, dtype=torch.float64), torch.randint(-100, 100, (3, 3))):
        all_reduce.ring_all_reduce(tensor.reshape(-1).clone())
    return 0


def chapter3_steps():
    import torch
    import torch.distributed as dist

    from distlab import models
    from distlab.data_parallel.overlap import OverlappedDDP

    model = models.build("gpt", seed=0)
    ddp = OverlappedDDP(model, bucket_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        batch = models.shard(models.example_batch("gpt", 8, seed=step), dist.get_rank(), dist.get_world_size())
        opt.zero_grad(set_to_none=True)
        models.loss_fn(ddp, batch).backward()
        ddp.finish()
        opt.step()
    return 0


WORKLOADS = {"chapter 0: mean of 1 MiB": chapter0_mean, "chapter 2: ring all-reduces": chapter2_ring,
             "chapter 3: 3 overlapped DDP steps": chapter3_steps}


def timed(fn, backend, repeat: int) -> float:
    distlab.run(fn, nprocs=4, backend=backend, timeout=300)          # warm-up: imports, first buffers
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        distlab.run(fn, nprocs=4, backend=backend, timeout=300)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with distlab.Pool(4), distlab.Pool(4, backend="relay"):
        print(f"{'graded run (4 ranks, warm pools)':<36} {'gloo s':>8} {'relay s':>8} {'relay/gloo':>11}")
        for name, fn in WORKLOADS.items():
            gloo = timed(fn, None, args.repeat)
            relay = timed(fn, "relay", args.repeat)
            print(f"{name:<36} {gloo:8.3f} {relay:8.3f} {relay / gloo:10.2f}x  (+{relay - gloo:.3f} s per run)",
                  flush=True)


if __name__ == "__main__":
    main()
