"""distlab.context_parallel against plain single-process attention and its gradients.

Tolerances (``checks.assert_tensor_close``: ``|got - want| <= atol + rtol |want|`` with
``atol = atol_scale * max|want|``):

* float64: rtol = atol_scale = 1e-12. The blockwise, ring and Ulysses versions add the same
  terms as one softmax in another grouping (per block, then merged); measured at most 9e-16 of
  the largest value (outputs and gradients of order 1, 2 and 4 ranks): a 1000x margin, and any
  real mistake (a block merged with the wrong weight, a missing block, a mask off by one
  token) is off by a sizeable fraction of the values.
* float32: rtol = atol_scale = 2e-5 (``F32``). eps = 6e-8; a merged result is a weighted sum
  of per-block results, each weight an ``exp`` of a difference of log-sum-exps, each a few
  roundings. Against float64 attention on the same inputs the ring is measured within 3e-7 of
  the largest output and 6e-7 of the largest gradient (Ulysses within 3e-7); the float32
  reference it is compared with carries an error of the same size: 2e-5 leaves a 15x margin.

Inputs are standard normal (scores of order 1) except where a test says otherwise.

The distributed checks share one ``distlab.Pool`` per world size and one call on it
(``everything``): every ring, Ulysses and torch case runs on tiny shapes (16 and 13 tokens),
and each test compares a part of the returned results with the single-process reference. The
file takes about a minute on 2 busy cores, most of it starting ranks and importing DTensor.

Checked to fail when the implementation is broken: the next block's transfer posted after the
block is computed (no overlap), the gradient accumulators not brought home (gradient shapes and
values wrong), blocks merged without the log-sum-exp weights, a wrong causal skip.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from grading_support import value_errors

import distlab
from distlab.context_parallel import balance, blockwise, layout, ring, ulysses
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


# -- on ranks: one call per world size runs every case ----------------------------------------------

WORLD_SIZES = (2, 4)
LENGTHS = (16, 13)              # 16: 2N equal chunks on 2 and 4 ranks; 13: chunks of 2 and 1 tokens
DTYPES = ("float64", "float32")
LAYOUTS = ("contiguous", "balanced")


def full_inputs(seq, dtype):
    """q, k, v and the gradient of the output, the same on every rank and in the test."""
    g = torch.Generator().manual_seed(seq)
    return tuple(torch.randn(*SHAPE[:2], seq, SHAPE[3], generator=g, dtype=getattr(torch, dtype)) for _ in range(4))


def make_layout(name, seq, n):
    from distlab.context_parallel import balance, layout

    return layout.contiguous(seq, n) if name == "contiguous" else balance.balanced(seq, n)


def _calls(log):
    return [(c.op, c.sent, c.received) for c in log]


def _ring_case(seq, causal, dtype, layout_name):
    """Ring attention on this rank's shard: output, gradients, messages, blocks computed, overlap seen."""
    import torch.distributed as dist

    from distlab.context_parallel import layout, ring
    from distlab.tools import comm

    n, me = dist.get_world_size(), dist.get_rank()
    the_layout = make_layout(layout_name, seq, n)
    q, k, v, grad_out = (layout.shard(t, the_layout, me) for t in full_inputs(seq, dtype))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    blocks, overlapped = [], []

    def on_block(step, source, q_range, k_range):
        blocks.append((step, source, q_range, k_range))
        if step < n - 1:        # the next block's transfer must be on its way while this one computes
            overlapped.append(any(c.op == "batch_isend_irecv" for c in comm.pending_async()))

    with comm.record() as forward:
        out = ring.ring_attention(q, k, v, causal, the_layout, on_block=on_block)
    with comm.record() as backward:
        out.backward(grad_out)
    return {"out": out.detach(), "grads": (q.grad, k.grad, v.grad), "forward": _calls(forward),
            "backward": _calls(backward), "blocks": blocks, "overlapped": overlapped}


