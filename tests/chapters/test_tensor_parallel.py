"""distlab.tensor_parallel against the single-process reference, on 2 and 4 ranks.

Every rank builds the reference model from the same seed, slices it into its tensor-parallel
twin, and runs the same full batch (tensor parallelism does not split the data). Each check
then compares a rank's *shard* with the matching slice of the single-process result.

Tolerances (float32; see distlab.grade.checks):

* Forward values (logits, losses, MLP outputs): ``checks.assert_tensor_close`` with rtol
  1e-5 and atol 1e-5 * max|reference|. A row-parallel layer adds ``N`` partial sums that
  one process adds in a single matmul: the same terms in another order, so float32 rounding
  only (measured on 4 ranks: 2.7e-7 of max|logits| after 2 blocks and 3 LayerNorms, the
  loss bitwise equal): a 40x margin. A wrong slice or a missing rank's part is off by the
  size of the values.
* Gradients: ``checks.assert_gradients_match`` (1e-5 of each parameter's largest gradient):
  the same reordering backward, measured at most 7e-7 of the largest (4 ranks): a 14x
  margin. Forgetting a backward all-reduce leaves the input, embedding and LayerNorm
  gradients off by tens of percent.
* Communication is counted (distlab.tools.comm), so exact.

One ``distlab.Pool`` per world size, and one call per pool that runs every check on the
ranks and returns the results (a warm call costs ~2 s, a cold launch ~5 s; the file ~45 s
on 2 busy cores).

Checked to fail when the implementation is broken (each a one-line change): no backward
all-reduce in copy_to_parallel_region, no forward all-reduce in reduce_from_parallel_region,
qkv sliced as one contiguous block instead of per q/k/v, the row-parallel bias added before
the sum, sequence-parallel gradients not summed, no MAX all-reduce in the cross-entropy, a
plain split instead of a reduce-scatter behind the sequence all-gather.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from grading_support import value_errors

import distlab
from distlab import models
from distlab.grade import checks
from distlab.tools import memory

WORLD_SIZES = (2, 4)
BATCH = 4                                                   # sequences of TinyGPT's context (32)
MLP = {"inputs": 8, "hidden": 32, "outputs": 8}             # in == out: SP bytes equal per direction
MLP_SHAPE = (2, 8, MLP["inputs"])                           # (batch, seq, features)
VOCAB_ROWS = 24                                             # tokens in the cross-entropy check
TOL = {"rtol": 1e-5, "atol_scale": 1e-5}


def gpt_batch():
    return models.example_batch("gpt", batch_size=BATCH, seed=1)


def mlp_input():
    return torch.randn(*MLP_SHAPE, generator=torch.Generator().manual_seed(2))


def mlp_loss(out):
    return (out ** 2).mean()


# -- what runs on every rank -------------------------------------------------------------------------

def _ops(log):
    return [{"op": c.op, "sent": c.sent} for c in log]


def _gpt(sequence_parallel: bool, shards_only: bool = False):
    """TinyGPT's tensor-parallel twin: logits, loss, gradient shards, comm, largest tensor made."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from distlab.tensor_parallel import layers as tp_layers
    from distlab.tensor_parallel import model as tp_model
    from distlab.tools import comm

    class Largest(TorchDispatchMode):
        """The largest number of elements of any tensor an op produced (a memory probe)."""
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    reference = models.build("gpt", seed=0)
    model = tp_model.parallelize_gpt(reference, sequence_parallel=sequence_parallel)
    if shards_only:
        tp_model.save_only_sequence_shards(model)
    inputs, targets = gpt_batch()
    with Largest(), comm.record() as forward, memory.saved_activation_bytes() as saved:
        logits = model(inputs)
        loss = tp_layers.vocab_parallel_cross_entropy(logits, targets).mean()
    with Largest(), comm.record() as backward:
        loss.backward()
    with comm.record() as sync:
        tp_model.all_reduce_sequence_parallel_gradients(model)
    reference_grads = models.reference_gradients(reference, (inputs, targets))
    return {
        "logits": logits.detach(), "loss": loss.detach(),
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "expected_grads": tp_layers.shard_like(model, reference_grads),
        "forward": _ops(forward), "backward": _ops(backward), "sync": _ops(sync),
        "largest": Largest.numel, "saved": saved.bytes,
        "params": {n: p.detach() for n, p in model.named_parameters()},
    }


