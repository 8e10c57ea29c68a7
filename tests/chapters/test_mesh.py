"""distlab.parallel3d.mesh (the rank grid) and distlab.parallel3d (TP inside groups, pipelines across them,
DP around both), on 2 and 4 ranks.

Pure tests check the grid's arithmetic on every layout of up to 16 ranks. On the ranks, one
warm pool per world size answers two calls: the first builds the process groups of every
layout and runs a collective along each axis, and compares torch's DeviceMesh with the grid;
the second (which also checks that a warm rank can build new groups after a first call did)
trains TinyGPT for a few SGD steps on each layout with two of the three axes (dp x tp,
dp x pp, pp x tp, and each alone), our way, and dp x tp torch's way (DTensor TP + FSDP2).
TinyGPT's two layers allow at most two pipeline stages, hence no dp x pp x tp at 4 ranks.

Tolerances (float32; see distlab.grade.checks):

* Gradients after the first step: ``checks.assert_gradients_match`` (1e-5 of each
  parameter's largest gradient). A rank's TP slice adds the same terms as the single process
  in another order, and the dp average and the pipeline's micro-batches add up gradients
  that one process adds in one matmul: rounding only, measured at most 1.1e-6 of the
  largest gradient (4 ranks, both engines), a 9x margin. Averaging over the wrong group, summing instead of averaging, or
  giving the tp ranks of one copy different data is off by tens of percent.
* Loss curves (3 SGD steps at lr 0.1): rtol 1e-5 against the single process; measured
  differences at most 4.8e-7 on losses of ~5.7 (1e-7 relative), a 100x margin. An error in
  the gradient of the size of the bugs above changes the next loss by ~1e-3 or more.
* Bytes held and sent are counted (distlab.tools.memory, distlab.tools.comm), so they must equal
  distlab.parallel3d.predict.predict_run exactly.

Checked to fail on purpose (one-line changes, each caught): average_gradients with SUM
instead of AVG; average_gradients over the world instead of the dp group; my_batch
sharding by global rank instead of the dp coordinate; Grid.coords with dp as the fastest
digit; torch's engine sharding the batch by the tp coordinate; predict_run with 4L instead of 4L + 2 activation all-reduces;
the last pipeline stage's loss not added into the pp group (loss curve off); a
tensor-parallel last pipeline stage whose loss is the plain cross-entropy (the ranks fail); the pipeline
run with one micro-batch instead of two (message counts; the bytes are the same).

Run time: 35-45 s on 2 cores, 70 s when other test runs load them (load average 15): two
cold pools (~8 s), the first training step of each kind (~5 s, lazy initialisation), the
torch engine's DTensor steps (~3 s at 4 ranks).
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch

import distlab
from distlab import models
from distlab.grade import checks
from distlab.parallel3d import planner, predict, runs, torch_train, train
from distlab.parallel3d.mesh import AXES, Grid, grid_for

WORLD_SIZES = (2, 4)
STEPS, LR, BATCH, MICRO = 3, 0.1, 8, 2
MEGATRON = ("pp", "dp", "tp")


def layouts(world: int, order=AXES) -> list[Grid]:
    """Every (dp, pp, tp) with dp * pp * tp = world."""
    return [Grid(dp=dp, pp=pp, tp=world // (dp * pp), order=order)
            for dp in range(1, world + 1) for pp in range(1, world // dp + 1) if world % (dp * pp) == 0]


# -- the grid, pure ---------------------------------------------------------------------------------

def test_the_docstring_picture_of_eight_ranks():
    grid = Grid(dp=2, pp=2, tp=2)
    assert [tuple(grid.coords(r).values()) for r in range(8)] == list(itertools.product(range(2), repeat=3))
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert (grid.group(5, "tp"), grid.group(5, "pp"), grid.group(5, "dp")) == ([4, 5], [5, 7], [1, 5])
    assert "dp groups: [0,4] [1,5] [2,6] [3,7]" in grid.table()


def test_megatron_order_puts_pp_outermost():
    grid = Grid(dp=2, pp=2, tp=2, order=MEGATRON)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]    # tp still consecutive
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]    # dp next ...
    assert grid.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]    # ... pp farthest apart
    assert grid.coords(6) == {"dp": 1, "pp": 1, "tp": 0}


@pytest.mark.parametrize("order", [AXES, MEGATRON], ids=["dp-pp-tp", "pp-dp-tp"])
def test_groups_partition_the_ranks_on_every_layout_up_to_16(order):
    for world in range(1, 17):
        for grid in layouts(world, order):
            assert grid.world_size == world and [grid.rank(**grid.coords(r)) for r in range(world)] == list(range(world))
            assert grid.groups("tp")[0] == list(range(grid.tp)), grid          # tp: consecutive ranks
            for axis in AXES:
                groups = grid.groups(axis)
                assert sorted(r for g in groups for r in g) == list(range(world)), (grid, axis)
                assert all(len(g) == grid.size(axis) for g in groups)
                for members in groups:
                    coords = [grid.coords(r) for r in members]
                    assert [c[axis] for c in coords] == list(range(grid.size(axis)))      # ordered by coordinate
                    others = {tuple(v for a, v in c.items() if a != axis) for c in coords}
                    assert len(others) == 1, (grid, axis, members)                        # all else shared
                    assert all(grid.group(r, axis) == members for r in members)
                    steps = {b - a for a, b in zip(members, members[1:])}
                    assert steps <= {grid.stride(axis)}


def test_bad_sizes_raise_clear_errors():
    with pytest.raises(ValueError, match=r"2 \* 1 \* 4 = 8, but there are 6 ranks"):
        Grid(dp=2, tp=4).check(6)
    with pytest.raises(ValueError, match="pp \\* tp = 1 \\* 4 = 4 does not divide the world size 6"):
        grid_for(6, tp=4)
    with pytest.raises(ValueError, match="must multiply to the world size"):
        grid_for(8, dp=2, tp=2)
    with pytest.raises(ValueError, match="tp must be a positive int"):
        Grid(tp=0)
    with pytest.raises(ValueError, match="order must list each of"):
        Grid(order=("dp", "tp"))
    with pytest.raises(ValueError, match="rank 4 is outside a grid of 4 ranks"):
        Grid(dp=2, tp=2).coords(4)
    assert grid_for(8, tp=2, pp=2) == Grid(dp=2, pp=2, tp=2)


def test_grid_and_calculator_import_without_torch():
    code = "import sys, distlab.parallel3d.mesh, distlab.parallel3d.planner; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- on the ranks -----------------------------------------------------------------------------------

def groups_and_meshes():
    """Call 1 on every rank: for every layout (both orders), ProcessGrid's groups and collectives."""
    import torch.distributed as dist

    from distlab.parallel3d.mesh import ProcessGrid, device_mesh, mesh_disagreements

    world, rank = dist.get_world_size(), dist.get_rank()
    out = {"groups": {}, "mesh": {}}
    for grid in layouts(world) + [g for g in layouts(world, MEGATRON) if g.pp > 1 and g.dp > 1]:
        pg = ProcessGrid(grid)
        seen = {}
        for axis in AXES:
            ids = torch.tensor([rank])
            dist.all_reduce(ids, group=pg.group(axis))
            gathered = [torch.zeros(1, dtype=torch.long) for _ in range(pg.size(axis))]
            dist.all_gather(gathered, torch.tensor([rank]), group=pg.group(axis))
            seen[axis] = {"sum": ids.item(), "gathered": [int(t) for t in gathered],
                          "rank_in": dist.get_rank(pg.group(axis)), "size": dist.get_world_size(pg.group(axis))}
        seen["stages"] = (pg.previous_stage, pg.next_stage, pg.is_first_stage, pg.is_last_stage)
        out["groups"][grid] = seen
    for grid in [Grid(dp=world), Grid(tp=world), grid_for(world, tp=2), grid_for(world, pp=2)]:
        mesh = device_mesh(grid)
        out["mesh"][grid] = {"own": mesh_disagreements(grid, mesh),
                             "transposed": mesh_disagreements(Grid(dp=grid.tp, pp=grid.pp, tp=grid.dp), mesh)}
    return out