def _ulysses_case(seq, causal, dtype, layout_name):
    """Ulysses on this rank's shard: output, gradients, messages forward and backward."""
    import torch.distributed as dist

    from distlab.context_parallel import layout, ulysses
    from distlab.tools import comm

    n, me = dist.get_world_size(), dist.get_rank()
    the_layout = make_layout(layout_name, seq, n)
    q, k, v, grad_out = (layout.shard(t, the_layout, me) for t in full_inputs(seq, dtype))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    with comm.record() as forward:
        out = ulysses.ulysses_attention(q, k, v, causal, the_layout)
    with comm.record() as backward:
        out.backward(grad_out)
    return {"out": out.detach(), "grads": (q.grad, k.grad, v.grad), "forward": _calls(forward),
            "backward": _calls(backward)}


def _torch_ring(seq, causal, merge_in_float32):
    """torch's own ring (its private templated ring, CPU kernels) on the shards ours takes: output, gradients."""
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    from distlab.context_parallel import layout, torch_native

    n, me = dist.get_world_size(), dist.get_rank()
    the_layout = make_layout("balanced" if causal else "contiguous", seq, n)
    q, k, v, grad_out = (layout.shard(t, the_layout, me) for t in full_inputs(seq, "float64"))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    with CommDebugMode() as forward:
        out = torch_native.torch_ring_attention(q, k, v, causal, merge_in_float32=merge_in_float32)
    out.backward(grad_out)
    return {"out": out.detach(), "grads": (q.grad, k.grad, v.grad),
            "forward": {str(op): count for op, count in forward.get_comm_counts().items()}}


def _torch_public_api_causal(seq):
    """torch's context_parallel() as documented, on the CPU, causal: what it raises."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    q, k, v, _ = full_inputs(seq, "float64")
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except NotImplementedError as e:
        return str(e)
    return None


def _refusals():
    """The ValueError each constraint raises, by name."""
    import torch.distributed as dist

    from distlab.context_parallel import layout, ring, ulysses

    n = dist.get_world_size()
    q = torch.zeros(1, n, 3, 4)
    attempts = {
        "too short": lambda: layout.contiguous(2 * n - 1, n),
        "wrong tokens": lambda: ring.ring_attention(q, q, q, layout=layout.contiguous(8 * n, n)),
        "heads": lambda: ulysses.ulysses_attention(*(torch.zeros(1, n + 1, 4, 4),) * 3),
    }
    return value_errors(attempts)


def _traced_case(seq):
    """Ring attention under timeline.traced(): its events, its output, and whether the ring's functions came back."""
    import torch.distributed as dist

    from distlab.context_parallel import blockwise, layout, ring, timeline

    n, me = dist.get_world_size(), dist.get_rank()
    the_layout = layout.contiguous(seq, n)
    q, k, v, grad_out = (layout.shard(t, the_layout, me) for t in full_inputs(seq, "float64"))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    before = (ring._post_exchange, ring._wait, blockwise.block_attention, blockwise.block_backward)
    with timeline.traced() as tracer:
        out = ring.ring_attention(q, k, v, layout=the_layout)
        out.backward(grad_out)
    restored = before == (ring._post_exchange, ring._wait, blockwise.block_attention, blockwise.block_backward)
    return {"events": tracer.events, "out": out.detach(), "grads": (q.grad, k.grad, v.grad), "restored": restored}


MODEL_CONFIG = dict(context=13, layers=2, dim=16, heads=4)   # 13 tokens: uneven chunks on 2 and 4 ranks
MODEL_CASES = [("ring", False), ("ring", True), ("ulysses", False)]


def _model_case(attend_name, checkpoint_blocks):
    """TinyGPT in float64 under context parallelism (balanced layout): the summed loss and gradients."""
    import torch.distributed as dist

    from distlab import models
    from distlab.context_parallel import balance, ring, ulysses
    from distlab.context_parallel import model as cp_model

    n = dist.get_world_size()
    gpt = models.build("gpt", seed=0, **MODEL_CONFIG).double()
    batch = models.example_batch("gpt", batch_size=2, seed=1, **MODEL_CONFIG)
    attend = {"ring": ring.ring_attention, "ulysses": ulysses.ulysses_attention}[attend_name]
    share = cp_model.loss(gpt, batch, balance.balanced(MODEL_CONFIG["context"], n), attend=attend,
                          checkpoint_blocks=checkpoint_blocks)
    share.backward()
    cp_model.all_reduce_gradients(gpt)
    total = share.detach().clone()
    dist.all_reduce(total)
    return {"loss": total, "grads": models.gradients(gpt)}


