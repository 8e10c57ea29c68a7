"""Per-rank model-state bytes and step time of DDP and the book's ZeRO-1/2/3, next to torch's FSDP2.

One launch on --nprocs ranks (default 4). Each rank builds the same TinyGPT (--dim, --layers)
under each of: plain DDP (distlab.zero.stages.Replicated: one all-reduce), distlab.zero.stages.ZeRO1,
ZeRO2, ZeRO3, and torch's FSDP2 (`fully_shard` per block and on the root), all with AdamW.
After --warmup untimed steps it times --steps training steps of each, alternating between
them so that all see the same machine load; a step ends when its slowest rank finishes.

Reported per variant: the model-state bytes rank 0 holds after the last step (counted by
distlab.tools.memory), the formula's bytes and their ratio (target: within 5%), the bytes sent per
step (distlab.tools.comm) against the theory, and the median step time and its ratio to DDP.

FSDP2 sends a little less than the ZeRO-3 theory: it does not free the root's parameters
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

VARIANTS = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "torch FSDP2"]


def time_all(dim: int, layers: int, steps: int, warmup: int, batch: int) -> dict:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from distlab import models
    from distlab.tools import comm, memory
    from distlab.zero import flat, stages

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = dict(dim=dim, layers=layers)
    runs = {}
    for stage, name in enumerate(VARIANTS[:4]):
        model = models.build("gpt", seed=0, **config)
        runs[name] = (model, stages.make(stage, model, torch.optim.AdamW, lr=1e-3))
    fsdp_model = models.build("gpt", seed=0, **config)
    for block in fsdp_model.blocks:
        fully_shard(block)
    fully_shard(fsdp_model)
    runs["torch FSDP2"] = (fsdp_model, torch.optim.AdamW(fsdp_model.parameters(), lr=1e-3))

    times = {name: [] for name in runs}
    sent = {}
    for step in range(warmup + steps):
        shard = models.shard(models.example_batch("gpt", batch * world, seed=step, **config), rank, world)
        for name, (model, stepper) in runs.items():
            dist.barrier()
            start = time.perf_counter()
            with comm.record() as log:
                stepper.zero_grad()
                models.loss_fn(model, shard).backward()
                stepper.step()
            slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if step >= warmup:
                times[name].append(slowest.item())
            sent[name] = log.bytes_sent()
    held = {name: (stepper.state_bytes() if hasattr(stepper, "state_bytes")
                   else memory.model_state_bytes(model, stepper)) for name, (model, stepper) in runs.items()}
    numel = memory.count_parameters(runs["DDP"][0])
    return {"time": {name: statistics.median(t) for name, t in times.items()}, "held": held, "sent": sent,
            "numel": numel, "padded": flat.padded_numel(runs["DDP"][0], world)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    from distlab.zero import theory

    result = distlab.run(time_all, args.dim, args.layers, args.steps, args.warmup, args.batch,
                         nprocs=args.nprocs, timeout=600)[0]
    n, numel = args.nprocs, result["numel"]
    print(f"TinyGPT dim={args.dim} layers={args.layers}: {numel:,} parameters, AdamW, {n} ranks, "
          f"median of {args.steps} steps")
    print(f"{'variant':<12} {'held MiB':>9} {'formula':>9} {'ratio':>6} {'sent KiB':>9} {'theory':>9} "
          f"{'step ms':>8} {'vs DDP':>7}")
    ddp_time = result["time"]["DDP"]
    worst = 0.0
    for name in VARIANTS:
        stage = 3 if name == "torch FSDP2" else VARIANTS.index(name)
        held = result["held"][name]["total"]
        formula = theory.model_state_theory(numel, n, stage)["total"]
        theory_sent = theory.comm_bytes_per_step(stage, result["padded"] if stage else numel, n)
        worst = max(worst, abs(held / formula - 1))
        print(f"{name:<12} {held / 2**20:>9.3f} {formula / 2**20:>9.3f} {held / formula:>6.3f} "
              f"{result['sent'][name] / 2**10:>9.0f} {theory_sent / 2**10:>9.0f} "
              f"{result['time'][name] * 1e3:>8.1f} {result['time'][name] / ddp_time:>6.2f}x")
    print(f"largest deviation of held bytes from the formula: {worst:.2%} (target: within 5%)")


if __name__ == "__main__":
    main()
