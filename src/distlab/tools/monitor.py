"""Watching a training run: throughput, utilisation and MFU, logged where TensorBoard reads them.

Three numbers say whether a run uses the machine it was given:

* **Throughput**: tokens (or samples) the whole job processes per second. Scaling from 1 to
  N processors should multiply it by N; the ratio to that ideal is the *scaling efficiency*.
* **Utilisation**: the share of wall time the processor was busy. On a GPU, ``nvidia-smi``
  (or ``torch.cuda.utilization()``) reports the share of time *some* kernel was running, so
  a GPU at 100% can still be slow. Here, on CPUs, it is the process's CPU time over its wall
  time (:class:`StepMonitor`): a rank that waits for data or for other ranks is not busy.
* **MFU** (model FLOPs utilisation): the arithmetic the model needs per second at that
  throughput, over the hardware's peak. It is the number that answers "busy with what?":
  waiting in a spin loop, copying, or recomputing all count as utilisation but not as MFU.

The model's arithmetic is counted, not measured: a transformer's training step costs about
``6 N`` FLOPs per token for its ``N`` weights that multiply (2 in forward, 4 in backward: the
gradients with respect to inputs and to weights), plus ``12 L d T`` for attention (``L``
layers of width ``d`` over sequences of ``T`` tokens: scores and weighted values, forward and
backward) :func:`transformer_flops_per_token`. The peak is what the hardware sheet says for a
GPU (989 TFLOP/s dense bf16 for an H100 SXM); for a CPU core, :func:`measure_peak_flops` times
a large float32 matrix product, the best this core reaches on the operation models are made of.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn


def matmul_weights(model: nn.Module) -> int:
    """Elements of every ``nn.Linear`` weight: the parameters that cost FLOPs per token
    (embeddings are looked up, biases and norms are added: negligible)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def transformer_flops_per_token(model: nn.Module, layers: int, dim: int, seq: int) -> float:
    """FLOPs of one training step (forward and backward) per token of a transformer.

    ``6 N`` for the ``N`` matmul weights: a weight used once per token costs a multiply and an
    add (2 FLOPs) in forward, twice that in backward. Attention adds, per layer and token,
    ``2 d T`` for the scores ``q k^T`` and ``2 d T`` for the weighted sum of values in forward,
    three times that with backward: ``12 L d T`` (counted over the whole sequence, as a causal
    mask computed densely still does).
    """
    return 6 * matmul_weights(model) + 12 * layers * dim * seq


def measure_peak_flops(size: int = 512, seconds: float = 0.3, device: str | torch.device = "cpu") -> float:
    """FLOP/s of a ``size`` x ``size`` float32 matrix product on this process's threads.

    Repeats the product for about ``seconds`` after one warm-up and keeps the best rate: the
    fastest this device runs the operation a model is made of, so MFU against it says how much
    of the attainable arithmetic a training step used.
    """
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    flops = 2 * size ** 3
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    sync()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return flops / best


@dataclass
class StepMonitor:
    """Times training steps on one rank: wall time, CPU time, tokens.

    ``with monitor.step(tokens=n):`` around one step; :meth:`summary` gives this rank's tokens
    per second, CPU utilisation and MFU (when ``flops_per_token`` and ``peak_flops`` are
    given); :meth:`log` writes a step's numbers to a TensorBoard ``SummaryWriter``.
    The first ``warmup`` steps are timed but left out of the summary (first calls allocate,
    and the first all-reduce sets up its connections).
    """

    flops_per_token: float | None = None
    peak_flops: float | None = None
    warmup: int = 2
    steps: list[dict] = field(default_factory=list)

    @contextmanager
    def step(self, tokens: int):
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.steps.append({"tokens": tokens, "seconds": time.perf_counter() - wall,
                           "cpu_seconds": time.process_time() - cpu})

    def rates(self, record: dict) -> dict:
        """Tokens per second, utilisation and MFU of one step (or of a sum of steps)."""
        out = {"tokens_per_s": record["tokens"] / record["seconds"],
               "cpu_utilisation": record["cpu_seconds"] / record["seconds"]}
        if self.flops_per_token and self.peak_flops:
            out["mfu"] = out["tokens_per_s"] * self.flops_per_token / self.peak_flops
        return out

    def summary(self) -> dict:
        """The rates over every step after the warm-up, and the step time's median."""
        kept = self.steps[self.warmup:] or self.steps
        if not kept:
            raise ValueError("no step was timed: use `with monitor.step(tokens=n):` around each step")
        total = {key: sum(s[key] for s in kept) for key in ("tokens", "seconds", "cpu_seconds")}
        seconds = sorted(s["seconds"] for s in kept)
        return {**self.rates(total), "median_step_s": seconds[len(seconds) // 2], "steps": len(kept)}

    def log(self, writer, step: int, **scalars) -> None:
        """Write the last step's rates, and any other ``scalars`` (the loss), under ``step``."""
        for name, value in {**self.rates(self.steps[-1]), **scalars}.items():
            writer.add_scalar(name, float(value), step)


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a TensorBoard log folder holds, as ``{tag: [(step, value), ...]}``: what
    the TensorBoard page would plot, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
