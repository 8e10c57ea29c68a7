"""Chapter 1's claim, measured: what each sharding strategy costs a rank, at 2 and 4 ranks.

For iterable sharding, batch-sampler sharding and dispatching (``distlab.data.sharding``),
each in *fresh* ranks (so the peak resident memory belongs to that strategy alone), this
prints samples per second (loader only, the slowest rank's rate times the number of ranks),
peak RSS and private (anonymous) memory added per rank, and the bytes rank 0 sends per step.
The data is the book's corpus repeated ``--copies`` times. Every strategy delivers the same
tokens (checked by a per-rank checksum); the built-in comparison point is batch-sampler
sharding, which is what ``torch.utils.data.DistributedSampler`` + ``DataLoader`` do.

    .venv/bin/python benchmarks/data_loading.py [--copies 32] [--steps 200] [--batch 64]
"""

from __future__ import annotations

import argparse
import sys
import time

import distlab
from distlab.data import corpus, measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    args = parser.parse_args()
    size = len(corpus.corpus_dataset(copies=args.copies)) * (corpus.CONTEXT + 1) / 2**20
    print(f"data: {size:.1f} MiB of windows ({args.copies} copies of the corpus); "
          f"{args.steps} steps of {args.batch} samples per rank; fresh ranks per run")
    print(f"{'strategy':>14} {'ranks':>5} {'samples/s':>10} {'vs batch-sampler':>17} "
          f"{'peak RSS/rank MiB':>18} {'private +MiB/rank':>18} {'rank 0 sends/step':>18}")
    checksums = {}
    for nprocs in (2, 4):
        rows = {}
        for strategy in measure.STRATEGIES:
            start = time.perf_counter()
            with distlab.fresh_processes():
                ranks = distlab.run(measure.measure_strategy, strategy, args.batch, args.steps, args.copies,
                                    nprocs=nprocs, timeout=300)
            rows[strategy] = ranks
            checksums.setdefault(nprocs, set()).add(tuple(r["checksum"] for r in ranks))
            print(f"  ({strategy} on {nprocs} ranks: {time.perf_counter() - start:.1f} s with the launch)",
                  file=sys.stderr)
        base = nprocs * min(r["samples_per_s"] for r in rows["batch-sampler"])
        for strategy, ranks in rows.items():
            rate = nprocs * min(r["samples_per_s"] for r in ranks)
            peaks = "/".join(f"{r['peak']:.0f}" for r in ranks)
            private = "/".join(f"{r['anon_delta']:.0f}" for r in ranks)
            print(f"{strategy:>14} {nprocs:>5} {rate:>10,.0f} {rate / base:>16.2f}x {peaks:>18} {private:>18} "
                  f"{ranks[0]['bytes_sent'] / args.steps:>16,.0f} B")
    if any(len(sums) != 1 for sums in checksums.values()):
        print("error: the strategies delivered different tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