def _mlp(sequence_parallel: bool):
    """Megatron MLP from a TinyMLP: output, input gradient, weight gradient shards, comm per direction."""
    import torch.distributed as dist

    from distlab.tensor_parallel import layers as tp_layers
    from distlab.tensor_parallel import model as tp_model
    from distlab.tensor_parallel import regions
    from distlab.tools import comm

    reference = models.build("mlp", seed=0, **MLP)
    model = tp_model.parallelize_mlp(reference, sequence_parallel=sequence_parallel)
    x = mlp_input()
    if sequence_parallel:                                   # each rank holds its part of the sequence
        x = x.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()
    x.requires_grad_(True)
    with comm.record() as forward:
        out = model(x)
    loss = mlp_loss(out)
    if sequence_parallel:                                   # the mean of the full output, from shards
        loss = regions.reduce_from_parallel_region(loss) / dist.get_world_size()
    with comm.record() as backward:
        loss.backward()
    tp_model.all_reduce_sequence_parallel_gradients(model)
    mlp_loss(reference(mlp_input())).backward()            # the single-process gradients, sliced
    expected = tp_layers.shard_like(model, {n: p.grad for n, p in reference.named_parameters()})
    return {"out": out.detach(), "x_grad": x.grad, "expected_grads": expected,
            "grads": {n: p.grad for n, p in model.named_parameters()},
            "forward": _ops(forward), "backward": _ops(backward)}


