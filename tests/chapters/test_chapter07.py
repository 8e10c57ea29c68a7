"""Chapter 7's exercise: the references are switched off, and plausible wrong answers lose points.

The general gates (release equals notebooks/, no solution in the release, solution full marks,
blank release zero, time bound) run for every assignment in tests/grade/test_grading.py; here are
the chapter's own.

``DeviceMesh`` and ``init_device_mesh`` are forbidden where torch defines them
(``torch.distributed.device_mesh``) *and* where ``torch.distributed`` exports them: the warm
ranks put every attribute of ``torch.distributed`` back between two calls
(:mod:`distlab.runtime.isolation`), while the defining module keeps its stand-in; forbidding only the
defining module's names would leave ``dist.init_device_mesh`` usable from the second call of a
pool on. The test below makes two calls on one warm pool.

Seen to fail for the intended reason (each against the visible tests, or the hidden ones where
the visible layouts cannot tell, while writing them): a grid with dp the fastest-varying
coordinate (the coordinates), a grid that accepts sizes not multiplying to the world size (the
ValueError), a gradient average over the whole world (visible when it also runs for dp = 1,
hidden on dp=2 x tp=2 when it is skipped there: the size of the call's group), a sum instead of
a mean (the gradients, "dp times the average"), the batch sharded by the global rank (the
loss), tensor parallelism over the whole world (the size of the forward's groups), a memory
formula without the pipeline's micro-batches in flight or with ZeRO-2 not sharding the
optimizer state (the bytes), and the chosen layout's memory in GB instead of GiB. Sharding the
batch by the tp coordinate gives some ranks an empty batch and the ranks wait in an all-reduce
of mismatched sizes: the run times out after 60 s (the solution's calls take 1-2 s) and the
task scores zero.

Forbidding a name under ``torch.distributed.tensor`` imports that package on every rank
before ``DeviceMesh`` is replaced (it registers the real class on import, and AdamW's first step
imports it): about 0.6 s of CPU per rank process, once per warm pool.

Measured on this machine (2 cores shared with other work, load 3-5): autograding the solution
alone takes 22-33 s of wall time and 43 s of CPU time (so about 25 s on 2 idle cores), the
blank release 18-32 s and 29 s of CPU; the slow test below about 80 s.
"""

from __future__ import annotations

import grading_support as gs
import pytest

import distlab

SLUG = "07-3d-parallelism"


def test_the_reference_package_and_device_mesh_are_forbidden_in_metadata_and_setup():
    forbidden = set(gs.forbidden_list(SLUG))
    assert {"distlab.parallel3d",
            "torch.distributed.device_mesh.init_device_mesh", "torch.distributed.device_mesh.DeviceMesh",
            "torch.distributed.init_device_mesh", "torch.distributed.DeviceMesh",
            "torch.distributed.tensor.init_device_mesh", "torch.distributed.tensor.DeviceMesh"} <= forbidden
    # torch.distributed.tensor registers the real DeviceMesh class when it is first imported (AdamW's first
    # step imports it): forbidding one of its names imports it, so that must come before any other DeviceMesh
    first = min(i for i, name in enumerate(gs.forbidden_list(SLUG)) if name.endswith("DeviceMesh"))
    assert gs.forbidden_list(SLUG)[first].startswith("torch.distributed.tensor.")


