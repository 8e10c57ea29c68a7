"""Attention one key/value block at a time, and the exact merge of partial results (the online softmax).

Attention for one query row ``q`` over keys ``k_1..k_S`` and values ``v_1..v_S`` is

    out = sum_j exp(s_j) v_j / Z,    s_j = q . k_j / sqrt(d),    Z = sum_j exp(s_j).

Split the keys into two blocks ``A`` and ``B``. Each block alone gives its own normalised
answer, ``out_A = sum_{j in A} exp(s_j) v_j / Z_A``, and its **log-sum-exp**
``lse_A = log Z_A``. Then ``Z = Z_A + Z_B`` and

    out = (Z_A out_A + Z_B out_B) / (Z_A + Z_B)
        = w_A out_A + w_B out_B,     w_A = exp(lse_A - lse),   lse = log(exp(lse_A) + exp(lse_B)).

So two partial results, each a pair ``(out, lse)``, combine into the result over both
blocks (:func:`merge`), and nothing but those pairs is needed: not the scores, not the
other block's keys. The merge is *exact*: it is the same sum regrouped, so the only
difference from attention over all the keys at once is floating-point rounding. It costs one
``exp`` and a few multiply-adds per query row and feature, and keeps one extra number per
query row (``lse``), against ``S`` scores per row for the plain formula.

``exp(s)`` overflows for scores above ~88 in float32, which is why softmax subtracts the
row's maximum first. Here the maximum is kept as it goes (the *running maximum* ``m``): a
block's scores are exponentiated after subtracting the block's maximum
(:func:`block_attention`), and the merge subtracts the larger of the two ``lse`` before
exponentiating, so every ``exp`` is at most 1. FlashAttention (Dao et al., 2022) keeps the
running maximum ``m``, the running sum ``l`` and an unnormalised output instead; ``lse`` is
``m + log l``, the same information in one number.

Masked keys (causal attention: a query may not see later tokens) get a score of ``-inf``:
``exp(-inf) = 0``. A block in which a query row sees no key at all has ``Z = 0``, so
``lse = -inf`` and weight 0 in every merge; the functions below keep such rows at
``out = 0``, ``lse = -inf`` instead of ``0/0``.

The backward pass needs nothing new (:func:`block_backward`): with the *final* ``out`` and
``lse`` of each row, the softmax probabilities of any block are ``exp(s - lse)``, so the
gradients of ``q``, ``k`` and ``v`` are sums over blocks as well (FlashAttention-2's
backward). Ring attention (:mod:`.ring`) runs exactly these three functions on the blocks it
receives.

Shapes follow ``F.scaled_dot_product_attention``: ``(batch, heads, tokens, head_dim)``;
``lse`` is ``(batch, heads, tokens)``.
"""

from __future__ import annotations

import math

import torch


def default_scale(head_dim: int) -> float:
    """``1/sqrt(head_dim)``: the scale of the scores in every transformer since Vaswani et al."""
    return 1.0 / math.sqrt(head_dim)


