"""Activation checkpointing: keep a block's input, not its inner activations, and recompute in backward.

The activations a forward pass saves for backward grow with the batch, the sequence and the
number of layers; they are not model states, and no ZeRO stage shards them. Checkpointing a
block trades them for compute: forward keeps only the block's input, and backward runs the
block's forward again (under autograd this time) right before its gradients are needed.
About one extra forward per block, for activation memory that no longer grows with the layers
inside it. (:func:`distlab.tools.memory.saved_activation_bytes` measures the difference.)
"""

from __future__ import annotations

import torch


class Checkpointed(torch.nn.Module):
    """``module`` run without keeping its inner activations: backward recomputes them.

    Only the block's input is saved; in backward the block's forward runs again (under
    autograd this time) right before its gradients are needed. About one extra forward per
    block, for activation memory that no longer grows with the number of layers inside it.
    """

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.module, *args, use_reentrant=False)


def checkpoint_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap each of ``model.blocks`` (a TinyGPT's transformer blocks) in :class:`Checkpointed`, in place."""
    for index, block in enumerate(model.blocks):
        model.blocks[index] = Checkpointed(block)
    return model