ULYSSES_CASES = [("contiguous", seq, causal, dtype) for seq in LENGTHS for causal in (False, True) for dtype in DTYPES]
ULYSSES_CASES.append(("balanced", 13, True, "float64"))     # any layout: the mask comes from positions


def everything():
    cases = {("ring", name, seq, causal, dtype): _ring_case(seq, causal, dtype, name)
             for name in LAYOUTS for seq in LENGTHS for causal in (False, True) for dtype in DTYPES}
    cases.update({("ulysses", *case): _ulysses_case(*case[1:], case[0]) for case in ULYSSES_CASES})
    cases.update({("torch", causal, f32): _torch_ring(16, causal, f32) for causal in (False, True)
                  for f32 in (False, True)})
    cases["torch public causal"] = _torch_public_api_causal(16)
    cases.update({("model", *case): _model_case(*case) for case in MODEL_CASES})
    cases["traced"] = _traced_case(16)
    return {**cases, "refusals": _refusals()}


@pytest.fixture(scope="module")
def results():
    """{world size: per-rank results of everything()}, one call per warm pool."""
    with distlab.Pool(2), distlab.Pool(4):
        yield {n: distlab.run(everything, nprocs=n, timeout=120) for n in WORLD_SIZES}


def single_process(seq, causal, dtype):
    q, k, v, grad_out = full_inputs(seq, dtype)
    return reference(q, k, v, causal, grad_out)


RING_CASES = [(name, seq, causal, dtype) for name in LAYOUTS for seq in LENGTHS for causal in (False, True)
              for dtype in DTYPES]


