"""distlab.zero against the single-process reference: gradients, parameters, bytes held, bytes sent.

Tolerances:

* Averaged gradients: ``checks.GRAD_*`` (1e-5 of the largest gradient). A reduce-scatter
  averages in another order than one process summing the full batch: float32 rounding,
  measured ~1e-8, so 1000x margin, and 1000x tighter than a sum instead of a mean.
* Parameters after 3 SGD steps: 1e-6 absolute. SGD moves a parameter by ``lr * grad``, so
  the rounding above becomes ~1e-9; forgetting the all-gather leaves 3/4 of the weights
  stale by ``lr * grad`` (~1e-3 here).
* Parameters after 3 AdamW steps: AdamW divides by ``sqrt(v)``: on a near-zero gradient a
  1e-8 rounding difference flips the direction of a step of size ``lr`` (measured: max
  1.1e-4 at lr 1e-2 on ~0.1% of the elements, the same for plain DDP). So the bound is
  ``checks.optimizer_tolerance("adamw", lr, steps) = steps * lr``, *and* at most 1% of the
  elements may differ by more than 1e-6: a stale or wrongly updated slice moves 25-75% of them.
* Bytes held and sent are counted, not measured: exact against the formulas (padding
  included); "about full / N" within 5%.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab import models
from distlab.grade import checks
from distlab.tools import comm_bytes, memory
from distlab.zero import flat as zero_flat
from distlab.zero import stages, theory

STEPS = 3
CONFIGS = {
    # TinyGPT, default size (6 units: two embeddings, two blocks, the final norm, the head)
    "gpt": {},
    # every unit's size odd or not a multiple of 4: the flat buffers need padding on 2 and 4 ranks
    "mlp": {"inputs": 4, "hidden": 9, "outputs": 3},
}
LR = {"sgd": 0.1, "adamw": 1e-2}
OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def batch(kind, step):
    return models.example_batch(kind, batch_size=8, seed=step, **CONFIGS[kind])


def reference(kind, optimizer):
    """One process, full batches: gradients at the first step, parameters after STEPS steps, bytes held."""
    model = models.build(kind, seed=0, **CONFIGS[kind])
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=LR[optimizer])
    first_grads = None
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        models.loss_fn(model, batch(kind, step)).backward()
        if first_grads is None:
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        opt.step()
    return first_grads, {name: p.detach().clone() for name, p in model.named_parameters()}, \
        memory.model_state_bytes(model, opt)


def train_every_stage(kind, optimizer):
    """On each rank, for stages 0..3: STEPS steps from *this rank's own* random weights."""
    from distlab.tools import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for stage in range(4):
        model = models.build(kind, seed=rank, **CONFIGS[kind])   # only the broadcast makes them agree
        sharded = stages.make(stage, model, OPTIMIZERS[optimizer], lr=LR[optimizer])
        for step in range(STEPS):
            shard = models.shard(batch(kind, step), rank, world)
            sharded.zero_grad()
            with comm.record() as log:
                models.loss_fn(model, shard).backward()
                if step == 0:
                    sharded.reduce_gradients()
            if step == 0:
                grads = sharded.averaged_gradients()             # its own all-gathers: not logged
            with comm.record() as update:
                sharded.step()
        out[stage] = {
            "grads": grads,
            "params": sharded.full_parameters(),
            "bytes": sharded.state_bytes(),                      # after the last step
            "comm": [{"op": c.op, "sent": c.sent} for c in log + update],  # the last step's calls
            "peak_gathered": getattr(sharded, "peak_gathered_bytes", None),
        }
    return out


@pytest.fixture(scope="module")
def pools():
    with distlab.Pool(2), distlab.Pool(4):
        yield