def distlab_layouts(world):
    """At 4 ranks dp4, tp4, dp2 x tp2, dp2 x pp2, pp2 x tp2; at 2 ranks dp2, tp2, pp2."""
    if world == 2:
        return [Grid(dp=2), Grid(tp=2), Grid(pp=2)]
    return [Grid(dp=4), Grid(tp=4), Grid(dp=2, tp=2), Grid(dp=2, pp=2), Grid(pp=2, tp=2)]


def training(world):
    """Call 2 on every rank: the layouts trained our way, dp x tp (or each alone) also torch's way."""
    from distlab.parallel3d import train

    kw = dict(steps=STEPS, lr=LR, batch_size=BATCH, keep_gradients=True)
    return {
        "distlab": {g: train.train(g, micro_batches=MICRO, **kw) for g in distlab_layouts(world)},
        "torch": {g: torch_train.train_torch(g, **kw) for g in ([Grid(dp=2, tp=2)] if world == 4 else
                                                               [Grid(dp=2), Grid(tp=2)])},
        "adamw": {g: train.train(g, steps=1, optimizer="adamw", lr=1e-3, micro_batches=MICRO)
                  for g in (grid_for(world, tp=2), grid_for(world, pp=2))},
        "torch_pp": _raises(lambda: torch_train.train_torch(grid_for(world, pp=2), steps=1)),
    }


