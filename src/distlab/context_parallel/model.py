"""A whole transformer under context parallelism: each rank runs the model on its own tokens only.

A transformer block does two kinds of work. Attention mixes tokens: every query needs the keys
and values of the tokens before it. Everything else works **token by token**: the embeddings
(given each token's position in the whole sequence), the LayerNorms, the MLP, the residual
additions, the output head and the cross-entropy of each token. So a rank that holds the tokens
at positions ``P`` (a :class:`~distlab.context_parallel.layout.Layout`) can run the whole model
on those tokens alone, and only attention has to talk to the other ranks: :func:`forward` is
``distlab.models.TinyGPT``'s forward with ``F.scaled_dot_product_attention`` replaced by
:func:`~distlab.context_parallel.ring.ring_attention` (or
:func:`~distlab.context_parallel.ulysses.ulysses_attention`, any function of that signature).

Every activation a rank keeps for backward then belongs to its ``seq / N`` tokens: the memory
of activations falls as ``1/N``, however long the sequence, and nothing else is needed.

**Gradients.** The parameters are the same on every rank (as in data parallelism), and each rank
sees a part of the tokens. :func:`loss` returns this rank's share of the mean loss, the sum of its
tokens' losses divided by the number of tokens in the whole batch, so that the shares add up to
the mean over everything. Each rank's ``backward`` then gives the gradient of its share; one
all-reduce that sums them (:func:`all_reduce_gradients`) gives every rank the gradient of the
whole loss. For gradients, cp ranks are data-parallel ranks: this is why the planner of chapter
7 shards optimizer states over ``dp * cp`` (``distlab.parallel3d.context``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.context_parallel import ring
from distlab.context_parallel.layout import Layout, shard
from distlab.tools.groups import world


def _attention_block(attn, x, attend):
    """``CausalSelfAttention.forward`` of ``distlab.models`` with the attention function ``attend``."""
    batch, tokens, dim = x.shape
    q, k, v = attn.qkv(x).split(dim, dim=-1)
    q, k, v = (t.view(batch, tokens, attn.heads, dim // attn.heads).transpose(1, 2) for t in (q, k, v))
    y = attend(q, k, v)
    return attn.proj(y.transpose(1, 2).reshape(batch, tokens, dim))


def forward(model, tokens: torch.Tensor, layout: Layout, group=None, attend=ring.ring_attention,
            checkpoint_blocks: bool = False) -> torch.Tensor:
    """Logits ``(batch, my tokens, vocab)`` of this rank's tokens ``(batch, my tokens)``, in layout order.

    ``model`` is a ``distlab.models.TinyGPT`` (the same weights on every rank). ``attend(q, k, v,
    causal=, layout=, group=)`` is called once per block on this rank's queries, keys and values.
    ``checkpoint_blocks``: keep only each block's input for backward and recompute the rest
    (activation checkpointing), as ``torch.utils.checkpoint`` does on one process.
    """
    _, me = world(group)
    positions = layout.positions(me).to(tokens.device)

    def attention(q, k, v):
        return attend(q, k, v, causal=True, layout=layout, group=group)

    def block_forward(block, x):
        x = x + _attention_block(block.attn, block.norm1(x), attention)
        return x + block.fc2(F.gelu(block.fc1(block.norm2(x))))

    x = model.tok(tokens) + model.pos(positions)
    for block in model.blocks:
        if checkpoint_blocks:
            x = torch.utils.checkpoint.checkpoint(block_forward, block, x, use_reentrant=False)
        else:
            x = block_forward(block, x)
    return model.head(model.norm(x))


def shard_batch(batch, layout: Layout, rank: int):
    """This rank's tokens of a ``(inputs, targets)`` batch, both ``(batch, seq)``, in layout order."""
    return tuple(shard(t, layout, rank, dim=1) for t in batch)


def loss(model, batch, layout: Layout, group=None, **options) -> torch.Tensor:
    """This rank's share of the mean next-token loss: its tokens' losses summed, over the batch's tokens.

    ``batch`` is the *whole* batch (every rank makes the same one); the rank takes its own tokens.
    Summed over the ranks, the shares are ``distlab.models.loss_fn`` of the whole batch.
    """
    _, me = world(group)
    inputs, targets = shard_batch(batch, layout, me)
    logits = forward(model, inputs, layout, group, **options)
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return total / batch[1].numel()


def all_reduce_gradients(model, group=None) -> None:
    """Sum every parameter's gradient over the cp ranks: each rank's is the gradient of its share."""
    if world(group)[0] == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
