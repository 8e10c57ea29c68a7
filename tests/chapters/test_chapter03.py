"""Chapter 3's exercise: the reference is fully switched off, and plausible wrong answers lose points.

The general gates (release equals notebooks/, solution full marks, blank release zero, time
bound) run for every assignment in tests/grade/test_grading.py; here are the chapter's own.
"""

from __future__ import annotations

import grading_support as gs
import pytest

import distlab

SLUG = "03-ddp"


def test_the_reference_package_and_torch_ddp_are_forbidden():
    assert set(gs.forbidden_list(SLUG)) == {"torch.nn.parallel.DistributedDataParallel", "distlab.data_parallel"}
    assert "FORBIDDEN" in gs.grade_cells(SLUG)["setup"]


def try_forbidden(forbidden):
    import torch

    import distlab.zero.optimizer  # holds plan_buckets by name, imported before the guard goes in
    from distlab.grade.boundary.forbid import forbid

    forbid(*forbidden)
    verdicts = gs.try_each({
        "torch DDP": lambda: torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)),
        "OverlappedDDP": lambda: __import__("distlab.data_parallel.overlap", fromlist=["x"]).OverlappedDDP(
            torch.nn.Linear(2, 2)),
        "average_gradients": lambda: __import__("distlab.data_parallel.naive", fromlist=["x"]).average_gradients(
            torch.nn.Linear(2, 2)),
        "plan_buckets": lambda: __import__("distlab.data_parallel.buckets", fromlist=["x"]).plan_buckets([], 1),
        "held by name in ZeRO's code": lambda: distlab.zero.optimizer.plan_buckets([], 1),
    })
    # and an optimizer still works (creating one imports torch._dynamo, which inspects modules)
    model = torch.nn.Linear(2, 2)
    torch.optim.AdamW(model.parameters()).step()
    return verdicts


def test_forbidden_apis_raise_on_a_rank_and_training_still_works():
    for verdicts in distlab.run(try_forbidden, gs.forbidden_list(SLUG), nprocs=2):
        assert set(verdicts.values()) == {"ForbiddenError"}, verdicts


def test_the_exercise_runs_on_2_and_4_ranks_with_the_awkward_model_hidden():
    cells = gs.assert_tasks_graded_on_2_and_4_ranks(SLUG)
    for task in ("task1-tests", "task2-tests", "task3-tests"):
        visible, hidden = gs.visible_part(cells[task]), gs.hidden_part(cells[task])
        assert '("awkward",' in hidden and '("awkward",' not in visible, task


MEAN_OF_MEANS = '''
def broadcast_parameters(model):
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)


def ddp_step(model, optimizer, batch, loss_fn):
    """The pages' naive step: right for equal shards, the mean of the shards' means otherwise."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    optimizer.step()
    loss = torch.tensor([loss.item()])
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()
'''

BLOCKING_AFTER_BACKWARD = '''
class OverlappedDDP:
    """Right numbers, but nothing overlaps: everything is reduced in finish(), blocking."""

    def __init__(self, model, bucket_mb):
        broadcast_parameters(model)   # task 1's, broken above: graded with the reference, only the overlap is wrong
        self.buckets = plan_buckets(model.parameters(), bucket_mb)

    def finish(self):
        for bucket in self.buckets:
            missing = {id(p) for p in bucket if p.grad is None}
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            offset = 0
            for p in bucket:
                piece = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.grad = None if id(p) in missing else piece.clone()
'''

SYNC_EVERY_MICRO_STEP = '''
def accumulation_step(model, optimizer, micro_batches, loss_fn):
    """Right gradients, k times the traffic: averages after every micro-batch."""
    optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    for micro in micro_batches:
        before = {id(p): None if p.grad is None else p.grad.clone() for p in model.parameters()}
        (loss_fn(model, micro) / k).backward()
        for p in model.parameters():
            if p.grad is not None:
                new = p.grad - (before[id(p)] if before[id(p)] is not None else 0)
                dist.all_reduce(new)
                new /= dist.get_world_size()
                p.grad.copy_(new + (before[id(p)] if before[id(p)] is not None else 0))
    optimizer.step()
'''


