"""Tensor parallelism the library way: the same TinyGPT, sharded by torch's DTensor plans.

The rest of :mod:`distlab.tensor_parallel` writes every collective by hand. PyTorch's
``torch.distributed.tensor.parallel`` does the same job with *placements*: a ``DTensor`` is
a tensor whose pieces live on the ranks of a ``DeviceMesh``, each dimension described as
``Shard(d)`` (split along dimension ``d``), ``Replicate()`` (a full copy everywhere) or
``Partial()`` (every rank holds a summand; the true value is the sum). A *parallel style*
says how a module's weights are placed and how its inputs and outputs must be laid out;
DTensor then inserts the collectives that convert one layout into the next:

=====================================  =====================================================
style                                  what it does (and which of our layers it is)
=====================================  =====================================================
``ColwiseParallel()``                  weight ``Shard(0)``, input ``Replicate``: our
                                       :class:`~distlab.tensor_parallel.layers.ColumnParallelLinear`
``RowwiseParallel()``                  weight ``Shard(1)``, output ``Partial`` -> ``Replicate``
                                       (an all-reduce): our ``RowParallelLinear``
``RowwiseParallel(output_layouts=      ... -> ``Shard(1)``: a reduce-scatter along the
Shard(1))``                            sequence, our ``sequence_parallel=True``
``SequenceParallel()``                 LayerNorm on sequence shards; its replicated weights
                                       get their gradient summed over the ranks for you
``PrepareModuleInput(...)``            redistribute a module's inputs (``Shard(1)`` ->
                                       ``Replicate``: the all-gather before attention)
``loss_parallel()``                    cross-entropy on vocabulary-sharded logits: our
                                       :func:`~distlab.tensor_parallel.layers.vocab_parallel_cross_entropy`
=====================================  =====================================================

One catch, and the reason for :class:`SplitQKVAttention`: ``ColwiseParallel`` cuts a weight
into ``N`` contiguous blocks of rows. TinyGPT's attention stacks q, k and v in one fused
``qkv`` layer, so the first block would hold all of q and none of v; our
``ColumnParallelLinear(parts=3)`` knows to cut each of the three. With DTensor the simple
fix is three separate layers (which is why TorchTitan's Llama has ``wq``, ``wk``, ``wv``), and
the attention must not assume it sees all heads: it reshapes to ``(-1, head_dim)``, so the
number of heads is whatever this rank holds.

Where the two versions differ: DTensor adds the position embedding to replicated token
embeddings and *then* cuts the sequence (an all-reduce after the embedding, not a
reduce-scatter), because TinyGPT's learned position embedding indexes the full sequence.
The gradients are the same; :func:`reference_gradients` turns every rank's DTensor
gradients back into full tensors named as in :class:`distlab.models.TinyGPT`, so they can
be compared with the single-process model and with the from-scratch version.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab import models


class SplitQKVAttention(nn.Module):
    """TinyGPT's causal attention with q, k and v as three layers, for ``ColwiseParallel``."""

    def __init__(self, fused: models.CausalSelfAttention):
        super().__init__()
        dim = fused.proj.in_features
        self.head_dim = dim // fused.heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        with torch.no_grad():
            for layer, weight, bias in zip((self.q, self.k, self.v), fused.qkv.weight.split(dim), fused.qkv.bias.split(dim)):
                layer.weight.copy_(weight)
                layer.bias.copy_(bias)
        self.proj = fused.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1: however many heads this rank's slice of q, k and v holds
        q, k, v = (layer(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for layer in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


def plan(model: models.TinyGPT, sequence_parallel: bool = False) -> dict:
    """The parallelisation plan of a TinyGPT (with split q/k/v): ``{module name: parallel style}``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    seq = Shard(1)                                            # activations are (batch, seq, dim)
    styles = {"tok": RowwiseParallel(input_layouts=Replicate()),          # vocab-parallel embedding
              "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}  # vocab-sharded logits
    if sequence_parallel:
        styles["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(seq,),
                                                use_local_output=True)   # the residual stream: plain shards
        styles["norm"] = SequenceParallel()
        styles["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    for i in range(len(model.blocks)):
        block = f"blocks.{i}."
        styles.update({block + name: ColwiseParallel() for name in ("attn.q", "attn.k", "attn.v", "fc1")})
        styles[block + "attn.proj"] = RowwiseParallel()
        styles[block + "fc2"] = RowwiseParallel()
        if sequence_parallel:
            styles[block + "norm1"] = SequenceParallel()
            styles[block + "norm2"] = SequenceParallel()
            styles[block + "attn"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
            styles[block + "fc1"] = ColwiseParallel(input_layouts=seq)    # all-gathers its input first
            styles[block + "attn.proj"] = RowwiseParallel(output_layouts=seq)
            styles[block + "fc2"] = RowwiseParallel(output_layouts=seq)
    return styles


def parallelize(reference: models.TinyGPT, mesh=None, sequence_parallel: bool = False) -> models.TinyGPT:
    """A copy of ``reference`` with split q/k/v, sharded over ``mesh`` (default: all ranks) by :func:`plan`."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from distlab.runtime.devices import device

    model = copy.deepcopy(reference)
    for block in model.blocks:
        block.attn = SplitQKVAttention(block.attn)
    if mesh is None:
        mesh = init_device_mesh(device().type, (dist.get_world_size(),))
    return parallelize_module(model.to(device()), mesh, plan(model, sequence_parallel))


def loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean next-token cross-entropy on vocabulary-sharded logits (``loss_parallel``); call backward inside too."""
    from torch.distributed.tensor.parallel import loss_parallel

    inputs, targets = batch
    logits = model(inputs)
    with loss_parallel():
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def backward(loss_value: torch.Tensor) -> None:
    """``loss.backward()`` inside ``loss_parallel`` (the sharded cross-entropy's backward needs it too)."""
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        loss_value.backward()


@contextmanager
def quiet_redistribute():
    """Keep DTensor's redistribution logger to errors meanwhile.

    Gathering a tensor sharded twice takes several collectives, and DTensor logs each such
    gather as "suboptimal": advice for training loops, not for a one-off check or a page.
    """
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def reference_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every gradient as a full tensor, named as in TinyGPT (q, k, v stacked back into ``qkv``).

    A gradient sharded twice (FSDP2 over dp on top of TP, a ``_StridedShard``) is gathered
    in two steps, which DTensor would log as "suboptimal" (see :func:`quiet_redistribute`).
    """
    full = {}
    with quiet_redistribute():
        for name, p in model.named_parameters():
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            full[name] = grad.detach()
    for name in [n for n in full if ".attn.q." in n]:
        prefix, kind = name.split(".attn.q.")
        full[f"{prefix}.attn.qkv.{kind}"] = torch.cat([full.pop(f"{prefix}.attn.{x}.{kind}") for x in "qkv"])
    return full