def _raises(fn):
    try:
        fn()
    except NotImplementedError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def results():
    """{world: (call 1 per rank, call 2 per rank)}, two calls on each warm pool."""
    with distlab.Pool(2), distlab.Pool(4):
        yield {n: (distlab.run(groups_and_meshes, nprocs=n, timeout=120),
                   distlab.run(training, n, nprocs=n, timeout=240)) for n in WORLD_SIZES}


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_collectives_along_each_axis_reach_exactly_the_grids_groups(results, n):
    per_rank = results[n][0]
    grids = per_rank[0]["groups"].keys()
    assert len(grids) == len(layouts(n)) + (1 if n == 4 else 0)       # every layout, + Megatron's (2,2,1)
    for grid in grids:
        for rank, out in enumerate(per_rank):
            seen, coords = out["groups"][grid], grid.coords(rank)
            for axis in AXES:
                members = grid.group(rank, axis)
                assert seen[axis]["sum"] == sum(members), (grid, rank, axis)
                assert seen[axis]["gathered"] == members, (grid, rank, axis)
                assert (seen[axis]["rank_in"], seen[axis]["size"]) == (coords[axis], grid.size(axis))
            stage = coords["pp"]
            pp_group = grid.group(rank, "pp")
            assert seen["stages"] == (pp_group[stage - 1] if stage else None,
                                      pp_group[stage + 1] if stage < grid.pp - 1 else None,
                                      stage == 0, stage == grid.pp - 1)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_device_mesh_agrees_with_the_grid(results, n):
    for rank, out in enumerate(results[n][0]):
        for grid, found in out["mesh"].items():
            assert found["own"] == [], (grid, rank, found["own"])
            if grid.dp != grid.tp:        # the check can fail: dp and tp swapped must disagree
                assert found["transposed"], (grid, rank)


def _name(grid):
    return f"dp{grid.dp}-pp{grid.pp}-tp{grid.tp}"


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("engine", ["distlab", "torch"])
def test_gradients_and_loss_curve_equal_the_single_process(results, n, engine):
    reference = train.reference_losses(steps=STEPS, lr=LR, batch_size=BATCH)
    for grid, per_rank in _by_grid(results[n][1], engine).items():
        for rank, out in enumerate(per_rank):
            assert out["coords"] == grid.coords(rank)
            checks.assert_gradients_match([out["gradients"]], out["expected"])
            checks.assert_tensor_close(torch.tensor(out["losses"]), torch.tensor(reference),
                                       f"{engine} {_name(grid)} loss curve on rank {rank}", rtol=1e-5, atol_scale=1e-5)


