"""Forward+backward time of context-parallel attention: our ring and Ulysses vs torch's ring vs one process.

For each world size in --nprocs (default 2 and 4; one launch each) and each mask (causal, in the
balanced layout, and not, contiguous), every rank takes its shard of the same q, k, v
(--heads, --seq, --head-dim, float32) and times --steps forward and backward passes of:

* ``ours``: distlab.context_parallel.ring.ring_attention;
* ``ulysses``: distlab.context_parallel.ulysses.ulysses_attention (when heads divide by N);
* ``torch ring``: torch 2.13's own ring (its private ``_templated_ring_attention`` with the CPU
  flash-attention kernels, distlab.context_parallel.torch_native), on the same shards;

alternating between them so that all see the same machine load; a pass ends when its slowest
rank finishes. Rank 0 also times ``F.scaled_dot_product_attention`` over the whole sequence while
the other ranks wait (one process, alone on the machine). Every version's output is checked
against the single-process one before timing (float32: within 1e-4 of the largest value).

Reported: the median time of each, and its ratio to ours and to one process. On a 2-core
machine more than 2 ranks oversubscribe the cores: the ratios compare implementations under
the same conditions, not context parallelism's speed-up on GPUs.

    python benchmarks/context_parallel.py [--nprocs 2 4] [--seq 4096] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import distlab

VERSIONS = ["ours", "ulysses", "torch ring"]


def time_all(seq: int, heads: int, head_dim: int, causal: bool, steps: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from distlab.context_parallel import balance, layout, ring, torch_native, ulysses

    n, me = dist.get_world_size(), dist.get_rank()
    the_layout = balance.balanced(seq, n) if causal else layout.contiguous(seq, n)
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, heads, seq, head_dim, generator=g) for _ in range(4)]
    shards = [layout.shard(t, the_layout, me) for t in full]
    versions = {"ours": lambda q, k, v: ring.ring_attention(q, k, v, causal, the_layout),
                "torch ring": lambda q, k, v: torch_native.torch_ring_attention(q, k, v, causal)}
    if heads % n == 0:
        versions["ulysses"] = lambda q, k, v: ulysses.ulysses_attention(q, k, v, causal, the_layout)

    want = layout.shard(F.scaled_dot_product_attention(*full[:3], is_causal=causal), the_layout, me)
    for name, attend in versions.items():
        got = attend(*shards[:3])
        error = ((got - want).abs().max() / want.abs().max()).item()
        if error > 1e-4:                     # float32 rounding is ~1e-6 here: this is a wrong result
            raise AssertionError(f"rank {me}: {name} differs from one process by {error:.1e}")

    def one_pass(attend):
        q, k, v = (t.clone().requires_grad_(True) for t in shards[:3])
        attend(q, k, v).backward(shards[3])

    times = {name: [] for name in versions}
    for step in range(warmup + steps):
        for name, attend in versions.items():
            dist.barrier()
            start = time.perf_counter()
            one_pass(attend)
            slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if step >= warmup:
                times[name].append(slowest.item())
    single = []
    if me == 0:                                    # alone on the machine: the others wait
        for step in range(warmup + steps):
            leaves = [t.clone().requires_grad_(True) for t in full[:3]]
            start = time.perf_counter()
            F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(full[3])
            if step >= warmup:
                single.append(time.perf_counter() - start)
    dist.barrier()
    return {"times": {name: statistics.median(t) for name, t in times.items()},
            "single": statistics.median(single) if single else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    print(f"attention forward+backward, {args.heads} heads x {args.head_dim}, {args.seq} tokens, float32, "
          f"median of {args.steps}")
    print(f"{'ranks':>5}  {'mask':<10}{'version':<12}{'seconds':>9}{'/ ours':>8}{'/ one process':>15}")
    for n in args.nprocs:
        with distlab.Pool(n) as pool:
            for causal in (False, True):
                result = pool.run(time_all, args.seq, args.heads, args.head_dim, causal, args.steps, args.warmup,
                                  timeout=1800)[0]
                times, single = result["times"], result["single"]
                print(f"{n:>5}  {'one process':<22}{single:>9.3f}{single / times['ours']:>8.2f}{1.0:>15.2f}"
                      + ("  (causal)" if causal else ""))
                for name in VERSIONS:
                    if name in times:
                        t = times[name]
                        print(f"{n:>5}  {'causal' if causal else 'full':<10}{name:<12}{t:>9.3f}"
                              f"{t / times['ours']:>8.2f}{t / single:>15.2f}")


if __name__ == "__main__":
    main()
