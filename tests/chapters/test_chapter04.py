"""Chapter 4's exercise: the references are switched off, and plausible wrong answers lose points.

The general gates (release equals notebooks/, no solution in the release, solution full marks,
blank release zero, time bound) run for every assignment in tests/grade/test_grading.py; here are
the chapter's own.
"""

from __future__ import annotations

import pytest
from grading_support import (
    assert_tasks_graded_on_2_and_4_ranks,
    forbidden_list,
    grade_one_student,
    hidden_part,
    notebook_definitions,
    solution_answers,
    try_each,
    wrong_answers_test,
)

import distlab

SLUG = "04-zero-fsdp"


def test_the_reference_and_torchs_fsdp_and_zero_are_forbidden_in_metadata_and_setup():
    forbidden = set(forbidden_list(SLUG))
    assert {"distlab.zero", "torch.distributed.fsdp.fully_shard", "torch.distributed.fsdp.FullyShardedDataParallel",
            "torch.distributed.optim.ZeroRedundancyOptimizer"} <= forbidden


def try_forbidden(forbidden):
    import torch

    from distlab.grade.boundary.forbid import forbid

    forbid(*forbidden)
    verdicts = try_each({
        "distlab.zero": lambda: __import__("distlab.zero").zero.flat,
        "import a module of distlab.zero": lambda: __import__("importlib").import_module("distlab.zero.flat").FlatUnit,
        "ZeRO-1/2, the sharded optimizer": lambda: __import__("importlib").import_module(
            "distlab.zero.optimizer").ShardedOptimizer,
        "ZeRO-3, the fully sharded model": lambda: __import__("importlib").import_module(
            "distlab.zero.fully_shard").FullyShardedModel,
        "the stages side by side": lambda: __import__("importlib").import_module("distlab.zero.stages").build,
        "the formulas, held by chapter 7's planner": lambda: __import__(
            "importlib").import_module("distlab.parallel3d.planner").model_state_theory(10, 2, 1),
        "fully_shard": lambda: __import__("torch.distributed.fsdp").distributed.fsdp.fully_shard(torch.nn.Linear(2, 2)),
        "fully_shard (defining module)": lambda: __import__(
            "torch.distributed.fsdp._fully_shard._fully_shard", fromlist=["x"]).fully_shard(torch.nn.Linear(2, 2)),
        "FSDP1": lambda: torch.distributed.fsdp.FullyShardedDataParallel(torch.nn.Linear(2, 2)),
        "ZeroRedundancyOptimizer": lambda: __import__("torch.distributed.optim").distributed.optim.ZeroRedundancyOptimizer(
            torch.nn.Linear(2, 2).parameters(), torch.optim.AdamW),
    })
    # and training still works: AdamW (whose first use imports torch._dynamo, which imports
    # torch.distributed.fsdp internals) and the collectives ZeRO is built from
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    flat = torch.ones(4 * torch.distributed.get_world_size())
    mine = torch.empty(4)
    torch.distributed.reduce_scatter_single(mine, flat, op=torch.distributed.ReduceOp.AVG)
    whole = torch.empty_like(flat)
    torch.distributed.all_gather_single(whole, mine)
    return verdicts, bool(torch.isfinite(model.weight).all()), whole.tolist()


def test_forbidden_apis_raise_on_a_rank_and_training_still_works():
    for verdicts, trained, gathered in distlab.run(try_forbidden, forbidden_list(SLUG), nprocs=2):
        assert set(verdicts.values()) == {"ForbiddenError"}, verdicts
        assert trained and gathered == [1.0] * 8


def test_the_exercise_runs_on_2_and_4_ranks_with_hidden_tests():
    found = assert_tasks_graded_on_2_and_4_ranks(SLUG)
    assert '("gpt",' in hidden_part(found["task1-tests"]), "task 1's GPT case is hidden"


FULL_OPTIMIZER_STATE = '''
class ZeRO1:
    """Right parameters, but every rank keeps AdamW's state for all of them (that is DDP)."""

    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self):
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.optimizer.step()
'''

ALL_REDUCE_THEN_SLICE = '''
class ZeRO2:
    """Right numbers and only slices kept, but each layer is all-reduced in full, then sliced."""

    def __init__(self, model, lr):
        self.flats = [Flat(layer.parameters()) for layer in layers(model)]
        self.shards = [nn.Parameter(f.flatten(f.params)[f.mine()].clone()) for f in self.flats]
        self.optimizer = torch.optim.AdamW(self.shards, lr=lr)
        self.layer_of = {id(p): i for i, f in enumerate(self.flats) for p in f.params}
        self.ready = [0] * len(self.flats)
        for f in self.flats:
            for p in f.params:
                p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param):
        i = self.layer_of[id(param)]
        self.ready[i] += 1
        if self.ready[i] == len(self.flats[i].params):
            self.ready[i] = 0
            self.reduce_layer(i)

    def reduce_layer(self, i):
        f = self.flats[i]
        everything = f.flatten([p.grad for p in f.params])
        dist.all_reduce(everything)
        self.shards[i].grad = everything[f.mine()] / dist.get_world_size()
        for p in f.params:
            p.grad = None

    def step(self):
        self.optimizer.step()
        for f, shard in zip(self.flats, self.shards):
            out = shard.detach().new_empty(f.padded)
            dist.all_gather_single(out, shard.detach())
            for p, new in zip(f.params, f.views(out)):
                p.detach().copy_(new)
            shard.grad = None
'''