def try_forbidden(seed):
    import importlib

    import torch
    import torch.distributed as dist

    from distlab import models
    from distlab.tensor_parallel import model as tp_model
    from distlab.tools import comm

    mod = importlib.import_module
    verdicts = gs.try_each({
        "distlab.parallel3d.mesh.Grid": lambda: __import__("distlab.parallel3d.mesh").parallel3d.mesh.Grid(dp=2),
        "import distlab.parallel3d.mesh": lambda: mod("distlab.parallel3d.mesh").grid_for(4, tp=2),
        "from distlab.parallel3d.mesh import ProcessGrid": lambda: exec("from distlab.parallel3d.mesh import ProcessGrid"),
        "distlab.parallel3d": lambda: mod("distlab.parallel3d").train,
        "distlab.parallel3d.train": lambda: mod("distlab.parallel3d.train").average_gradients,
        "distlab.parallel3d.planner": lambda: mod("distlab.parallel3d.planner").estimate,
        "distlab.parallel3d.recommend": lambda: mod("distlab.parallel3d.recommend").recommend,
        "init_device_mesh": lambda: mod("torch.distributed.device_mesh").init_device_mesh("cpu", (2,)),
        "dist.init_device_mesh": lambda: dist.init_device_mesh("cpu", (2,)),
        "DeviceMesh": lambda: mod("torch.distributed.device_mesh").DeviceMesh("cpu", [0, 1]),
        "dist.DeviceMesh": lambda: dist.DeviceMesh("cpu", [0, 1]),
        "torch.distributed.tensor.DeviceMesh": lambda: mod("torch.distributed.tensor").DeviceMesh("cpu", [0, 1]),
        "DeviceMesh.from_group": lambda: dist.DeviceMesh.from_group(dist.group.WORLD, "cpu"),
    })

    # and what the exercise is built from still works: a group for every tp and dp group of a
    # dp=1 x tp=2 grid (every rank, every group), chapter 5's TP inside the tp group, an AVG
    # all-reduce in the dp group, the comm log, SGD and AdamW (whose first step imports
    # torch._dynamo, and through it DTensor and DeviceMesh users)
    rank = dist.get_rank()
    mine = {}
    for axis, lists in (("tp", [[0, 1]]), ("dp", [[0], [1]])):
        for members in lists:
            group = dist.new_group(members)
            if rank in members:
                mine[axis] = group
    ids = torch.tensor([rank])
    dist.all_reduce(ids, group=mine["tp"])
    model = tp_model.parallelize_gpt(models.build("gpt", seed=seed), group=mine["tp"])
    with comm.record() as log:
        tp_model.loss(model, models.example_batch("gpt", 4, seed=seed)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=mine["dp"])
    for optimizer in (torch.optim.SGD, torch.optim.AdamW):
        optimizer(model.parameters(), lr=1e-2).step()
    return (verdicts, ids.item(), sorted({c.group_size for c in log}),
            bool(all(torch.isfinite(p).all() for p in model.parameters())))


def test_forbidden_apis_raise_on_a_rank_and_training_still_works_on_a_warm_pool():
    from distlab.grade import checks
    from distlab.runtime.pool import Pool

    with Pool(2):
        for seed in (0, 1):   # the second call runs after the pool put torch.distributed's names back
            for verdicts, ids, group_sizes, trained in checks.run_ranks(
                    try_forbidden, nprocs=2, args=(seed,), forbidden=gs.forbidden_list(SLUG), timeout=120).results:
                assert set(verdicts.values()) == {"ForbiddenError"}, (seed, verdicts)
                assert ids == 1 and group_sizes == [1, 2] and trained


def test_the_exercise_runs_on_2_and_4_ranks_with_hidden_tests():
    found = gs.assert_tasks_graded_on_2_and_4_ranks(SLUG)
    assert all("on_ranks(" in found[task] for task in ("task1-tests", "task2-tests", "task3-tests"))
    for test in ("choice-tests", "concept-a-tests", "concept-b-tests", "concept-c-tests", "concept-d-tests"):
        assert "### BEGIN HIDDEN TESTS" in found[test], test
    # numeric answers are computed with the book's calculator in the hidden tests, not written down
    for test in ("task3-tests", "choice-tests"):
        assert "from distlab.parallel3d import planner" in gs.hidden_part(found[test]), test