test_plausible_wrong_answers_score_zero_on_their_task = gs.wrong_answers_test(
    SLUG, {"task1-answer": MEAN_OF_MEANS, "task2-answer": BLOCKING_AFTER_BACKWARD,
           "task3-answer": SYNC_EVERY_MICRO_STEP},
    {"task1-tests": "the mean of unequal shards' means", "task2-tests": "all-reduces after backward (no overlap)",
     "task3-tests": "communicating on every micro-step"},
    # Task 1 fails on the shards of different sizes (4 and 3 examples), gradients and loss alike.
    # Task 2 fails on the overlap, not on its gradients: its broadcast was the reference's. Task 3
    # fails two checks of one case, and the feedback lists both, not only the first.
    reasons=("ranks holding 4+3 examples, step 0: the gradient of", "the full batch's mean loss is",
             "made a blocking all_reduce", "communicated before the last micro-batch",
             "one all-reduce of the gradients sends"))


NO_BROADCAST = ("    with torch.no_grad():\n        for tensor in list(model.parameters()) + list(model.buffers()):\n"
                "            dist.broadcast(tensor.data, src=0)\n", "    pass  # forgot: ranks keep their own weights\n")

test_a_missing_broadcast_scores_zero_on_task_1 = gs.wrong_answers_test(
    SLUG, {"task1-answer": NO_BROADCAST}, {"task1-tests": "a missing broadcast"},
    reasons=("ranks holding 4+3 examples, step 0: the gradient of",))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_test_helpers_accept_the_reference_on_every_model_they_offer():
    """Each task's check, run on the solution with every model of the notebook (the awkward one
    with buckets of every shape: one holding everything, unused parameter included), passes."""
    nb = gs.notebook_definitions(SLUG)
    kinds = ("mlp", "gpt", "awkward")
    nb["check_task1"]([(kind, "sgd", 0.1, nb["batches"](kind, 2, size, seed=7)) for kind in kinds
                       for size in (7, 8)], nprocs=2)          # shards of 4 and 3, and of 4 and 4
    nb["check_task2"]([(kind, bucket_mb, 0.1, nb["batches"](kind, 2, 8, seed=8))
                       for kind in kinds for bucket_mb in (0.0003, 100.0)], nprocs=2)
    nb["check_task3"]([(kind, 2, 0.1, nb["batches"](kind, 2, 16, seed=9)) for kind in kinds], nprocs=2)
    assert nb["buckets_ready_in_backward"]("awkward", 100.0) == 0      # the one bucket holds `unused`
    assert nb["buckets_ready_in_backward"]("gpt", 100.0) == 1


# -- issue 43: the grader's network sees every all-reduce, whatever the rank's record says -------

PER_PARAMETER_BEHIND_DUMMY_BUCKETS = '''
class OverlappedDDP:
    """No buckets at all: one all-reduce per parameter in finish(), sent around the rank's recorder
    (comm.original), and one tiny recorded all-reduce launched from the hooks per bucket, so that
    the rank's own record shows the right buckets launched during backward."""

    def __init__(self, model, bucket_mb):
        from distlab.tools import comm
        self.world = dist.get_world_size()
        self.unrecorded_all_reduce = comm.original("all_reduce")
        broadcast_parameters(model)
        self.buckets = plan_buckets(model.parameters(), bucket_mb)
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [set() for _ in self.buckets]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.launched, self.works = 0, []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        self.ready[self.bucket_of[id(param)]].add(id(param))
        while self.launched < len(self.buckets) and len(self.ready[self.launched]) == len(self.buckets[self.launched]):
            self.launch(self.launched)

    def launch(self, index):
        self.works.append(dist.all_reduce(torch.zeros(1), async_op=True))   # all the record sees
        self.launched += 1

    def finish(self):
        while self.launched < len(self.buckets):
            self.launch(self.launched)
        for work in self.works:
            work.wait()
        for p in self.params:
            if p.grad is not None:
                p.grad /= self.world
                self.unrecorded_all_reduce(p.grad)
        self.ready = [set() for _ in self.buckets]
        self.launched, self.works = 0, []
'''

test_all_reduces_sent_around_the_rank_record_score_zero_on_task_2 = gs.wrong_answers_test(
    SLUG, {"task2-answer": PER_PARAMETER_BEHIND_DUMMY_BUCKETS},
    {"task2-tests": "per-parameter all-reduces around the recorder behind dummy buckets"},
    reasons=["as the grader's network saw them"])