def assert_matches_single_process(results, n, method, case):
    """The output and the gradients of q, k and v that ``method`` computed on ``n`` ranks, put
    back in sequence order, against one process's attention (tolerances: ``TOLERANCE``)."""
    name, seq, causal, dtype = case
    the_layout = make_layout(name, seq, n)
    per_rank = [r[(method, *case)] for r in results[n]]
    want_out, *want_grads = single_process(seq, causal, dtype)
    tolerance = TOLERANCE[getattr(torch, dtype)]
    got_out = layout.unshard([r["out"] for r in per_rank], the_layout)
    checks.assert_tensor_close(got_out, want_out, f"{method} output ({n} ranks)", **tolerance)
    for i, what in enumerate("qkv"):
        got = layout.unshard([r["grads"][i] for r in per_rank], the_layout)
        checks.assert_tensor_close(got, want_grads[i], f"{method} gradient of {what} ({n} ranks)", **tolerance)


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("case", RING_CASES, ids=lambda c: "-".join(map(str, c)))
def test_ring_attention_matches_single_process_attention_and_gradients(results, n, case):
    assert_matches_single_process(results, n, "ring", case)


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("seq", LENGTHS)
def test_ring_sends_one_key_value_block_per_step_forward_and_the_gradients_back(results, n, seq):
    batch, heads, _, head_dim = SHAPE
    for name in LAYOUTS:
        the_layout = make_layout(name, seq, n)
        for dtype in DTYPES:
            size = getattr(torch, dtype).itemsize
            for rank, r in enumerate(results[n]):
                case = r[("ring", name, seq, True, dtype)]
                assert {op for op, _, _ in case["forward"] + case["backward"]} == {"batch_isend_irecv"}
                forward = ring.ring_bytes_per_step(the_layout, rank, batch, heads, head_dim, size)
                assert [(s, r_) for _, s, r_ in case["forward"]] == forward[:-1]   # nothing in the last step
                backward = ring.ring_bytes_per_step(the_layout, rank, batch, heads, head_dim, size, backward=True)
                # per step: the block going on (all but the last step), then its gradient accumulator
                calls = [(s, r_) for _, s, r_ in case["backward"]]
                per_step = [tuple(map(sum, zip(*calls[2 * i:2 * i + 2]))) for i in range(n)]
                assert per_step == backward
                if seq % n == 0:
                    assert sum(s for _, s, _ in case["forward"]) == ring.ring_bytes(n, seq, batch, heads, head_dim, size)
                    assert sum(s for _, s, _ in case["backward"]) == ring.ring_bytes(
                        n, seq, batch, heads, head_dim, size, backward=True)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_ring_posts_the_next_transfer_before_computing_and_skips_future_blocks(results, n):
    for rank, r in enumerate(results[n]):
        plain, causal = r[("ring", "contiguous", 16, False, "float64")], r[("ring", "contiguous", 16, True, "float64")]
        assert [(step, source) for step, source, _, _ in plain["blocks"]] == [(s, (rank - s) % n) for s in range(n)]
        assert plain["overlapped"] and all(plain["overlapped"]), "a block was computed with no transfer in flight"
        assert causal["overlapped"] and all(causal["overlapped"])
        # contiguous: a rank never computes on a block from a later rank
        assert all(source <= rank for _, source, _, _ in causal["blocks"])


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("seq", LENGTHS)
def test_the_ring_computes_the_blocks_the_work_count_says_and_balance_evens_them(results, n, seq):
    for name in LAYOUTS:
        the_layout = make_layout(name, seq, n)
        expected_blocks = balance.causal_chunk_pairs(the_layout)
        expected_pairs = balance.causal_score_pairs(the_layout)
        for rank, r in enumerate(results[n]):
            blocks = r[("ring", name, seq, True, "float64")]["blocks"]
            assert len(blocks) == expected_blocks[rank], (name, rank, blocks)
            # the unmasked (query, key) pairs inside the blocks it computed: all of its work, once
            seen = sum(sum(min(k_stop, q + 1) - k_start for q in range(*q_range) if q >= k_start)
                       for _, _, q_range, (k_start, k_stop) in blocks)
            assert seen == expected_pairs[rank], (name, rank)
    contiguous, balanced = (balance.causal_chunk_pairs(make_layout(name, seq, n)) for name in LAYOUTS)
    assert contiguous == [4 * r + 3 for r in range(n)]          # the last rank: 4N-1 blocks
    assert balanced == [2 * n + 1] * n                          # every rank: 2N+1
    assert sum(contiguous) == sum(balanced) == n * (2 * n + 1)  # the same work, moved