def test_the_choice_is_the_calculators_recommendation_for_the_books_70b_example():
    """The exercise's memory-only procedure lands where distlab.parallel3d.recommend.recommend (which also
    prices time) lands for the book's 70B model on 64 GPUs: the question and the book agree."""
    from distlab.parallel3d import planner, recommend

    found = gs.grade_cells(SLUG)
    namespace: dict = {}
    for grade_id in ("setup", "task3-answer", "choice-answer"):
        exec(found[grade_id], namespace)  # noqa: S102 - the instructor's own cells
    model = planner.Model(layers=80, hidden=8192, heads=64, vocab=128256, seq=4096, biases=False,
                         learned_positions=False)
    training = planner.Training(global_batch=1024, micro_batch=1, recompute="selective", sequence_parallel=True)
    choice = recommend.recommend(model, planner.Cluster(gpus=64), training).choice
    grid = choice.grid
    assert tuple(namespace["chosen_layout"]) == (grid.dp, grid.pp, grid.tp, choice.zero)
    # the exercise's round 70e9 parameters against the calculator's exact count: within 2%
    assert abs(namespace["chosen_gib"] - choice.memory["total"] / planner.GiB) < 0.02 * namespace["chosen_gib"]


DP_FASTEST = (  # the solution's place values, with dp the fastest-varying digit
    'inner = {"tp": 1, "pp": self.sizes["tp"], "dp": self.sizes["tp"] * self.sizes["pp"]}',
    'inner = {"dp": 1, "pp": self.sizes["dp"], "tp": self.sizes["dp"] * self.sizes["pp"]}')

WORLD_AVERAGE = (  # the solution's average, over the whole world (still skipped for dp = 1)
    "dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.dp_group)",
    "dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)")

NO_MICRO_BATCHES_IN_FLIGHT = (  # the solution's activations, as if a stage held one micro-batch
    "in_flight = min(micro_batches, pp)", "in_flight = 1")


# The choice keeps its points: with pp = 1 the missing factor changes nothing.
test_plausible_wrong_answers_score_zero_on_their_task = gs.wrong_answers_test(
    SLUG, {"task1-answer": DP_FASTEST, "task2-answer": WORLD_AVERAGE, "task3-answer": NO_MICRO_BATCHES_IN_FLIGHT},
    {"task1-tests": "a grid with dp the fastest-varying coordinate",
     "task2-tests": "gradients averaged over the whole world",
     "task3-tests": "a memory formula without the micro-batches in flight"},
    reasons=("with tp the fastest-varying", "made all_reduce over a group of 4 ranks; average over the rank",
             "off by more than 0.1%"))

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_test_helpers_accept_the_reference_on_every_layout_they_offer():
    """Task 2's check, run on the solution with the layouts the graded cases skip: pure data and
    pure tensor parallelism on 4 ranks, one sequence per dp rank, and an uneven batch per rank."""
    nb = gs.notebook_definitions(SLUG)
    with distlab.Pool(2, backend="relay"):
        nb["check_task2"]([(1, 2, 2, 5), (2, 1, 2, 6), (2, 1, 6, 7)], nprocs=2)
    with distlab.Pool(4, backend="relay"):
        nb["check_task2"]([(4, 1, 4, 8), (1, 4, 4, 9), (2, 2, 2, 10)], nprocs=4)


# -- issue 43: the grader's network sees which ranks talk, whatever the rank's own record says ------

test_gradients_gathered_from_every_rank_around_the_record_score_zero_on_task_2 = gs.wrong_answers_test(
    SLUG, {"task2-answer": ("""                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.dp_group)
""", """                    from distlab.tools import comm
                    world, tp = dist.get_world_size(), dist.get_world_size() // self.dp
                    everyone = [torch.empty_like(p.grad) for _ in range(world)]
                    comm.original("all_gather")(everyone, p.grad)   # every rank's, around the recorder
                    peers = [everyone[r] for r in range(world) if r % tp == self.coords["tp"]]
                    p.grad.copy_(sum(peers) / self.dp)
            dist.all_reduce(torch.zeros(1), group=self.dp_group)     # all the rank's record sees
""")},
    {"task2-tests": "gradients gathered from every rank around the rank's recorder"},
    reasons=["as the grader's network saw it"])