def causal_allowed(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``allowed[i, j]``: may the query at ``q_positions[i]`` see the key at ``k_positions[j]``?

    Causal attention lets a token see itself and earlier tokens. Positions are indices in the
    *whole* sequence, so the same rule works for a block from any rank and any layout.
    """
    return k_positions.unsqueeze(0) <= q_positions.unsqueeze(1)


def _masked_scores(q, k, allowed, scale):
    scores = (q @ k.transpose(-2, -1)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def _finite(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-inf`` replaced by 0, for subtracting: ``-inf - (-inf)`` would be NaN."""
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


def attention(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Plain attention: every score materialised, one softmax. The reference the others are checked against."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    allowed = None
    if causal:
        allowed = causal_allowed(torch.arange(q.shape[-2]), torch.arange(k.shape[-2])).to(q.device)
    return torch.softmax(_masked_scores(q, k, allowed, scale), dim=-1) @ v


def block_attention(q, k, v, allowed: torch.Tensor | None = None, scale: float | None = None):
    """Attention of ``q`` over one block of keys and values: ``(out, lse)``.

    ``allowed`` (``(q tokens, k tokens)``, boolean, or ``None`` for all) masks keys out.
    ``out`` is normalised over this block only; ``lse`` is the log of this block's sum of
    ``exp(score)``, what :func:`merge` needs to combine it with other blocks.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    scores = _masked_scores(q, k, allowed, scale)
    m = _finite(scores.amax(dim=-1, keepdim=True))      # the block's maximum: every exp() <= 1
    p = torch.exp(scores - m)
    total = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / total.clamp_min(torch.finfo(p.dtype).tiny)   # 0 / tiny = 0 where nothing was seen
    lse = (m + torch.log(total)).squeeze(-1)           # log(0) = -inf: a row that saw nothing
    return out, lse


def merge(out_a, lse_a, out_b, lse_b):
    """Combine two partial results over disjoint key blocks into the result over both: ``(out, lse)``.

    ``out = w_a out_a + w_b out_b`` with ``w = exp(lse_part - lse)``: each block's share of
    the total ``exp(score)``. The larger ``lse`` (the running maximum) is subtracted before
    ``exp``, so nothing overflows; a part with ``lse = -inf`` weighs nothing.
    """
    m = _finite(torch.maximum(lse_a, lse_b))
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    safe = total.clamp_min(torch.finfo(total.dtype).tiny)
    out = (w_a / safe).unsqueeze(-1) * out_a + (w_b / safe).unsqueeze(-1) * out_b
    return out, lse


def empty_result(q: torch.Tensor, head_dim_v: int | None = None):
    """The result over no keys at all: ``out = 0``, ``lse = -inf``; merging with it changes nothing."""
    out = q.new_zeros(*q.shape[:-1], q.shape[-1] if head_dim_v is None else head_dim_v)
    return out, q.new_full(q.shape[:-1], float("-inf"))


def blockwise_attention(q, k, v, block_size: int, causal: bool = False, scale: float | None = None):
    """Attention over keys cut into blocks of ``block_size`` tokens, merged one by one: ``(out, lse)``.

    One process, no communication: the loop that FlashAttention runs inside a GPU kernel
    and ring attention runs across ranks. Equal to :func:`attention` up to rounding.
    """
    tokens_q, tokens_k = q.shape[-2], k.shape[-2]
    out, lse = empty_result(q, v.shape[-1])
    for start in range(0, tokens_k, block_size):
        stop = min(start + block_size, tokens_k)
        allowed = None
        if causal:
            allowed = causal_allowed(torch.arange(tokens_q), torch.arange(start, stop)).to(q.device)
            if not allowed.any():
                continue                                # a block entirely in the future: no work
        part = block_attention(q, k[..., start:stop, :], v[..., start:stop, :], allowed, scale)
        out, lse = merge(out, lse, *part)
    return out, lse


def block_backward(q, k, v, out, lse, grad_out, allowed: torch.Tensor | None = None,
                   scale: float | None = None, delta: torch.Tensor | None = None):
    """This block's share of the gradients ``(dq, dk, dv)``, from the *final* ``out`` and ``lse``.

    With ``P = exp(scores - lse)`` (the softmax probabilities of this block's keys, exact
    because ``lse`` covers all keys):

    * ``dv = P^T grad_out``;
    * ``dP = grad_out v^T`` and ``dS = P * (dP - delta)``, where ``delta`` is the row sum of
      ``grad_out * out`` (the softmax's backward, computed once per row: pass it in when
      calling this for many blocks);
    * ``dq = dS k * scale`` and ``dk = dS^T q * scale``.

    ``dq`` summed over all blocks is the full ``dq``; ``dk`` and ``dv`` summed over all query
    blocks are the full ``dk`` and ``dv`` of this block.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    if delta is None:
        delta = (grad_out * out).sum(dim=-1)
    probabilities = torch.exp(_masked_scores(q, k, allowed, scale) - _finite(lse).unsqueeze(-1))  # masked: 0
    grad_v = probabilities.transpose(-2, -1) @ grad_out
    grad_scores = probabilities * (grad_out @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    grad_q = (grad_scores @ k) * scale
    grad_k = (grad_scores.transpose(-2, -1) @ q) * scale
    return grad_q, grad_k, grad_v
