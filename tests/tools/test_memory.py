"""distlab.tools.memory's probes, in one process: counted bytes against bytes we can work out by hand.

Everything here is counted, not sampled, so the expected values are exact.
"""

from __future__ import annotations

import torch

from distlab import models
from distlab.tools import memory


def test_saved_activation_bytes_counts_what_backward_keeps_and_not_the_weights():
    w = torch.randn(8, 16, requires_grad=True)       # a parameter: model state, not an activation
    x = torch.randn(4, 16)
    with memory.saved_activation_bytes() as saved:
        y = torch.tanh(x @ w.T)                        # matmul saves x (w is a leaf); tanh saves its output
    assert saved.bytes == x.numel() * 4 + y.numel() * 4
    with memory.saved_activation_bytes() as none:
        with torch.no_grad():
            torch.tanh(x @ w.T)
    assert none.bytes == 0


def test_saved_activation_bytes_grows_with_the_batch():
    model = models.build("gpt")
    sizes = []
    for batch_size in (2, 4):
        with memory.saved_activation_bytes() as saved:
            models.loss_fn(model, models.example_batch("gpt", batch_size=batch_size))
        sizes.append(saved.bytes)
    assert 1.9 * sizes[0] < sizes[1] <= 2 * sizes[0] + 1024   # linear in the batch, up to a few fixed tensors


def test_largest_tensor_made_sees_outputs_of_operations_only():
    big = torch.zeros(1000, 1000)                      # made before the block: not counted
    x, w = torch.randn(3, 5), torch.ones(5, 7)
    with memory.largest_tensor_made() as largest:
        y = x @ w                                      # (3, 7) is the largest product
        y.sum()
    assert largest.shape == (3, 7) and largest.bytes == 3 * 7 * 4
    assert big.numel() == 10**6


def test_largest_tensor_made_catches_full_logits():
    model = models.build("gpt")
    inputs, targets = models.example_batch("gpt", batch_size=2)
    with memory.largest_tensor_made() as largest:
        models.loss_fn(model, (inputs, targets))
    assert largest.shape[-1] == model.cfg.vocab_size and largest.bytes >= inputs.numel() * model.cfg.vocab_size * 4


def test_peak_allocated_logs_nothing_of_its_own_and_keeps_what_the_block_writes(capfd):
    import os

    with memory.peak_allocated() as peak:
        torch.ones(1000)
        os.write(2, b"the block's own line\n")
    err = capfd.readouterr().err
    assert peak.bytes >= 4000
    assert err == "the block's own line\n", err      # no "USDT: profiler_start" from the profiler's C++ side
