"""Step time and per-rank bytes of tensor-parallel TinyGPT: ours vs torch's DTensor vs one process.

For each world size in --nprocs (default 2 and 4; one launch each), every rank builds the
same TinyGPT (--dim, --layers, --context) four ways: the book's from-scratch tensor
parallelism (distlab.tensor_parallel), the same with sequence parallelism saving only
shards, torch's DTensor plans (distlab.tensor_parallel.dtensor) and DTensor with sequence parallelism.
It times --steps forward+backward passes of each on the same full batch, alternating
between variants so that all see the same machine load; a step ends when its slowest rank
finishes. Rank 0 also times the plain single-process model while the other ranks wait, so
the single-process time is measured alone on the machine.

Reported per variant: median step time, its ratio to one process and to ours, the bytes of
parameters rank 0 holds, and the activation bytes it saves for backward (distlab.tools.memory).

On a 2-core machine, more than 2 ranks oversubscribe the cores: the time ratios compare the
implementations under the same conditions (the from-scratch code against DTensor's
dispatch), not tensor parallelism's speed-up on GPUs, which chapter 5's last page models.
"""

from __future__ import annotations

import argparse
import statistics
import time

import distlab

VARIANTS = ["ours", "ours + SP", "DTensor", "DTensor + SP"]


def time_all(config: dict, batch_size: int, steps: int, warmup: int) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from distlab import models
    from distlab.tensor_parallel import dtensor
    from distlab.tensor_parallel import model as tp_model
    from distlab.tools import memory

    warnings.filterwarnings("ignore", message="Full backward hook")
    batch = models.example_batch("gpt", batch_size=batch_size, seed=0, **config)
    reference = models.build("gpt", seed=0, **config)
    builders = {
        "ours": lambda: (tp_model.parallelize_gpt(reference), tp_model.loss, lambda loss: loss.backward()),
        "ours + SP": lambda: (tp_model.save_only_sequence_shards(tp_model.parallelize_gpt(reference, sequence_parallel=True)),
                              tp_model.loss, lambda loss: loss.backward()),
        "DTensor": lambda: (dtensor.parallelize(reference), dtensor.loss, dtensor.backward),
        "DTensor + SP": lambda: (dtensor.parallelize(reference, sequence_parallel=True), dtensor.loss,
                                 dtensor.backward),
    }
    runs = {name: build() for name, build in builders.items()}

    def one_step(model, loss_fn, backward):
        model.zero_grad(set_to_none=True)
        backward(loss_fn(model, batch))

    times = {name: [] for name in runs}
    for step in range(warmup + steps):
        for name, (model, loss_fn, backward) in runs.items():
            dist.barrier()
            start = time.perf_counter()
            one_step(model, loss_fn, backward)
            slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if step >= warmup:
                times[name].append(slowest.item())
    single = []
    if dist.get_rank() == 0:                                  # alone on the machine: the others wait
        for step in range(warmup + steps):
            start = time.perf_counter()
            reference.zero_grad(set_to_none=True)
            models.loss_fn(reference, batch).backward()
            if step >= warmup:
                single.append(time.perf_counter() - start)
    dist.barrier()

    held, saved = {}, {}
    for name, (model, loss_fn, backward) in runs.items():
        held[name] = memory.storage_bytes(list(model.parameters()))
        with memory.saved_activation_bytes() as counted:
            loss = loss_fn(model, batch)
        backward(loss)
        saved[name] = counted.bytes
    with memory.saved_activation_bytes() as counted:
        models.loss_fn(reference, batch)
    held["one process"] = memory.storage_bytes(list(reference.parameters()))
    saved["one process"] = counted.bytes
    median = {name: statistics.median(t) for name, t in times.items()}
    median["one process"] = statistics.median(single) if single else None
    return {"time": median, "held": held, "saved": saved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (every rank sees all of them)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    config = dict(dim=args.dim, layers=args.layers, context=args.context)
    print(f"TinyGPT dim={args.dim} layers={args.layers} context={args.context}, batch {args.batch}, "
          f"median of {args.steps} forward+backward steps")
    for n in args.nprocs:
        r = distlab.run(time_all, config, args.batch, args.steps, args.warmup, nprocs=n, timeout=600)[0]
        single, ours = r["time"]["one process"], r["time"]["ours"]
        print(f"\n{n} ranks (rank 0's bytes)")
        print(f"{'variant':<14} {'step ms':>8} {'vs 1 proc':>9} {'vs ours':>8} {'params KiB':>11} {'saved act. KiB':>15}")
        for name in ["one process"] + VARIANTS:
            t = r["time"][name]
            print(f"{name:<14} {t * 1e3:>8.1f} {t / single:>8.2f}x {t / ours:>7.2f}x "
                  f"{r['held'][name] / 1024:>11.0f} {r['saved'][name] / 1024:>15.0f}")


if __name__ == "__main__":
    main()
