"""distlab.zero.fsdp2 against torch's own ``fully_shard``, one process, and the formulas.

The same "code written for torch" (:func:`written_for_torch`: wrap, train, gather the full
state dict) runs twice on the ranks, once with ``from torch.distributed.fsdp import ...`` and
once with ``from distlab.zero.fsdp2 import ...``: only the import differs. 3 AdamW steps
(lr 1e-2) on 8-sample batches split over 2 or 4 ranks. Tolerances, with what was measured:

* Against torch: **bitwise** (``torch.equal``), shapes, gradients, weights and the full state
  dict alike, on 2 and on 4 ranks, fp32 and bf16. Not luck: both cut each parameter by rows
  and lay a group's buffers out the same way (each rank's padded rows of each parameter, in
  the order of ``module.parameters()``), so gloo adds the same numbers at the same positions
  and rounds the same (on 4 ranks its order of addition depends on the position: the flat
  form, laid out differently, is only within rounding of torch there, tests/chapters/test_zero.py).
  Measured: equal in every case. A parameter in another order, another padding or a sum
  instead of a mean is off by far more than one bit.
* Against one process (fp32): gradients within ``checks.GRAD_*`` (1e-5 of the largest
  gradient; measured like the flat form, 1e-8 absolute), weights within tests/chapters/test_zero.py's
  AdamW tolerance (its docstring says why).
* bf16 compute with fp32 reduction: gradients within 5% of each parameter's largest
  gradient (bf16 keeps 8 significant bits; tests/chapters/test_zero.py measured 2.3% at most), and
  more than 1e-4 off somewhere, or the compute was not bf16.
* Bytes sent and held are counted, not measured: exactly the formula (with FSDP2's padding of
  each parameter's rows to a multiple of N) and exactly torch's.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from test_zero import CONFIGS, assert_weights_match, batch, reference

import distlab
from distlab import models
from distlab.grade import checks
from distlab.zero import theory

STEPS = 3
LR = 1e-2


def written_for_torch(fully_shard, MixedPrecisionPolicy, kind, bf16=False, reshard_after_forward=None):  # noqa: N803
    """Torch's recipe, written against the names it is given: each layer, then the root; AdamW; 3 steps."""
    from distlab.tools import comm, memory
    from distlab.zero.flat import default_units

    rank, world = dist.get_rank(), dist.get_world_size()
    model = models.build(kind, seed=0, **CONFIGS[kind])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    layers = list(model.blocks) if kind == "gpt" else default_units(model)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    out = {"shards": [(name, type(p).__name__, str(p.placements), tuple(p.shape), tuple(p.to_local().shape))
                      for name, p in model.named_parameters()]}
    for step in range(STEPS):
        optimizer.zero_grad()
        with comm.record() as log:
            models.loss_fn(model, models.shard(batch(kind, step), rank, world)).backward()
        if step == 0:   # on the module's own parameters: each one's averaged shard, as a DTensor
            out["grad_shapes"] = [(type(p.grad).__name__, tuple(p.grad.to_local().shape))
                                  for p in model.parameters()]
            out["grads"] = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        optimizer.step()
    out["calls"] = [(c.op, c.dtype, c.sent, c.async_op) for c in log]
    out["held"] = memory.model_state_bytes(model, optimizer)
    out["full"] = {name: t.full_tensor() for name, t in model.state_dict().items()}
    return out


def ours_and_torchs(kind, bf16=False, reshard_after_forward=None):
    """The same code twice: only the import differs."""
    import warnings

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")   # torch's: the model's output is a view
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torchs = written_for_torch(fully_shard, MixedPrecisionPolicy, kind, bf16, reshard_after_forward)

    from distlab.zero.fsdp2 import MixedPrecisionPolicy, fully_shard
    return written_for_torch(fully_shard, MixedPrecisionPolicy, kind, bf16, reshard_after_forward), torchs


CASES = {(kind, n, bf16, reshard): None for kind in ("gpt", "mlp") for n in (2, 4) for bf16 in (False,)
         for reshard in (None,)}
CASES.update({("gpt", 2, True, None): None, ("gpt", 4, True, None): None,
              ("gpt", 2, False, True): None, ("gpt", 4, False, False): None})