@pytest.fixture(scope="module")
def runs(pools):
    """{(kind, optimizer, n): per-rank results}, computed once for all the tests below."""
    return {(kind, opt, n): distlab.run(train_every_stage, kind, opt, nprocs=n, timeout=120)
            for kind in CONFIGS for opt in OPTIMIZERS for n in (2, 4)}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_gradients_and_parameters_match_the_single_process_reference(runs, kind, optimizer, n):
    ref_grads, ref_params, _ = reference(kind, optimizer)
    for stage in range(4):
        per_rank = [result[stage] for result in runs[(kind, optimizer, n)]]
        checks.assert_gradients_match([r["grads"] for r in per_rank], ref_grads)
        for rank, r in enumerate(per_rank):
            if optimizer == "sgd":
                checks.assert_params_match([r["params"]], ref_params, atol=1e-6)
                continue
            tolerance = checks.optimizer_tolerance("adamw", LR["adamw"], STEPS)
            checks.assert_params_match([r["params"]], ref_params, atol=tolerance)
            diff = torch.cat([(r["params"][k] - v).abs().reshape(-1) for k, v in ref_params.items()])
            off = (diff > 1e-6).float().mean().item()
            assert off < 0.01, f"stage {stage}, rank {rank}: {off:.1%} of the parameters differ by more than 1e-6"


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_bytes_held_per_rank_are_full_over_n_for_what_each_stage_shards(runs, kind, n):
    _, _, full = reference(kind, "adamw")
    model = models.build(kind, **CONFIGS[kind])
    numel = memory.count_parameters(model)
    padded = zero_flat.padded_numel(model, n)
    for stage in range(4):
        sharded_kinds = theory.SHARDED[stage]
        for rank, result in enumerate(runs[(kind, "adamw", n)]):
            held = result[stage]["bytes"]
            for what in theory.KINDS if kind == "gpt" else ():   # the 75-parameter MLP is all padding
                expected = full[what] / n if what in sharded_kinds else full[what]
                assert abs(held[what] - expected) <= 0.05 * expected, (stage, rank, what, held[what], expected)
            # exactly the formula: 4 + 4 + 8 bytes per element, / n where sharded, with the padding
            # of the flat buffers (stages 1-3) and Adam's 4-byte step counter per optimized tensor
            flat = padded if stage else numel
            exact = {"parameters": 4 * (flat / n if stage == 3 else flat),
                     "gradients": 4 * (padded / n if stage >= 2 else numel),
                     "optimizer": 8 * flat / (n if stage else 1)
                     + 4 * (len(zero_flat.default_units(model)) if stage else len(list(model.parameters())))}
            assert {what: held[what] for what in exact} == exact, (stage, rank)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_bytes_sent_zero12_like_ddp_zero3_one_and_a_half_no_all_reduce(runs, kind, n):
    model = models.build(kind, **CONFIGS[kind])
    units = len(zero_flat.default_units(model))
    padded = zero_flat.padded_numel(model, n)
    sent = {}
    for stage in range(4):
        for rank, result in enumerate(runs[(kind, "sgd", n)]):
            calls = result[stage]["comm"]
            counts = {op: sum(c["op"] == op for c in calls) for op in {c["op"] for c in calls}}
            if stage == 0:
                assert counts == {"all_reduce": 1}
                continue
            gathers = units * (2 if stage == 3 else 1)
            assert counts == {"reduce_scatter_single": units, "all_gather_single": gathers}, (stage, counts)
            total = sum(c["sent"] for c in calls)
            assert total == theory.comm_bytes_per_step(stage, padded, n), (stage, rank, total)
            sent[stage] = total
    if kind != "gpt":   # the 75-parameter MLP: padding is a large part of it, the exact check above suffices
        return
    ddp = comm_bytes.all_reduce_bytes(4 * memory.count_parameters(model), n)
    for stage in (1, 2):
        assert abs(sent[stage] / ddp - 1) < 0.05, (stage, sent[stage], ddp)   # padding only
    assert abs(sent[3] / ddp - 1.5) < 0.05 * 1.5, (sent[3], ddp)


def test_zero3_holds_at_most_two_units_of_full_weights(runs):
    model = models.build("gpt")
    for n in (2, 4):
        largest = max(zero_flat.padded_numel(unit, n, units=[unit]) for unit in zero_flat.default_units(model)) * 4
        for result in runs[("gpt", "adamw", n)]:
            peak = result[3]["peak_gathered"]
            assert largest <= peak <= 2 * largest, (n, peak, largest)


def test_flat_unit_pads_and_slices():
    layer = torch.nn.Linear(4, 9)       # 45 elements
    unit = zero_flat.FlatUnit(layer, rank=3, world=4)
    assert (unit.numel, unit.shard_numel, unit.padded, unit.mine()) == (45, 12, 48, slice(36, 48))
    flat = unit.flatten([p.detach() for p in unit.params])
    assert flat.shape == (48,) and flat[45:].eq(0).all()
    assert torch.equal(unit.unflatten(flat)[0], layer.weight)
