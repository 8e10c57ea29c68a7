"""Cutting TinyGPT into pipeline stages whose parameters keep the single-process model's names.

A rank holds one *chunk* of consecutive blocks (or several, ``v`` per rank, for interleaved
schedules: chunks are dealt round-robin, rank ``r`` gets ``r, r+p, r+2p, ...``). Chunk 0 also
holds the embeddings, the last chunk the final norm and the head. The chunks are built from the
same seed as the reference, so no weights travel.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from distlab import models


class Stage(nn.Module):
    """Chunk ``index`` of ``count`` of a TinyGPT: a contiguous run of its blocks.

    Chunk 0 also holds the token and position embeddings (its input is the tokens), the last
    chunk the final LayerNorm and the head (its output is the logits). The modules are the
    reference model's own, and keep its names: a block at position ``k`` of the full model is
    ``blocks.k`` here too (a ``ModuleDict`` keyed by ``"k"``), so ``stage.named_parameters()``
    yields exactly the reference's names for the parameters it holds.
    """

    def __init__(self, model: models.TinyGPT, index: int, count: int):
        super().__init__()
        layers = model.cfg.layers
        if count < 1 or layers % count:
            raise ValueError(f"TinyGPT's {layers} layers do not split evenly into {count} pipeline chunks; "
                             f"build it with layers= a multiple of {count}")
        per_chunk = layers // count
        self.index, self.count, self.dim = index, count, model.cfg.dim
        self.first, self.last = index == 0, index == count - 1
        if self.first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleDict({str(k): model.blocks[k] for k in range(index * per_chunk, (index + 1) * per_chunk)})
        if self.last:
            self.norm, self.head = model.norm, model.head
        self.later = None      # a zero-bubble stage's queue of weight-gradient jobs (see defer_weight_gradients)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(batch, seq)`` on chunk 0, else activations ``(batch, seq, dim)``; logits on the last."""
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def split_gpt(model: models.TinyGPT, count: int) -> list[Stage]:
    """Cut ``model`` into ``count`` chunks of equal depth (``layers`` must be a multiple of ``count``)."""
    return [Stage(model, index, count) for index in range(count)]


def stage_gradients(stages) -> dict[str, torch.Tensor]:
    """``{reference parameter name: gradient}`` of the parameters these stages hold.

    The names are the single-process model's (see :class:`Stage`), so the dicts of all ranks
    together cover the reference's gradients exactly once.
    """
    return {name: p.grad.detach().clone() for stage in stages for name, p in stage.named_parameters()}


def rank_of(chunk: int, ranks: int) -> int:
    """The rank that holds ``chunk``: chunks are dealt round-robin (rank ``r``: ``r, r+p, r+2p, ...``)."""
    return chunk % ranks


def micro_batches_of(batch, micro_batches: int) -> tuple[list, list]:
    """``(inputs, targets)`` each cut into ``micro_batches`` equal slices along the batch dimension."""
    inputs, targets = batch
    if micro_batches < 1 or inputs.shape[0] % micro_batches:
        raise ValueError(f"a batch of {inputs.shape[0]} sequences does not split into {micro_batches} equal "
                         f"micro-batches; pick a number of micro-batches that divides the batch size")
    return list(inputs.chunk(micro_batches)), list(targets.chunk(micro_batches))