def test_balanced_layout_gives_rank_r_chunks_r_and_2n_minus_1_minus_r():
    assert balance.balanced(16, 4).chunks == (((0, 2), (14, 16)), ((2, 4), (12, 14)), ((4, 6), (10, 12)),
                                              ((6, 8), (8, 10)))
    assert layout.contiguous(13, 2).chunks == (((0, 4), (4, 7)), ((7, 10), (10, 13)))   # 4+3+3+3 tokens
    x = torch.arange(2 * 13 * 3).view(2, 13, 3)
    for the_layout in (balance.balanced(13, 2), balance.balanced(13, 4), layout.contiguous(13, 4)):
        shards = [layout.shard(x, the_layout, r, dim=1) for r in range(the_layout.ranks)]
        assert torch.equal(layout.unshard(shards, the_layout, dim=1), x)
        assert sorted(torch.cat([the_layout.positions(r) for r in range(the_layout.ranks)]).tolist()) == list(range(13))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_balanced_layout_gives_every_rank_the_same_causal_work(n):
    seq = 2 * n * 64
    before = balance.causal_score_pairs(layout.contiguous(seq, n))
    after = balance.causal_score_pairs(balance.balanced(seq, n))
    assert sum(before) == sum(after) == seq * (seq + 1) // 2
    assert len(set(after)) == 1                                  # exactly equal when 2N divides the length
    # contiguous: the last rank's queries see (N - 1/2) / (1/2) ~ 2N-1 times the first rank's keys
    assert before[-1] / before[0] == pytest.approx(2 * n - 1, rel=0.02)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_too_short_a_sequence_and_a_shard_of_the_wrong_length_are_refused(results, n):
    messages = results[n][0]["refusals"]
    assert messages["too short"] is not None and f"{2 * n - 1} tokens" in messages["too short"]
    assert messages["wrong tokens"] is not None and "holds 3 tokens" in messages["wrong tokens"], messages
    assert messages["heads"] is not None and f"heads ({n + 1})" in messages["heads"] and f"over {n} ranks" in \
        messages["heads"], messages


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("case", ULYSSES_CASES, ids=lambda c: "-".join(map(str, c)))
def test_ulysses_matches_single_process_attention_and_gradients(results, n, case):
    assert_matches_single_process(results, n, "ulysses", case)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_ulysses_sends_four_all_to_alls_each_way_two_over_n_of_the_rings_bytes(results, n):
    batch, heads, _, head_dim = SHAPE
    seq = 16
    for dtype in DTYPES:
        size = getattr(torch, dtype).itemsize
        expected = ulysses.ulysses_bytes(n, seq, batch, heads, head_dim, size)
        for r in results[n]:
            case = r[("ulysses", "contiguous", seq, True, dtype)]
            for direction in ("forward", "backward"):
                assert [op for op, _, _ in case[direction]] == ["all_to_all_single"] * 4
                assert sum(s for _, s, _ in case[direction]) == sum(r_ for _, _, r_ in case[direction]) == expected
            ring_forward = sum(s for _, s, _ in r[("ring", "contiguous", seq, True, dtype)]["forward"])
            assert expected / ring_forward == pytest.approx(2 / n)     # measured ring bytes, same inputs