def _dtensor_mlp():
    """The same MLP under torch's DTensor plans: each rank's local gradient shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(models.build("mlp", seed=0, **MLP), mesh,
                               {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    out = model(mlp_input())
    mlp_loss(out).backward()
    return {n: p.grad.to_local() for n, p in model.named_parameters()}


def _cross_entropy():
    """Vocab-parallel cross-entropy on random logits vs F.cross_entropy on the full ones."""
    import torch.distributed as dist

    from distlab.tensor_parallel import layers as tp_layers

    n, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    full = 4 * torch.randn(VOCAB_ROWS, 256, generator=g)
    targets = torch.randint(0, 256, (VOCAB_ROWS,), generator=g)
    local = full.chunk(n, dim=-1)[rank].clone().requires_grad_(True)
    per_token = tp_layers.vocab_parallel_cross_entropy(local, targets)
    per_token.mean().backward()
    return {"loss": per_token.detach(), "grad": local.grad}


def _uneven():
    """The ValueError messages for sizes that do not divide by the world size."""
    import torch.distributed as dist

    from distlab.tensor_parallel import layers as tp_layers
    from distlab.tensor_parallel import model as tp_model

    n = dist.get_world_size()
    attempts = {
        "column": lambda: tp_layers.ColumnParallelLinear(4, 4 * n + 1),
        "row": lambda: tp_layers.RowParallelLinear(4 * n + 1, 4),
        "heads": lambda: tp_model.ParallelAttention(models.GPTConfig(heads=n + 1, dim=8 * (n + 1))),
        "vocab": lambda: tp_layers.VocabParallelEmbedding(4 * n + 1, 8),
        "sequence": lambda: tp_model.parallelize_gpt(models.build("gpt", seed=0), sequence_parallel=True)(
            torch.zeros(1, 4 * n + 1, dtype=torch.long)),
    }
    return value_errors(attempts)


def everything():
    return {"gpt": _gpt(False), "gpt_sp": _gpt(True), "gpt_sp_shards": _gpt(True, shards_only=True), "mlp": _mlp(False), "mlp_sp": _mlp(True),
            "dtensor": _dtensor_mlp(), "ce": _cross_entropy(), "uneven": _uneven()}


# -- the tests ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results():
    """{world size: per-rank results of everything()}, one call per warm pool."""
    with distlab.Pool(2), distlab.Pool(4):
        yield {n: distlab.run(everything, nprocs=n, timeout=120) for n in WORLD_SIZES}


def reference_gpt():
    model = models.build("gpt", seed=0)
    inputs, targets = gpt_batch()
    logits = model(inputs)
    return logits.detach(), F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).detach()


def vocab_slice(t, rank, n):
    return t.chunk(n, dim=-1)[rank]


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("variant", ["gpt", "gpt_sp", "gpt_sp_shards"])
def test_gpt_logits_loss_and_gradient_shards_match_the_single_process_model(results, variant, n):
    ref_logits, ref_loss = reference_gpt()
    per_rank = [r[variant] for r in results[n]]
    for rank, r in enumerate(per_rank):
        # each rank holds only its vocabulary slice of the logits, which equals the reference's
        assert r["logits"].shape == (*ref_logits.shape[:-1], ref_logits.shape[-1] // n)
        checks.assert_tensor_close(r["logits"], vocab_slice(ref_logits, rank, n), f"logits on rank {rank}", **TOL)
        checks.assert_tensor_close(r["loss"], ref_loss, f"loss on rank {rank}", **TOL)
    for r in per_rank:
        checks.assert_gradients_match([r["grads"]], r["expected_grads"])


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_shards_are_the_slices_megatron_takes(results, n):
    """Each rank's weights against hand-written index arithmetic, so a slicing bug cannot cancel out.

    shard_like cuts both the weights a rank loads and the reference gradients it is compared
    with; checking the weights here checks the gradient slices too.
    """
    ref = {name: p.detach() for name, p in models.build("gpt", seed=0).named_parameters()}
    dim, hidden, vocab = 64, 256, 256
    for rank, r in enumerate(results[n]):
        got = r["gpt"]["params"]
        mine = lambda size, rank=rank: slice(rank * size // n, (rank + 1) * size // n)  # noqa: E731
        qkv = ref["blocks.0.attn.qkv.weight"]
        # my heads' rows of q, of k and of v: not one contiguous third of the fused matrix
        expected_qkv = torch.cat([qkv[part * dim:(part + 1) * dim][mine(dim)] for part in range(3)])
        assert torch.equal(got["blocks.0.attn.qkv.weight"], expected_qkv)
        assert torch.equal(got["blocks.0.attn.proj.weight"], ref["blocks.0.attn.proj.weight"][:, mine(dim)])
        assert torch.equal(got["blocks.1.fc1.weight"], ref["blocks.1.fc1.weight"][mine(hidden)])
        assert torch.equal(got["blocks.1.fc2.weight"], ref["blocks.1.fc2.weight"][:, mine(hidden)])
        assert torch.equal(got["blocks.1.fc2.bias"], ref["blocks.1.fc2.bias"])
        assert torch.equal(got["tok.weight"], ref["tok.weight"][mine(vocab)])
        assert torch.equal(got["head.weight"], ref["head.weight"][mine(vocab)])
        assert torch.equal(got["norm.weight"], ref["norm.weight"])
        assert got["blocks.0.attn.qkv.weight"].shape == (3 * dim // n, dim)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_gpt_communication_per_step(results, n):
    """Per block: 2 all-reduces forward and 2 backward; sequence parallel swaps each for an all-gather + reduce-scatter."""
    layers = models.GPTConfig().layers
    for r in results[n]:
        forward = [c["op"] for c in r["gpt"]["forward"]]
        # embedding + 2 per block, then the cross-entropy's 3 small ones (max, target logit, sum of exp)
        assert forward == ["all_reduce"] * (1 + 2 * layers + 3)
        # 2 per block + the output layer's input; the embedding's all-reduce has nothing to do backward
        assert [c["op"] for c in r["gpt"]["backward"]] == ["all_reduce"] * (2 * layers + 1)
        assert r["gpt"]["sync"] == []
        sp_forward = [c["op"] for c in r["gpt_sp"]["forward"]]
        assert sp_forward.count("all_reduce") == 3 and sp_forward.count("reduce_scatter") == 1 + 2 * layers
        assert sp_forward.count("all_gather") == 2 * layers + 1
        assert sorted(c["op"] for c in r["gpt_sp"]["backward"]) == sorted(
            ["all_gather"] * (1 + 2 * layers) + ["reduce_scatter"] * (2 * layers + 1))
        assert {c["op"] for c in r["gpt_sp"]["sync"]} == {"all_reduce"}   # LayerNorms, position embedding, biases
        # saving only the shards: the same forward, one more all-gather per column layer backward
        assert r["gpt_sp_shards"]["forward"] == r["gpt_sp"]["forward"]
        assert sorted(c["op"] for c in r["gpt_sp_shards"]["backward"]) == sorted(
            ["all_gather"] * 2 * (1 + 2 * layers) + ["reduce_scatter"] * (2 * layers + 1))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_sequence_parallelism_saves_activations_and_saving_only_shards_saves_more(results, n):
    model = models.build("gpt", seed=0)
    with memory.saved_activation_bytes() as one_process:
        models.loss_fn(model, gpt_batch())
    for r in results[n]:
        plain, sp, shards = (r[v]["saved"] for v in ("gpt", "gpt_sp", "gpt_sp_shards"))
        assert shards < sp < plain < one_process.bytes
        # left replicated with shards only: token ids, the cross-entropy's per-token sums, LayerNorm
        # statistics; with the gathered inputs kept (gpt_sp) three (batch, seq, dim) tensors per block
        ideal = one_process.bytes / n          # measured: shards 1.11 x, gathered inputs kept 1.24-1.50 x, plain TP 1.37-1.91 x
        assert shards < 1.15 * ideal < 1.2 * ideal < sp, (shards, sp, plain, ideal)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_no_rank_materialises_the_full_logits(results, n):
    full_logits = BATCH * models.GPTConfig().context * models.GPTConfig().vocab_size
    for rank, r in enumerate(results[n]):
        for variant in ("gpt", "gpt_sp"):
            assert r[variant]["largest"] < full_logits, (
                f"rank {rank} ({variant}) made a tensor of {r[variant]['largest']} elements; "
                f"the full logits have {full_logits}")


def reference_mlp():
    """The single-process MLP on the test input: ``(output, input gradient)``."""
    x = mlp_input().requires_grad_(True)
    out = models.build("mlp", seed=0, **MLP)(x)
    mlp_loss(out).backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_megatron_mlp_matches_the_reference_with_one_all_reduce_each_way(results, n):
    out, x_grad = reference_mlp()
    for rank, r in enumerate(results[n]):
        mlp = r["mlp"]
        checks.assert_tensor_close(mlp["out"], out, f"MLP output on rank {rank}", **TOL)
        # the input gradient is what the backward all-reduce of copy_to_parallel_region makes whole
        checks.assert_tensor_close(mlp["x_grad"], x_grad, f"MLP input gradient on rank {rank}", **TOL)
        checks.assert_gradients_match([mlp["grads"]], mlp["expected_grads"])
        checks.assert_comm([mlp["forward"]], calls={"all_reduce": 1})
        checks.assert_comm([mlp["backward"]], calls={"all_reduce": 1})


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_sequence_parallel_mlp_same_gradients_same_bytes(results, n):
    out, x_grad = reference_mlp()
    for rank, r in enumerate(results[n]):
        sp, plain = r["mlp_sp"], r["mlp"]
        mine = slice(rank * MLP_SHAPE[1] // n, (rank + 1) * MLP_SHAPE[1] // n)
        checks.assert_tensor_close(sp["out"], out[:, mine], f"SP MLP output on rank {rank}", **TOL)
        checks.assert_tensor_close(sp["x_grad"], x_grad[:, mine], f"SP MLP input gradient on rank {rank}", **TOL)
        checks.assert_gradients_match([sp["grads"]], sp["expected_grads"])
        for direction in ("forward", "backward"):
            assert sorted(c["op"] for c in sp[direction]) == ["all_gather", "reduce_scatter"]
            # a ring all-reduce is a reduce-scatter plus an all-gather: the same bytes on the wire
            assert sum(c["sent"] for c in sp[direction]) == sum(c["sent"] for c in plain[direction])


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_dtensor_colwise_rowwise_gives_our_gradient_shards(results, n):
    for r in results[n]:
        ours, theirs = r["mlp"]["grads"], r["dtensor"]
        assert set(theirs) == set(ours)
        checks.assert_gradients_match([theirs], ours, what="DTensor gradient")


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_vocab_parallel_cross_entropy_equals_f_cross_entropy(results, n):
    g = torch.Generator().manual_seed(3)
    full = (4 * torch.randn(VOCAB_ROWS, 256, generator=g)).requires_grad_(True)
    targets = torch.randint(0, 256, (VOCAB_ROWS,), generator=g)
    per_token = F.cross_entropy(full, targets, reduction="none")
    per_token.mean().backward()
    for rank, r in enumerate(results[n]):
        assert r["ce"]["grad"].shape == (VOCAB_ROWS, 256 // n)
        checks.assert_tensor_close(r["ce"]["loss"], per_token.detach(), f"loss per token on rank {rank}", **TOL)
        checks.assert_tensor_close(r["ce"]["grad"], vocab_slice(full.grad, rank, n), f"logit gradient on rank {rank}", **TOL)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_uneven_splits_are_refused_naming_the_sizes(results, n):
    messages = results[n][0]["uneven"]
    for what, size in {"column": 4 * n + 1, "row": 4 * n + 1, "heads": n + 1, "vocab": 4 * n + 1,
                       "sequence": 4 * n + 1}.items():
        assert messages[what] is not None, f"{what}: an uneven split was accepted"
        assert f"({size})" in messages[what] and f"over {n} " in messages[what], messages[what]