@pytest.fixture(scope="module")
def runs():
    with distlab.Pool(2), distlab.Pool(4):
        yield {(kind, n, bf16, reshard): distlab.run(ours_and_torchs, kind, bf16, reshard, nprocs=n, timeout=300)
               for kind, n, bf16, reshard in CASES}


# -- the same as torch's -------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_the_same_code_gives_torchs_shards_gradients_weights_and_bytes_bit_for_bit(runs, case):
    for rank, (ours, torchs) in enumerate(runs[case]):
        assert ours["shards"] == torchs["shards"], rank
        assert ours["grad_shapes"] == torchs["grad_shapes"], rank
        for what in ("grads", "full"):
            assert ours[what].keys() == torchs[what].keys()
            for name, t in torchs[what].items():
                assert ours[what][name].dtype == t.dtype and torch.equal(ours[what][name], t), (rank, what, name)
        assert ours["held"] == torchs["held"], (rank, ours["held"], torchs["held"])
        # the same collectives, each the same size (the end of backward may order two reductions otherwise)
        assert sorted(c[:3] for c in ours["calls"]) == sorted(c[:3] for c in torchs["calls"]), rank


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_parameters_are_the_ranks_row_shards_and_their_gradients_too(runs, kind, n):
    model = models.build(kind, **CONFIGS[kind])
    for rank, (ours, _) in enumerate(runs[(kind, n, False, None)]):
        expected = [(name, "DTensor", "(Shard(dim=0),)", tuple(p.shape), (len(p.chunk(n)[rank]) if rank < len(
            p.chunk(n)) else 0, *p.shape[1:])) for name, p in model.named_parameters()]
        assert ours["shards"] == expected
        assert ours["grad_shapes"] == [("DTensor", local) for *_, local in expected]


# -- the same as one process -------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_gradients_and_adamw_weights_match_one_process(runs, kind, n):
    ref_grads, ref_weights = reference(kind, "adamw")
    per_rank = runs[(kind, n, False, None)]
    checks.assert_gradients_match([ours["grads"] for ours, _ in per_rank], ref_grads)
    for rank, (ours, _) in enumerate(per_rank):
        assert_weights_match(ours["full"], ref_weights, "adamw", f"fsdp2, rank {rank}")


@pytest.mark.parametrize("n", [2, 4])
def test_bf16_params_with_fp32_reduction(runs, n):
    ref_grads, _ = reference("gpt", "sgd", steps=1)
    for ours, _ in runs[("gpt", n, True, None)]:
        worst = 0.0
        for name, ref in ref_grads.items():
            assert ours["grads"][name].dtype == torch.float32          # the shards and their gradients stay fp32
            checks.assert_tensor_close(ours["grads"][name], ref, name=f"the bf16 gradient of {name}", rtol=0.0,
                                       atol=0.05 * ref.abs().max().item())
            worst = max(worst, ((ours["grads"][name] - ref).abs().max() / ref.abs().max()).item())
        assert worst > 1e-4, "the gradients are fp32-exact: forward and backward did not run in bf16"
        assert {dtype for op, dtype, *_ in ours["calls"] if op == "all_gather_single"} == {"bfloat16"}
        assert {dtype for op, dtype, *_ in ours["calls"] if op == "reduce_scatter_single"} == {"float32"}


# -- bytes -----------------------------------------------------------------------------------

def padded_numel(module, n, skip=()) -> int:
    """Elements of a group's buffers: each parameter's rows padded to a multiple of ``n``."""
    return sum(n * math.ceil(p.shape[0] / n) * p[0].numel() for p in module.parameters()
               if all(p is not q for q in skip))


@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_bytes_sent_per_step_equal_the_formula(runs, case):
    kind, n, bf16, reshard = case
    model = models.build(kind, **CONFIGS[kind])
    layers = list(model.blocks) if kind == "gpt" else list(model.children())
    groups = [padded_numel(layer, n) for layer in layers]
    root = padded_numel(model, n, skip=[p for layer in layers for p in layer.parameters()])
    gathers_per_layer = 1 if reshard is False else 2          # None: the layers reshard, the root does not
    gathers_of_root = 2 if reshard else 1
    element = 2 if bf16 else 4
    all_gather = sum(gathers_per_layer * theory.collective_bytes("all_gather", g, n, element) for g in groups)
    all_gather += gathers_of_root * theory.collective_bytes("all_gather", root, n, element) if root else 0
    reduce_scatter = sum(theory.collective_bytes("reduce_scatter", g, n, 4) for g in groups + [root] if g)
    for ours, _ in runs[case]:
        sent = {op: sum(c[2] for c in ours["calls"] if c[0] == op) for op in ("all_gather_single",
                                                                              "reduce_scatter_single")}
        assert sent == {"all_gather_single": all_gather, "reduce_scatter_single": reduce_scatter}, (sent, case)
        assert {c[0] for c in ours["calls"]} == {"all_gather_single", "reduce_scatter_single"}


