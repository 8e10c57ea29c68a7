"""The tensor-parallel TinyGPT: Megatron's MLP and attention, and sequence parallelism.

Megatron's trick (:class:`ParallelMLP`): a column-parallel layer first, a row-parallel layer
second. The first one's output is exactly the sharded input the second one wants, and an
elementwise activation in between works on shards: a whole MLP costs one all-reduce forward
and one backward. Attention works the same way with heads as the unit
(:class:`ParallelAttention`). :func:`parallelize_gpt` slices a :class:`distlab.models.TinyGPT`
into its tensor-parallel twin, with the same parameter names.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab import models
from distlab.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    load_full_weights,
    vocab_parallel_cross_entropy,
)
from distlab.tensor_parallel.regions import divide, split
from distlab.tools.groups import world


def _mark_sequence_parallel(module: nn.Module) -> None:
    """Mark ``module``'s parameters as replicated but fed with sequence shards (see the package doc)."""
    for p in module.parameters():
        p.sequence_parallel = True


class ParallelMLP(nn.Module):
    """Megatron's MLP: column-parallel ``fc1``, activation on shards, row-parallel ``fc2``.

    Forward: ``copy`` (nothing) -> ``fc1`` shard -> activation -> ``fc2`` partial sum ->
    **one all-reduce**. Backward: the all-reduce's partner does nothing, and ``copy``'s
    partner is **one all-reduce** of ``dL/dx``. Splitting ``fc1`` by rows instead would need
    an all-reduce *before* the activation (``gelu(a + b) != gelu(a) + gelu(b)``): the
    column-then-row order is what makes one collective each way enough.
    """

    def __init__(self, inputs: int, hidden: int, outputs: int, activation=F.gelu, group=None,
                 sequence_parallel: bool = False):
        super().__init__()
        self.activation = activation
        self.fc1 = ColumnParallelLinear(inputs, hidden, group=group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear(hidden, outputs, group=group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


def parallelize_mlp(mlp: models.TinyMLP, group=None, sequence_parallel: bool = False) -> ParallelMLP:
    """The tensor-parallel twin of a :class:`distlab.models.TinyMLP` (ReLU), sliced from its weights."""
    tp = ParallelMLP(mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features, activation=torch.relu,
                     group=group, sequence_parallel=sequence_parallel)
    return load_full_weights(tp, mlp)


class ParallelAttention(nn.Module):
    """Causal self-attention with the heads split over the ranks: ``heads / N`` heads each.

    Heads never talk to each other until the output projection, so each rank computes
    attention for its own heads with no communication: ``qkv`` is column-parallel (sliced per
    head, in each of q, k and v) and ``proj`` row-parallel. Like the MLP: one all-reduce
    forward, one backward. Same parameter names as :class:`distlab.models.CausalSelfAttention`.
    """

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        n, _ = world(group)
        self.local_heads = divide(cfg.heads, n, "the number of attention heads")
        self.head_dim = cfg.dim // cfg.heads
        self.qkv = ColumnParallelLinear(cfg.dim, 3 * cfg.dim, parts=3, group=group, sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear(cfg.dim, cfg.dim, group=group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)               # each (batch, seq, my heads * head_dim)
        batch, seq, _ = q.shape
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))


# -- the whole model -----------------------------------------------------------------------------

class ParallelBlock(nn.Module):
    """:class:`distlab.models.Block` with parallel attention and MLP (same names, same maths)."""

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        sp = dict(group=group, sequence_parallel=sequence_parallel)
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = ParallelAttention(cfg, **sp)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = ColumnParallelLinear(cfg.dim, cfg.mlp_ratio * cfg.dim, **sp)
        self.fc2 = RowParallelLinear(cfg.mlp_ratio * cfg.dim, cfg.dim, **sp)
        if sequence_parallel:
            _mark_sequence_parallel(self.norm1)
            _mark_sequence_parallel(self.norm2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ParallelGPT(nn.Module):
    """:class:`distlab.models.TinyGPT`, tensor-parallel: returns this rank's ``(batch, seq, V/N)`` logits.

    Vocab-parallel token embedding and output layer, head-parallel attention, Megatron MLPs;
    the position embedding and the LayerNorms are replicated. Per block: two all-reduces
    forward, two backward (or, sequence parallel, two all-gathers and two reduce-scatters each
    way). Use :func:`loss` for the loss: the logits are sharded.
    """

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        sp = dict(group=group, sequence_parallel=sequence_parallel)
        self.tok = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, **sp)
        self.pos = nn.Embedding(cfg.context, cfg.dim)
        self.blocks = nn.ModuleList(ParallelBlock(cfg, **sp) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = ColumnParallelLinear(cfg.dim, cfg.vocab_size, **sp)   # vocab-parallel output layer
        if sequence_parallel:
            _mark_sequence_parallel(self.pos)
            _mark_sequence_parallel(self.norm)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        if self.sequence_parallel:              # the embedding hands me my part of the sequence
            divide(tokens.shape[1], world(self.group)[0], "the sequence length (sequence parallel)")
            positions = split(positions, 0, self.group)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parallelize_gpt(reference: models.TinyGPT, group=None, sequence_parallel: bool = False) -> ParallelGPT:
    """The tensor-parallel twin of ``reference``, sliced from its weights (build it with the same seed on every rank)."""
    return load_full_weights(ParallelGPT(reference.cfg, group=group, sequence_parallel=sequence_parallel), reference)


def loss(model: ParallelGPT, batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch, the same value on every rank."""
    inputs, targets = batch
    return vocab_parallel_cross_entropy(model(inputs), targets, model.group).mean()


def all_reduce_sequence_parallel_gradients(model: nn.Module, group=None) -> None:
    """Sum over the ranks the gradients of parameters that saw only a part of the sequence.

    Call after ``backward()`` in a sequence-parallel model (Megatron does the same for its
    LayerNorms). Nothing to do without sequence parallelism: then every replicated parameter
    sees the whole sequence and gets the whole gradient on every rank.
    """
    for p in model.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)


def save_only_sequence_shards(model: nn.Module) -> nn.Module:
    """Make every sequence-parallel column layer of ``model`` save its input shard, not the gathered input.

    Trades one extra all-gather per column-parallel layer in backward for activations that
    are all split ``N`` ways (see :class:`_GatherThenLinear`). No effect without sequence
    parallelism. Returns ``model``.
    """
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear):
            module.save_sharded_input = True
    return model