NEVER_FREED = '''
class ZeRO3:
    """Right loss and gradient slices, but the full weights are never freed: no memory saved."""

    def __init__(self, model):
        self.flats, self.full, self.shards = [], [], []
        for i, layer in enumerate(layers(model)):
            f = Flat(layer.parameters())
            buffer = f.flatten(f.params)
            for p, view in zip(f.params, f.views(buffer)):
                p.data = view
            self.flats.append(f)
            self.full.append(buffer)
            self.shards.append(nn.Parameter(buffer[f.mine()].clone()))
            for p in f.params:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.gradient_ready(i))
        self.ready = [0] * len(self.flats)

    def gradient_ready(self, i):
        self.ready[i] += 1
        f = self.flats[i]
        if self.ready[i] == len(f.params):
            self.ready[i] = 0
            out = f.flatten([p.grad for p in f.params])
            mine = out.new_empty(f.shard_numel)
            dist.reduce_scatter_single(mine, out, op=dist.ReduceOp.AVG)
            self.shards[i].grad = mine
            for p in f.params:
                p.grad = None
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plausible_wrong_answers_score_zero_on_their_task(tmp_path):
    answers = {**solution_answers(SLUG), "task1-answer": FULL_OPTIMIZER_STATE,
               "task2-answer": ALL_REDUCE_THEN_SLICE, "task3-answer": NEVER_FREED}
    course, scores = grade_one_student(tmp_path, SLUG, "plausible", answers)
    assert scores["task1-tests"] == 0.0, "a ZeRO-1 keeping the full optimizer state was not caught"
    assert scores["task2-tests"] == 0.0, "a ZeRO-2 that all-reduces, then slices, was not caught"
    assert scores["task3-tests"] == 0.0, "a ZeRO-3 that never frees the gathered weights was not caught"
    assert scores["concept-a-tests"] + scores["concept-b-tests"] + scores["concept-c-tests"] == 3.0
    feedback = course.autograded_text()
    for reason in ("of optimizer state", "called all_reduce", "bytes of parameters at once"):
        assert reason in feedback, f"the wrong answer failed, but not with the expected check: {reason!r}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_test_helpers_accept_the_reference_on_every_model_they_offer():
    """Each task's check, run on the solution with both models of the notebook, passes (2 and 4 ranks)."""
    nb = notebook_definitions(SLUG)
    kinds = ("mlp", "gpt")
    nb["check_task1"]([(kind, 1e-2, nb["batches"](kind, 2, 8, seed=7)) for kind in kinds], nprocs=2)
    nb["check_task2"]([(kind, 1e-2, nb["batches"](kind, 2, 8, seed=8)) for kind in kinds], nprocs=2)
    nb["check_task3"]([(kind, nb["batches"](kind, 2, 8, seed=9)) for kind in kinds], nprocs=2)
    # and on 4 ranks, where some of the MLP's layers hold fewer elements than there are ranks
    with distlab.Pool(4):
        nb["check_task2"]([("mlp", 1e-2, nb["batches"]("mlp", 2, 8, seed=24))], nprocs=4)
        nb["check_task3"]([("mlp", nb["batches"]("mlp", 2, 8, seed=25))], nprocs=4)



# -- issue 43: the grader's network sees every collective, whatever the rank's own record says ------

test_a_layer_all_reduced_around_the_rank_record_scores_zero_on_task_2 = wrong_answers_test(
    SLUG, {"task2-answer": ("""        averaged = local.new_empty(f.shard_numel)
        dist.reduce_scatter_single(averaged, local, op=dist.ReduceOp.AVG)
""", """        from distlab.tools import comm
        comm.original("all_reduce")(local)           # the whole layer, around the rank's own recorder
        averaged = local[f.mine()] / dist.get_world_size()
        n = dist.get_world_size()                    # a tiny reduce-scatter: all the rank's record sees
        dist.reduce_scatter_single(torch.empty(1), torch.zeros(n), op=dist.ReduceOp.AVG)
""")},
    {"task2-tests": "ZeRO-2 all-reducing each layer around the rank's recorder behind tiny reduce-scatters"},
    reasons=["called all_reduce (as the grader's network saw it)"])
