"""The monitoring tools: FLOPs counted right, utilisation and MFU computed right, TensorBoard round trip."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from distlab import models
from distlab.tools import monitor


def counted_flops(run) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def test_the_flops_formula_matches_torchs_count_of_every_matmul_in_a_training_step():
    model, cfg = models.build("gpt"), models.GPTConfig()
    tokens, targets = models.example_batch("gpt", batch_size=4)
    batch, seq = tokens.shape
    # torch counts the linear layers' products (its CPU attention kernel is not counted)...
    linear = counted_flops(lambda: models.loss_fn(model, (tokens, targets)).backward())
    assert linear == 6 * monitor.matmul_weights(model) * batch * seq
    # ...and the attention term is the products of an explicit attention of the same shapes.
    head_dim = cfg.dim // cfg.heads
    q, k, v = (torch.randn(batch, cfg.heads, seq, head_dim, requires_grad=True) for _ in range(3))

    def attention():
        weights = F.softmax(q @ k.transpose(-1, -2) / head_dim ** 0.5, dim=-1)
        (weights @ v).sum().backward()

    per_layer = counted_flops(attention)
    total = monitor.transformer_flops_per_token(model, cfg.layers, cfg.dim, seq) * batch * seq
    assert total == linear + cfg.layers * per_layer


def test_utilisation_tells_a_busy_step_from_a_waiting_one_and_mfu_follows_the_definition():
    watch = monitor.StepMonitor(flops_per_token=1e3, peak_flops=1e6, warmup=0)
    with watch.step(tokens=100):
        deadline = time.process_time() + 0.2
        while time.process_time() < deadline:     # busy: CPU time advances with wall time
            pass
    busy = watch.rates(watch.steps[-1])
    with watch.step(tokens=100):
        time.sleep(0.2)                           # waiting: the wall clock runs, the CPU does not
    waiting = watch.rates(watch.steps[-1])
    # What each step cost the CPU is known whatever else the machine runs; the shares follow.
    assert watch.steps[0]["cpu_seconds"] >= 0.2 > 0.05 > watch.steps[1]["cpu_seconds"]
    for record in watch.steps:
        assert monitor.StepMonitor().rates(record)["cpu_utilisation"] == record["cpu_seconds"] / record["seconds"]
    assert busy["cpu_utilisation"] > waiting["cpu_utilisation"]
    for rates in (busy, waiting):
        assert rates["mfu"] == pytest.approx(rates["tokens_per_s"] * 1e3 / 1e6)
    summary = watch.summary()
    assert summary["steps"] == 2 and summary["tokens_per_s"] == pytest.approx(200 / sum(
        s["seconds"] for s in watch.steps))
    with pytest.raises(ValueError, match="no step was timed"):
        monitor.StepMonitor().summary()


def test_the_warm_up_steps_are_left_out_of_the_summary():
    watch = monitor.StepMonitor(warmup=1)
    watch.steps = [{"tokens": 10, "seconds": 5.0, "cpu_seconds": 5.0},
                   {"tokens": 10, "seconds": 1.0, "cpu_seconds": 0.5}]
    assert watch.summary() == {"tokens_per_s": 10.0, "cpu_utilisation": 0.5, "median_step_s": 1.0, "steps": 1}


def test_a_measured_peak_is_a_plausible_matmul_rate():
    torch.set_num_threads(1)
    peak = monitor.measure_peak_flops(size=256, seconds=0.1)
    assert 1e8 < peak < 1e12      # one CPU core: from an old laptop's to far beyond any core's


def test_logged_scalars_read_back_from_tensorboards_event_files(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    watch = monitor.StepMonitor(flops_per_token=2.0, peak_flops=4.0, warmup=0)
    with SummaryWriter(tmp_path) as writer:
        for step, loss in enumerate((5.5, 4.0, 3.25)):
            with watch.step(tokens=8):
                pass
            watch.log(writer, step, loss=loss)
    scalars = monitor.read_scalars(tmp_path)
    assert set(scalars) == {"tokens_per_s", "cpu_utilisation", "mfu", "loss"}
    assert scalars["loss"] == [(0, 5.5), (1, 4.0), (2, 3.25)]
    for step, record in enumerate(watch.steps):
        assert scalars["mfu"][step][1] == pytest.approx(watch.rates(record)["mfu"], rel=1e-6)
