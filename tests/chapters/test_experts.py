"""distlab.tensor_parallel.experts: the expert-parallel MoE layer against the single-process MoE, on 2 and 4 ranks.

Every rank builds the reference from the same seed, keeps its own experts and its own
tokens (a contiguous slice of the batch), and the loss is the mean over *all* tokens, so
each rank's part is ``sum over my tokens / all tokens``.

Tolerances (see distlab.grade.checks): outputs are computed by the same expert on the same token
vector, in a batch of other rows, so they agree to float32 rounding of the matmul (measured:
bitwise on this CPU); we allow ``checks.VALUE_*`` (1e-6 of the largest value). Gradients: an
expert's gradient sums its tokens' contributions in another order, and the router's adds
the ranks' partial sums: ``checks.GRAD_*`` (1e-5 of the largest gradient; measured ~1e-8).

Checked to fail when broken (each a one-line change): the backward all-to-all with the
forward's counts instead of reversed ones (gradients go to the wrong tokens: wrong expert
gradients, or a size error), the router's gradients not summed over the ranks, the sort not
undone after the combine (outputs land on the wrong tokens), the gate not applied (router
gradient zero).
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.grade import checks
from distlab.tensor_parallel import experts

SIZES = {"dim": 8, "hidden": 16, "experts": 4}
TOKENS = 24


def tokens():
    return torch.randn(TOKENS, SIZES["dim"], generator=torch.Generator().manual_seed(5))


def loss_of(out, total_tokens):
    return (out ** 2).sum() / total_tokens


def _on_rank():
    import torch.distributed as dist

    from distlab.tools import comm

    n, rank = dist.get_world_size(), dist.get_rank()
    layer = experts.parallelize_moe(experts.build(seed=3, **SIZES))
    x = tokens().chunk(n)[rank].clone().requires_grad_(True)   # as if from the layer before
    with comm.record() as forward:
        out = layer(x)
    with comm.record() as backward:
        loss_of(out, TOKENS).backward()
    experts.all_reduce_router_gradients(layer)
    names = experts.reference_names(layer)
    try:
        experts.ExpertParallelMoE(experts=n + 1)
        refused = None
    except ValueError as error:
        refused = str(error)
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {names[k]: p.grad for k, p in layer.named_parameters()},
            "forward": [c.op for c in forward], "backward": [c.op for c in backward],
            "sent": sum(c.sent for c in forward), "refused": refused}


@pytest.fixture(scope="module")
def results():
    return {n: distlab.run(_on_rank, nprocs=n, timeout=90) for n in (2, 4)}


@pytest.fixture(scope="module")
def reference():
    moe = experts.build(seed=3, **SIZES)
    x = tokens().requires_grad_(True)
    out = moe(x)
    loss_of(out, TOKENS).backward()
    return out.detach(), x.grad, {k: p.grad for k, p in moe.named_parameters()}


def test_every_expert_is_used_by_the_test_tokens(reference):
    moe = experts.build(seed=3, **SIZES)
    chosen, _ = experts.route(moe.router, tokens())
    assert set(chosen.tolist()) == set(range(SIZES["experts"])), "the test would not exercise every expert"


@pytest.mark.parametrize("n", (2, 4))
def test_outputs_and_gradients_match_the_single_process_layer(results, reference, n):
    expected_out, expected_x_grad, expected_grads = reference
    for rank, got in enumerate(results[n]):
        checks.assert_tensor_close(got["out"], expected_out.chunk(n)[rank], name=f"output on rank {rank}")
        checks.assert_tensor_close(got["x_grad"], expected_x_grad.chunk(n)[rank], name=f"input gradient on rank {rank}",
                                   rtol=checks.GRAD_RTOL, atol_scale=checks.GRAD_ATOL_SCALE)
        mine = {k: v for k, v in expected_grads.items() if k in got["grads"]}
        assert len(mine) == 2 + 4 * SIZES["experts"] // n       # router (2) + my experts (4 tensors each)
        checks.assert_gradients_match([got["grads"]], mine)


@pytest.mark.parametrize("n", (2, 4))
def test_tokens_travel_by_all_to_all_only(results, n):
    for got in results[n]:
        assert got["forward"] == ["all_to_all_single"] * 4      # counts, tokens, expert ids, results
        assert got["backward"] == ["all_to_all_single"] * 2     # the two differentiable exchanges, reversed
        # what a rank sends is at most its own tokens, twice (out and back), plus the counts and ids
        assert 0 < got["sent"] <= 2 * (TOKENS // n) * SIZES["dim"] * 4 + (TOKENS // n) * 8 + n * 8


@pytest.mark.parametrize("n", (2, 4))
def test_experts_that_do_not_divide_are_refused(results, n):
    for got in results[n]:
        assert got["refused"] and f"{n + 1} experts do not split evenly over {n} ranks" in got["refused"]
