"""distlab.tensor_parallel.dtensor: TinyGPT under torch's DTensor plans, against one process and against ours.

Tolerances: DTensor sums the same partial products as one process, in another order:
gradients within ``checks.GRAD_*`` (1e-5 of the largest; measured ~1e-8 at 2 and 4 ranks),
the loss within ``checks.VALUE_*``. The fused-qkv case shows why the attention is split: a
plain ``ColwiseParallel`` on ``qkv`` gives each rank the wrong heads, and the loss is off by
far more than rounding.

Checked to fail when broken: a plan without ``SequenceParallel`` on the LayerNorms under
sequence parallelism (their gradients are then partial: off by ~N), q/k/v stacked back in the
wrong order by ``reference_gradients``, the attention reshaped with the full head count.
"""

from __future__ import annotations

import pytest

import distlab
from distlab import models
from distlab.grade import checks


def _on_rank():
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from distlab.tensor_parallel import dtensor

    warnings.filterwarnings("ignore", message="Full backward hook")
    batch = models.example_batch("gpt", batch_size=4, seed=1)
    out = {}
    for sp in (False, True):
        model = dtensor.parallelize(models.build("gpt", seed=0), sequence_parallel=sp)
        loss = dtensor.loss(model, batch)
        dtensor.backward(loss)
        out[sp] = {"loss": loss.full_tensor().detach(), "grads": dtensor.reference_gradients(model)}
    # the pitfall: ColwiseParallel on the fused qkv layer cuts q|k|v into contiguous blocks
    def chunked_forward(attn, x):                            # TinyGPT's attention, any number of heads
        batch, seq, dim = x.shape
        q, k, v = (t.view(batch, seq, -1, dim // attn.heads).transpose(1, 2) for t in attn.qkv(x).chunk(3, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn.proj(y.transpose(1, 2).reshape(batch, seq, -1))

    fused = models.build("gpt", seed=0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in fused.blocks:
        block.attn.forward = chunked_forward.__get__(block.attn)
    styles = {f"blocks.{i}.attn.{n}": s for i in range(len(fused.blocks))
              for n, s in (("qkv", ColwiseParallel()), ("proj", RowwiseParallel()))}
    parallelize_module(fused, mesh, styles)
    with torch.no_grad():
        out["fused_loss"] = models.loss_fn(fused, batch)
    return out


@pytest.fixture(scope="module")
def results():
    return {n: distlab.run(_on_rank, nprocs=n, timeout=120) for n in (2, 4)}


@pytest.fixture(scope="module")
def reference():
    model = models.build("gpt", seed=0)
    batch = models.example_batch("gpt", batch_size=4, seed=1)
    loss = models.loss_fn(model, batch)
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in model.named_parameters()}


@pytest.mark.parametrize("n", (2, 4))
@pytest.mark.parametrize("sequence_parallel", (False, True))
def test_dtensor_plans_give_the_single_process_loss_and_gradients(results, reference, n, sequence_parallel):
    ref_loss, ref_grads = reference
    for rank, got in enumerate(results[n]):
        seen = got[sequence_parallel]
        checks.assert_tensor_close(seen["loss"], ref_loss, name=f"loss on rank {rank}")
        assert set(seen["grads"]) == set(ref_grads)
        checks.assert_gradients_match([seen["grads"]], ref_grads)


@pytest.mark.parametrize("n", (2, 4))
def test_colwise_on_a_fused_qkv_layer_computes_something_else(results, reference, n):
    ref_loss, _ = reference
    for got in results[n]:
        assert abs(got["fused_loss"].item() - ref_loss.item()) > 1e-3, "the fused-qkv pitfall did not show"