def _by_grid(per_rank, engine):
    grids = per_rank[0][engine].keys()
    return {grid: [out[engine][grid] for out in per_rank] for grid in grids}


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("engine", ["distlab", "torch"])
def test_bytes_held_and_sent_are_exactly_the_calculators(results, n, engine):
    tiny = planner.Model.from_config(models.GPTConfig())
    for grid, per_rank in _by_grid(results[n][1], engine).items():
        for rank, out in enumerate(per_rank):
            predicted = predict.predict_run(tiny, grid, BATCH, engine=engine, stage=grid.coords(rank)["pp"],
                                           micro_batches=MICRO)
            held = dict(predicted["bytes"])
            if engine == "torch" and grid.dp == 1 and grid.tp > 1:
                # Without FSDP2, DTensor hands back the vocab-parallel embedding's gradient
                # replicated (all V rows on every rank); FSDP2 re-shards it when dp > 1
                extra = 4 * tiny.vocab * tiny.hidden * (grid.tp - 1) // grid.tp
                held["gradients"] += extra
                held["total"] += extra
            assert out["bytes"] == held, (engine, _name(grid), rank)
            assert out["sent"] == {axis: predicted["sent"][axis] for axis in out["sent"]}, (engine, _name(grid), rank)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_calls_per_step_one_dp_all_reduce_megatrons_tp_all_reduces_one_message_per_micro_batch(results, n):
    layers = models.GPTConfig().layers
    for grid, per_rank in _by_grid(results[n][1], "distlab").items():
        for rank, out in enumerate(per_rank):
            stage = grid.coords(rank)["pp"]
            first, last = stage == 0, stage == grid.pp - 1
            assert out["calls"]["dp"] == ({"all_reduce": 1} if grid.dp > 1 else {})
            if grid.tp == 1:
                assert out["calls"]["tp"] == {}
            elif grid.pp == 1:     # + the vocab-parallel cross-entropy's three
                assert out["calls"]["tp"] == {"all_reduce": 4 * layers + 2 + 3}
            else:                  # per micro-batch; the last stage's loss is vocab-parallel too: no gather
                assert out["calls"]["tp"] == {"all_reduce": MICRO * (4 * layers // grid.pp + first + last + 3 * last)}
            messages = MICRO * ((not first) + (not last)) if grid.pp > 1 else 0
            assert out["calls"]["pp"] == ({"isend": messages, "irecv": messages} if messages else {})
    for grid, per_rank in _by_grid(results[n][1], "torch").items():
        # CommDebugMode sees DTensor's functional all-reduces too: ours, plus two per block, since
        # q, k and v are three column-wise layers there, each all-reducing its input gradient
        if grid.tp > 1:
            assert per_rank[0]["calls"]["c10d_functional.all_reduce"] == 4 * layers + 2 + 3 + 2 * layers


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_adamw_state_and_its_step_counters_are_predicted_exactly(results, n):
    tiny = planner.Model.from_config(models.GPTConfig())
    for rank, out in enumerate(results[n][1]):
        for grid, run in out["adamw"].items():
            stage = grid.coords(rank)["pp"]
            predicted = predict.predict_run(tiny, grid, BATCH, optimizer="adamw", stage=stage, micro_batches=MICRO)
            assert run["bytes"] == predicted["bytes"], (_name(grid), rank)
            assert run["bytes"]["optimizer"] == 2 * run["bytes"]["parameters"] + 4 * tiny.tensors_on_rank(grid.pp, stage)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_torch_engine_says_it_runs_no_pipeline(results, n):
    for out in results[n][1]:
        assert "pipelining" in out["torch_pp"]


@pytest.mark.slow
@pytest.mark.timeout(300)  # the run's own limit (240 s) and its teardown: CI's busy cores took over 120 s
def test_all_three_axes_dp2_pp2_tp2_on_8_ranks():
    """The full 3D layout (one cold 8-rank launch: ~40 s on 2 quiet cores, over 120 s on busy ones)."""
    grid = Grid(dp=2, pp=2, tp=2)
    run = runs.run_layouts({"3d": grid}, 8, steps=STEPS, lr=LR, batch_size=BATCH, keep_gradients=True,
                                 micro_batches=MICRO, timeout=240)["3d"]
    reference = train.reference_losses(steps=STEPS, lr=LR, batch_size=BATCH)
    tiny = planner.Model.from_config(models.GPTConfig())
    for rank, out in enumerate(run.ranks):
        assert out["coords"] == grid.coords(rank)
        checks.assert_gradients_match([out["gradients"]], out["expected"])
        checks.assert_tensor_close(torch.tensor(out["losses"]), torch.tensor(reference), f"loss curve on rank {rank}",
                                   rtol=1e-5, atol_scale=1e-5)
        predicted = predict.predict_run(tiny, grid, BATCH, stage=grid.coords(rank)["pp"], micro_batches=MICRO)
        assert (out["bytes"], out["sent"]) == (predicted["bytes"], predicted["sent"]), rank
        assert set(out["calls"]) == {"tp", "pp", "dp"} and all(out["calls"].values()), rank   # every axis talks