def test_backward_prefetches_the_next_groups_all_gather(runs):
    """In backward every block's all-gather is started early, asynchronously, by the group after it."""
    model = models.build("gpt")
    for ours, _ in runs[("gpt", 2, False, None)]:
        started_early = [c for c in ours["calls"] if c[0] == "all_gather_single" and c[3]]
        assert len(started_early) == len(model.blocks)


# -- code written for torch, run with the import changed -------------------------------------------

TORCH_CODE = '''
def train(model, batches, steps=3):
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    assert isinstance(model, FSDPModule) and isinstance(model.blocks[0], FSDPModule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    norms = []
    for inputs, targets in batches[:steps]:
        optimizer.zero_grad()
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5).full_tensor())
        optimizer.step()
    model.unshard()                     # the full parameters, for an evaluation without resharding
    with torch.no_grad():
        evaluation = model(batches[-1][0])
    model.reshard()
    return norms, evaluation, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
'''
OURS = TORCH_CODE.replace("from torch.distributed.fsdp import", "from distlab.zero.fsdp2 import")


def run_source(source):
    import warnings

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    rank, world = dist.get_rank(), dist.get_world_size()
    namespace = {}
    exec(compile(source, "<code written for torch>", "exec"), namespace)
    batches = [models.shard(batch("gpt", step), rank, world) for step in range(4)]
    return namespace["train"](models.build("gpt", seed=0), batches)


@pytest.mark.parametrize("n", [2, 4])
def test_code_written_for_torch_runs_on_ours_with_its_import_changed_and_gives_the_same_bits(n):
    changed = [(a, b) for a, b in zip(TORCH_CODE.splitlines(), OURS.splitlines()) if a != b]
    assert len(changed) == 1 and "import" in changed[0][1]
    with distlab.Pool(n):
        torchs = distlab.run(run_source, TORCH_CODE, nprocs=n, timeout=300)
        ours = distlab.run(run_source, OURS, nprocs=n, timeout=300)
    for (norms, evaluation, state), (torch_norms, torch_evaluation, torch_state) in zip(ours, torchs):
        assert torch.equal(torch.stack(norms), torch.stack(torch_norms)) and norms[0] > 0.5   # clipping did clip
        assert torch.equal(evaluation, torch_evaluation)
        assert state.keys() == torch_state.keys() == dict(models.build("gpt").named_parameters()).keys()
        assert all(type(t) is torch.Tensor and torch.equal(t, torch_state[k]) for k, t in state.items())


def with_forward_prefetch(prefetch: bool):
    from distlab.tools import comm
    from distlab.zero.fsdp2 import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    model = models.build("gpt", seed=0)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    if prefetch:                              # each block starts the next one's all-gather
        for block, after in zip(model.blocks, model.blocks[1:]):
            block.set_modules_to_forward_prefetch([after])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        optimizer.zero_grad()
        with comm.record() as log:
            loss = models.loss_fn(model, models.shard(batch("gpt", step), rank, world))
        loss.backward()
        optimizer.step()
    return [c.async_op for c in log if c.op == "all_gather_single"], \
        {name: p.full_tensor() for name, p in model.named_parameters()}


def test_forward_prefetch_starts_the_next_blocks_all_gather_and_changes_no_bit():
    with distlab.Pool(2):
        (plain, weights), _ = distlab.run(with_forward_prefetch, False, nprocs=2, timeout=300)
        (early, prefetched), _ = distlab.run(with_forward_prefetch, True, nprocs=2, timeout=300)
    blocks = len(models.build("gpt").blocks)
    assert plain == [False] * (blocks + 1)             # the root, then each block when it starts
    assert early == [False, False] + [True] * (blocks - 1)
    assert all(torch.equal(prefetched[k], w) for k, w in weights.items())
