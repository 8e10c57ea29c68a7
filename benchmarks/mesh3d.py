"""Layouts of TinyGPT on 4 ranks: step time, bytes held and bytes sent, next to the layout calculator.

For each layout (dp4, tp4, pp4, dp2 x tp2, dp2 x pp2, pp2 x tp2), train --steps AdamW steps
our way (distlab.parallel3d.train: distlab.tensor_parallel inside each tp group, a 1F1B
distlab.pipeline_parallel in each pp group with --micro-batches, one all-reduce over each dp group)
and, for the layouts without a pipeline, torch's way (train_torch: DTensor TP + FSDP2), on
one warm pool of --nprocs ranks. Reported per layout and engine:

* the median step time after --warmup steps (slowest rank), and torch's time over ours;
* the model-state bytes held after the last step (distlab.tools.memory) next to
  distlab.parallel3d.predict.predict_run, and the relative error, on the rank that holds the most;
* the bytes that rank sends per step along tp, pp and dp (distlab.tools.comm) next to the
  prediction. torch's DTensor collectives are invisible to distlab.tools.comm: its tp column is blank.

dp4 is not the same algorithm on both sides: ours is plain data parallelism (one all-reduce),
torch's is FSDP2 (ZeRO-3: a quarter of the memory, 1.5x the bytes, three collectives per
layer). Every rank of every layout is checked against the prediction, not only the one shown.

The byte counts are exact predictions and their error should print as 0. One known
exception, printed as such: without FSDP2 (dp = 1), DTensor hands back the vocab-parallel
embedding's gradient replicated, all V rows on every rank.

Time is not predicted: on a 2-core machine with messages of kilobytes, the latency of
each collective and the scheduling of 4 processes on 2 cores decide the step time; the
calculator's bandwidth-and-FLOPs model (distlab.parallel3d.planner.estimate) is for models whose
messages take milliseconds on real links.
"""

from __future__ import annotations

import argparse
import statistics

import distlab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (global)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4, help="per pipeline and step")
    args = parser.parse_args()

    from distlab import models
    from distlab.parallel3d import planner, predict
    from distlab.parallel3d import runs as parallel3d_runs
    from distlab.parallel3d.mesh import Grid, grid_for

    config = dict(dim=args.dim, layers=args.layers)
    n = args.nprocs
    grids = {f"dp{n}": Grid(dp=n), f"tp{n}": Grid(tp=n), f"pp{n}": Grid(pp=n), f"dp{n // 2} x tp2": grid_for(n, tp=2),
             f"dp{n // 2} x pp2": grid_for(n, pp=2), f"pp{n // 2} x tp2": Grid(pp=n // 2, tp=2)}
    model = planner.Model.from_config(models.GPTConfig(**config))
    kwargs = dict(steps=args.warmup + args.steps, lr=1e-3, batch_size=args.batch, optimizer="adamw", config=config)
    runs = {}
    with distlab.Pool(args.nprocs):
        runs["distlab"] = parallel3d_runs.run_layouts(grids, n, timeout=600, micro_batches=args.micro_batches, **kwargs)
        runs["torch"] = parallel3d_runs.run_layouts({k: g for k, g in grids.items() if g.pp == 1}, n, engine="torch",
                                               timeout=600, **kwargs)

    print(f"TinyGPT dim={args.dim} layers={args.layers}: {model.params:,} parameters, AdamW, {args.nprocs} ranks, "
          f"global batch {args.batch} x {model.seq} tokens, median of {args.steps} steps after {args.warmup}")
    print(f"{'layout':<10} {'engine':<8} {'step ms':>8} {'torch/ours':>10} {'held KiB':>9} {'predicted':>9} "
          f"{'err':>6} {'tp KiB':>8} {'pred':>8} {'pp KiB':>8} {'pred':>8} {'dp KiB':>8} {'pred':>8} {'err':>6}")
    worst = 0.0
    for name, grid in grids.items():
        ours = None
        for engine in ("distlab", "torch"):
            if name not in runs[engine]:
                continue
            run = runs[engine][name]
            seconds = statistics.median(run.ranks[0]["seconds"][args.warmup:])
            ours = seconds if engine == "distlab" else ours
            note, rows = "", []
            for rank, out in enumerate(run.ranks):
                predicted = predict.predict_run(model, grid, args.batch, optimizer="adamw", engine=engine,
                                               stage=grid.coords(rank)["pp"], micro_batches=args.micro_batches)
                expect = predicted["bytes"]["total"]
                if engine == "torch" and grid.dp == 1 and grid.tp > 1:
                    expect += 4 * model.vocab * model.hidden * (grid.tp - 1) // grid.tp
                    note = "  (+ the replicated embedding gradient)"
                pred = predicted["sent"]
                errors = [abs(out["bytes"]["total"] / expect - 1)] + [
                    abs(out["sent"][a] - pred[a]) / max(pred[a], 1) for a in out["sent"] if pred.get(a) is not None]
                worst = max(worst, *errors)
                rows.append((out["bytes"]["total"], expect, out["sent"], pred, errors))
            held, expect, sent, pred, errors = max(rows, key=lambda row: row[0])

            def kib(v):
                return f"{v / 1024:>8.1f}" if v is not None else f"{'-':>8}"
            ratio = f"{seconds / ours:>9.2f}x" if engine == "torch" else f"{'':>10}"
            print(f"{name:<10} {engine:<8} {seconds * 1e3:>8.1f} {ratio} {held / 1024:>9.1f} {expect / 1024:>9.1f} "
                  f"{errors[0]:>6.1%} {kib(sent.get('tp'))} {kib(pred['tp'])} {kib(sent.get('pp'))} {kib(pred['pp'])} "
                  f"{kib(sent['dp'])} {kib(pred['dp'])} {max(errors[1:], default=0):>6.1%}{note}")
    print(f"largest prediction error of bytes held or sent, over every rank: {worst:.2%} (exact counts: target 0)")


if __name__ == "__main__":
    main()
