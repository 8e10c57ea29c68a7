"""distlab.context_parallel against plain single-process attention and its gradients.

Tolerances (``checks.assert_tensor_close``: ``|got - want| <= atol + rtol |want|`` with
``atol = atol_scale * max|want|``):

* float64: rtol = atol_scale = 1e-12. The blockwise and ring versions add the same terms as
  one softmax in another grouping (per block, then merged); measured at most 1e-15 of the
  largest value (outputs and gradients of order 1): a 1000x margin, and any real mistake (a
  block merged with the wrong weight, a missing block, a mask off by one token) is off by
  a sizeable fraction of the values.
* float32: rtol = atol_scale = 2e-5 (``F32``). eps = 6e-8; a merged result is a weighted
  sum of per-block results, each weight an ``exp`` of a difference of log-sum-exps, each
  a few roundings: measured up to 3e-7 of the largest output and 1e-6 of the largest
  gradient (on 2 and 4 ranks, causal and not, shapes below); 2e-5 leaves a 20x margin.

Inputs are standard normal (scores of order 1) except where a test says otherwise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distlab.context_parallel import blockwise
from distlab.grade import checks

F64 = {"rtol": 1e-12, "atol_scale": 1e-12}
F32 = {"rtol": 2e-5, "atol_scale": 2e-5}
TOLERANCE = {torch.float64: F64, torch.float32: F32}
SHAPE = (2, 4, 13, 8)           # (batch, heads, tokens, head_dim): 13 tokens cut into blocks of 4 leave 1


def qkv(dtype, tokens=SHAPE[2], seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*SHAPE[:2], tokens, SHAPE[3], generator=g, dtype=dtype) for _ in range(3))


def reference(q, k, v, causal, grad_out=None):
    """torch's attention (its math kernel on the CPU) and, with ``grad_out``, its gradients."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    if grad_out is None:
        return out.detach()
    out.backward(grad_out)
    return out.detach(), *(t.grad for t in leaves)


def full_lse(q, k, causal):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(scores, dim=-1)


# -- blockwise attention, one process ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_attention_is_plain_attention_merged_exactly(dtype, causal):
    q, k, v = qkv(dtype)
    want = reference(q, k, v, causal)
    checks.assert_tensor_close(blockwise.attention(q, k, v, causal), want, "plain attention", **TOLERANCE[dtype])
    for block_size in (1, 4, 13):                          # one key at a time, uneven blocks, one block
        out, lse = blockwise.blockwise_attention(q, k, v, block_size, causal)
        checks.assert_tensor_close(out, want, f"blockwise output, blocks of {block_size}", **TOLERANCE[dtype])
        checks.assert_tensor_close(lse, full_lse(q, k, causal), f"log-sum-exp, blocks of {block_size}",
                                   **TOLERANCE[dtype])


def test_merge_is_order_free_and_the_empty_result_is_its_identity():
    q, k, v = qkv(torch.float64)
    parts = [blockwise.block_attention(q, k[..., s, :], v[..., s, :]) for s in (slice(0, 3), slice(3, 9), slice(9, 13))]
    forwards = blockwise.merge(*blockwise.merge(*parts[0], *parts[1]), *parts[2])
    backwards = blockwise.merge(*parts[2], *blockwise.merge(*parts[1], *parts[0]))
    for got in (forwards, backwards):
        checks.assert_tensor_close(got[0], reference(q, k, v, False), "merged output", **F64)
    unchanged = blockwise.merge(*blockwise.empty_result(q), *parts[1])
    assert torch.equal(unchanged[0], parts[1][0]) and torch.equal(unchanged[1], parts[1][1])


def test_the_running_maximum_keeps_large_scores_finite_in_float32():
    """Scores in the hundreds: exp() overflows float32 past 88, but every exp here is of a score minus a maximum."""
    q, k, v = qkv(torch.float64)
    q = 100 * q
    want = reference(q, k, v, True).float()
    assert torch.isinf(torch.exp(full_lse(q, k, True).float())).any(), "the test needs scores that overflow exp()"
    out, lse = blockwise.blockwise_attention(q.float(), k.float(), v.float(), 4, causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    # against float64: scores of ~300 carry float32 errors of ~300 eps, but a softmax this peaked is
    # nearly one-hot and its output is one value row; measured 5e-7 of max|out|, within F32
    checks.assert_tensor_close(out, want, "attention with scores in the hundreds", **F32)


def test_a_row_that_sees_no_key_gives_zero_and_minus_infinity_not_nan():
    q, k, v = qkv(torch.float64)
    allowed = blockwise.causal_allowed(torch.arange(13), torch.arange(6, 10))   # rows 0..5 see nothing
    out, lse = blockwise.block_attention(q, k[..., 6:10, :], v[..., 6:10, :], allowed)
    assert torch.equal(out[..., :6, :], torch.zeros_like(out[..., :6, :]))
    assert torch.isneginf(lse[..., :6]).all() and torch.isfinite(lse[..., 6:]).all()
    grads = blockwise.block_backward(q, k[..., 6:10, :], v[..., 6:10, :], out, lse, torch.ones_like(out), allowed)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_summed_over_blocks_is_autograds_gradient(dtype, causal):
    q, k, v = qkv(dtype)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    want_out, *want = reference(q, k, v, causal, grad_out)
    out, lse = blockwise.blockwise_attention(q, k, v, 4, causal)
    got = [torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)]
    for start in range(0, 13, 4):
        keys = slice(start, start + 4)
        allowed = blockwise.causal_allowed(torch.arange(13), torch.arange(13)[keys]) if causal else None
        dq, dk, dv = blockwise.block_backward(q, k[..., keys, :], v[..., keys, :], out, lse, grad_out, allowed)
        got[0] += dq
        got[1][..., keys, :] += dk
        got[2][..., keys, :] += dv
    for name, g, w in zip("qkv", got, want):
        checks.assert_tensor_close(g, w, f"gradient of {name}", **TOLERANCE[dtype])