def test_ulysses_and_ring_bytes_as_functions_of_ranks_and_length():
    shape = {"batch": 1, "heads": 64, "head_dim": 128, "element_size": 2}
    for seq in (8192, 131072):
        whole = seq * 64 * 128 * 2
        for n in (2, 4, 8, 16, 64):
            ring_bytes = ring.ring_bytes(n, seq, **shape)
            assert ring_bytes == 2 * (n - 1) * whole // n                 # near 2 whole tensors, whatever N
            assert ulysses.ulysses_bytes(n, seq, **shape) * n == 2 * ring_bytes   # 2/N of the ring's
            assert ring.ring_bytes(n, seq, **shape, backward=True) == (2 * n - 1) * whole * 2 // n


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_torchs_own_ring_on_the_cpu_kernels_matches_ours_and_the_reference(results, n, causal):
    """torch's templated ring: tight in float64 when it merges in float64, float32-close by default."""
    name = "balanced" if causal else "contiguous"           # torch balances causal attention as we do
    the_layout = make_layout(name, 16, n)
    want_out, *want_grads = single_process(16, causal, "float64")
    ours = [r[("ring", name, 16, causal, "float64")] for r in results[n]]
    for merge_in_float32, tolerance in ((False, F64), (True, F32)):   # torch's default merges in float32
        theirs = [r[("torch", causal, merge_in_float32)] for r in results[n]]
        got = layout.unshard([r["out"] for r in theirs], the_layout)
        checks.assert_tensor_close(got, want_out, f"torch's ring output ({n} ranks)", **tolerance)
        checks.assert_tensor_close(got, layout.unshard([r["out"] for r in ours], the_layout), "torch's ring vs ours",
                                   **tolerance)
        for i, what in enumerate("qkv"):
            got = layout.unshard([r["grads"][i] for r in theirs], the_layout)
            checks.assert_tensor_close(got, want_grads[i], f"torch's gradient of {what} ({n} ranks)", **tolerance)
        for r in theirs:   # it gathers every key/value block at once instead of passing them round
            assert r["forward"] == {"c10d_functional.all_gather_into_tensor": 1}, r["forward"]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_torchs_public_context_parallel_refuses_causal_attention_on_the_cpu(results, n):
    """What the chapter says of torch 2.13's context_parallel() on gloo: its ring handles only the GPU
    kernels, and the CPU one has no sharding rule. (Not causal, it runs, but DTensor all-gathers the
    keys and values after minutes of sharding propagation through the CPU kernel's decomposition:
    too slow to test; see distlab.context_parallel.torch_native.)"""
    for r in results[n]:
        message = r["torch public causal"]
        assert message is not None and "_scaled_dot_product_flash_attention_for_cpu" in message, message


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_whole_model_on_its_tokens_with_summed_gradients_is_the_single_process_model(results, n, case):
    """distlab.context_parallel.model: every rank runs TinyGPT on its tokens only; the loss shares and
    the all-reduced gradients are one process's, in float64 (F64: the same sums regrouped)."""
    from distlab import models

    gpt = models.build("gpt", seed=0, **MODEL_CONFIG).double()
    batch = models.example_batch("gpt", batch_size=2, seed=1, **MODEL_CONFIG)
    want_loss = models.loss_fn(gpt, batch).detach()
    want = models.reference_gradients(gpt, batch)
    for rank, r in enumerate(results[n]):
        checks.assert_tensor_close(r[("model", *case)]["loss"], want_loss, f"loss summed over {n} ranks", **F64)
        for name, grad in r[("model", *case)]["grads"].items():
            checks.assert_tensor_close(grad, want[name], f"rank {rank}: gradient of {name}", **F64)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_the_traced_ring_records_every_block_and_transfer_and_changes_nothing(results, n):
    """distlab.context_parallel.timeline: per rank N block computations and merges forward, N block
    backwards, N-1 key/value transfers forward, N-1 more and N gradient accumulators backward, each
    transfer a span that ends after it starts; the results are the untraced ring's (F64)."""
    from distlab.context_parallel import timeline

    want_out, *want_grads = single_process(16, False, "float64")
    the_layout = layout.contiguous(16, n)
    for rank, r in enumerate(results[n]):
        t = r["traced"]
        assert t["restored"], f"rank {rank}: timeline.traced() left the ring's functions wrapped"
        names = [e.name for e in t["events"]]
        assert names.count("block_attention") == n and names.count("merge") == n, names
        assert names.count("block_backward") == n, names
        assert names.count("forward: key/value block") == n - 1, names
        assert names.count("backward: key/value block") == n - 1, names
        assert names.count("backward: gradient accumulator") == n, names
        assert all(e.end >= e.start for e in t["events"])
    events = [r["traced"]["events"] for r in results[n]]
    assert 0.0 <= timeline.hidden_fraction(events) <= 1.0
    got = layout.unshard([r["traced"]["out"] for r in results[n]], the_layout)
    checks.assert_tensor_close(got, want_out, "traced ring output", **F64)
    for i, what in enumerate("qkv"):
        got = layout.unshard([r["traced"]["grads"][i] for r in results[n]], the_layout)
        checks.assert_tensor_close(got, want_grads[i], f"traced ring: gradient of {what}", **F64)


@pytest.mark.parametrize("causal", [False, True])
def test_one_rank_without_a_process_group_is_plain_attention(causal):
    """N = 1: no messages, one step over the rank's own block; Ulysses is attention itself."""
    q, k, v, grad_out = full_inputs(13, "float64")
    want_out, *want_grads = reference(q, k, v, causal, grad_out)
    for attention in (ring.ring_attention, ulysses.ulysses_attention):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attention(*leaves, causal)
        out.backward(grad_out)
        checks.assert_tensor_close(out.detach(), want_out, f"{attention.__name__} on one rank", **F64)
        for leaf, want, what in zip(leaves, want_grads, "qkv"):
            checks.assert_tensor_close(leaf.grad, want, f"{attention.__name__}: gradient of {what}", **F64)
    assert ring.ring_bytes_per_step(layout.contiguous(13, 1), 0, 2, 4, 8, 8, backward=True) == [(0, 0)]
