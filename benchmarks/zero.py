"""Per-rank model-state bytes and step time of DDP and the book's ZeRO-1/2/3, next to torch's FSDP2.

One launch on --nprocs ranks (default 4). Each rank builds the same TinyGPT (--dim, --layers)
under each variant of distlab.zero.stages.build: plain DDP (OverlappedDDP, chapter 3), ZeRO-1
as a sharded optimizer beside that DDP (the way torch's ZeroRedundancyOptimizer is used),
ZeRO-1 and ZeRO-2 as a sharded optimizer that reduce-scatters itself, ZeRO-3 as a fully
sharded model over flat units; distlab's FSDP2 form (distlab.zero.fsdp2.fully_shard, each
parameter cut by rows) and torch's FSDP2, both called per block and on the root. All use AdamW and
--bucket-mb buckets. After --warmup untimed steps it times --steps training steps of each,
alternating between them so that all see the same machine load; a step ends when its
slowest rank finishes.

Reported per variant: the model-state bytes rank 0 holds after the last step (counted by
distlab.tools.memory), the formula's bytes and their ratio (target: within 5%), the bytes sent per
step (distlab.tools.comm) against the theory, and the median step time and its ratio to DDP;
last, the ratio of distlab's FSDP2 form's step time to torch's (the same model, the same
collectives, the same bytes: what remains is the Python around them).

ZeRO-1 beside DDP sends DDP's all-reduce and then the all-gather of the updated slices, 1.5
times DDP's bytes; ZeRO-1 reduce-scattering the gradients itself sends exactly DDP's bytes.
Both FSDP2s send a little less than the ZeRO-3 theory: they do not free the root's parameters
(embeddings, final norm, head) after forward, since backward starts with them right away.

On a 2-core machine, 4 ranks oversubscribe the cores and every collective costs milliseconds
of scheduling: the time ratios say how much the extra, smaller collectives cost when nothing
can overlap, not how ZeRO performs on a GPU cluster.
"""

from __future__ import annotations

import argparse
import statistics
import time

import distlab

VARIANTS = {"DDP": (0, False), "ZeRO-1 + DDP": (1, True), "ZeRO-1": (1, False), "ZeRO-2": (2, False),
            "ZeRO-3": (3, False), "ours FSDP2": (3, False), "torch FSDP2": (3, False)}
"""Each variant's ZeRO stage, and whether its optimizer sits beside DDP."""


def time_all(dim: int, layers: int, steps: int, warmup: int, batch: int, bucket_mb: float) -> dict:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed import fsdp

    from distlab import models
    from distlab.data_parallel.buckets import plan_buckets
    from distlab.tools import comm, memory
    from distlab.zero import flat, fsdp2, stages

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = dict(dim=dim, layers=layers)
    runs = {}
    for name, (stage, beside_ddp) in VARIANTS.items():
        model = models.build("gpt", seed=0, **config)
        if name.endswith("FSDP2"):
            fully_shard = fsdp.fully_shard if name == "torch FSDP2" else fsdp2.fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            runs[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        else:
            runs[name] = stages.build(stage, model, torch.optim.AdamW, bucket_mb=bucket_mb, beside_ddp=beside_ddp,
                                      lr=1e-3)

    times = {name: [] for name in runs}
    sent = {}
    for step in range(warmup + steps):
        shard = models.shard(models.example_batch("gpt", batch * world, seed=step, **config), rank, world)
        for name, (module, optimizer) in runs.items():
            dist.barrier()
            start = time.perf_counter()
            with comm.record() as log:
                stages.train_step(module, optimizer, shard, models.loss_fn)
            slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if step >= warmup:
                times[name].append(slowest.item())
            sent[name] = log.bytes_sent()
    held = {name: stages.held_bytes(module, optimizer) for name, (module, optimizer) in runs.items()}
    model = models.build("gpt", **config)
    buckets = plan_buckets(model.parameters(), bucket_mb)
    return {"time": {name: statistics.median(t) for name, t in times.items()}, "held": held, "sent": sent,
            "numel": memory.count_parameters(model), "layered": flat.padded_numel(model, world),
            "bucketed": sum(flat.FlatUnit(bucket, 0, world).padded for bucket in buckets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=1.0, help="DDP's and the sharded optimizer's buckets")
    args = parser.parse_args()

    from distlab.zero import theory

    result = distlab.run(time_all, args.dim, args.layers, args.steps, args.warmup, args.batch, args.bucket_mb,
                         nprocs=args.nprocs, timeout=600)[0]
    n, numel = args.nprocs, result["numel"]
    print(f"TinyGPT dim={args.dim} layers={args.layers}: {numel:,} parameters, AdamW, {n} ranks, "
          f"median of {args.steps} steps")
    print(f"{'variant':<13} {'held MiB':>9} {'formula':>9} {'ratio':>6} {'sent KiB':>9} {'theory':>9} "
          f"{'step ms':>8} {'vs DDP':>7}")
    ddp_time = result["time"]["DDP"]
    worst = 0.0
    for name, (stage, beside_ddp) in VARIANTS.items():
        held = result["held"][name]["total"]
        formula = theory.model_state_theory(numel, n, stage)["total"]
        padded = {0: numel, 1: result["bucketed"], 2: result["bucketed"], 3: result["layered"]}[stage]
        theory_sent = theory.comm_bytes_per_step(stage, padded, n, beside_ddp=beside_ddp)
        worst = max(worst, abs(held / formula - 1))
        print(f"{name:<13} {held / 2**20:>9.3f} {formula / 2**20:>9.3f} {held / formula:>6.3f} "
              f"{result['sent'][name] / 2**10:>9.0f} {theory_sent / 2**10:>9.0f} "
              f"{result['time'][name] * 1e3:>8.1f} {result['time'][name] / ddp_time:>6.2f}x")
    print(f"largest deviation of held bytes from the formula: {worst:.2%} (target: within 5%)")
    print(f"step time, distlab.zero.fsdp2 / torch's fully_shard: "
          f"{result['time']['ours FSDP2'] / result['time']['torch FSDP2']:.2f}")


if __name__ == "__main__":
    main()
