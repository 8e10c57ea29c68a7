"""Chapter 5's exercise: the references are switched off, and plausible wrong answers lose points.

The general gates (release equals notebooks/, no solution in the release, solution full marks,
blank release zero, time bound) run for every assignment in tests/grade/test_grading.py; here are
the chapter's own.

Torch's DTensor tensor parallelism cannot be switched off as one module: the first AdamW step
imports torch._dynamo, which imports FSDP internals, which import
``torch.distributed.nn.functional`` and ``torch.distributed.tensor``. So the exercise forbids
``torch.distributed.tensor.parallel`` (nothing imports it) as a module, and ``DTensor``,
``distribute_tensor``, ``distribute_module`` and the differentiable collectives one by one;
the test below checks that each road raises and that training still works.

Seen to fail for the intended reason (each against the visible tests, while writing them): a
column-parallel layer holding the full weight (its parameters), ``CopyToRegion`` without the
backward all-reduce (the input gradient), ``ReduceFromRegion`` with an all-reduce backward too
(the input gradient), a row-parallel layer without the forward all-reduce or adding its bias
before the sum (the output), an MLP block with a fresh LayerNorm (the output) or one that
all-gathers the hidden activation (the communication), a cross-entropy that gathers the logits
with torch.cat or into one new_empty tensor (the largest tensor), that gathers them in parts and
never concatenates them (the bytes sent), that does not subtract the maximum (NaN with large
logits) or that subtracts each rank's own maximum (the loss).

The memory probe is a TorchFunctionMode, not a TorchDispatchMode: entering a dispatch mode
imports torch._dynamo (about 1.6 s per rank, paid by every pool), and every tensor the
student's Python code makes comes from a torch function or tensor method anyway.
"""

from __future__ import annotations

import grading_support as gs
import pytest

import distlab

SLUG = "05-tensor-parallel"


def test_the_reference_package_dtensor_tp_and_differentiable_collectives_are_forbidden_in_metadata_and_setup():
    forbidden = set(gs.forbidden_list(SLUG))
    assert {"distlab.tensor_parallel", "torch.distributed.tensor.parallel",
            "torch.distributed.tensor.DTensor", "torch.distributed.tensor.distribute_tensor",
            "torch.distributed.nn.functional.all_reduce", "torch.distributed.nn.functional._AllReduce"} <= forbidden


def try_forbidden(forbidden):
    import importlib

    import torch
    import torch.distributed as dist
    from torch.overrides import TorchFunctionMode

    from distlab import models
    from distlab.grade.boundary.forbid import forbid
    from distlab.runtime import isolation
    from distlab.tools import comm

    isolation.preload()    # as on the grader's warm ranks: distlab.parallel3d holds tensor_parallel's functions
    forbid(*forbidden)
    mod = importlib.import_module
    linear = torch.nn.Linear(4, 4)
    verdicts = gs.try_each({
        "distlab.tensor_parallel": lambda: __import__("distlab.tensor_parallel").tensor_parallel.layers,
        "import distlab.tensor_parallel.layers": lambda: mod("distlab.tensor_parallel.layers").ColumnParallelLinear(4, 4),
        "import distlab.tensor_parallel.regions": lambda: mod("distlab.tensor_parallel.regions").copy_to_parallel_region,
        "distlab.tensor_parallel.dtensor": lambda: mod("distlab.tensor_parallel.dtensor").parallelize,
        "parallelize_gpt through distlab.parallel3d.train": lambda: mod("distlab.parallel3d.train").parallelize_gpt(None),
        "shard_like through distlab.parallel3d.train": lambda: mod("distlab.parallel3d.train").shard_like(None, {}),
        "parallelize_module": lambda: mod("torch.distributed.tensor.parallel").parallelize_module(linear, None, {}),
        "ColwiseParallel": lambda: mod("torch.distributed.tensor.parallel").ColwiseParallel(),
        "RowwiseParallel (defining module)": lambda: mod("torch.distributed.tensor.parallel.style").RowwiseParallel(),
        "loss_parallel": lambda: mod("torch.distributed.tensor.parallel.loss").loss_parallel(),
        "distribute_tensor": lambda: mod("torch.distributed.tensor").distribute_tensor(torch.ones(4), None),
        "distribute_tensor (defining module)": lambda: mod("torch.distributed.tensor._api").distribute_tensor(
            torch.ones(4), None),
        "distribute_module": lambda: mod("torch.distributed.tensor").distribute_module(linear, None),
        "DTensor.from_local": lambda: mod("torch.distributed.tensor").DTensor.from_local(torch.ones(4), None),
        "DTensor (defining module)": lambda: mod("torch.distributed.tensor._api").DTensor.from_local(torch.ones(4)),
        "nn.functional.all_reduce": lambda: mod("torch.distributed.nn.functional").all_reduce(torch.ones(2)),
        "torch.distributed.nn.all_reduce": lambda: mod("torch.distributed.nn").all_reduce(torch.ones(2)),
        "_AllReduce.apply": lambda: mod("torch.distributed.nn.functional")._AllReduce.apply(
            dist.ReduceOp.SUM, dist.group.WORLD, torch.ones(2)),
        "nn.functional.all_gather": lambda: mod("torch.distributed.nn.functional").all_gather(torch.ones(2)),
        "nn.functional.reduce_scatter": lambda: mod("torch.distributed.nn.functional").reduce_scatter(
            torch.ones(2), [torch.ones(2)] * dist.get_world_size()),
    })

    # and what the exercise is built from still works: a training step with AdamW (whose first
    # use imports torch._dynamo and through it FSDP and torch.distributed.nn internals), an
    # autograd Function that all-reduces backward, MAX and SUM all-reduces, an all-gather, the
    # memory probe (a TorchFunctionMode) and the comm log
    model = models.build("gpt", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    models.loss_fn(model, models.example_batch("gpt", 2)).backward()
    opt.step()

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class Probe(TorchFunctionMode):
        largest = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Probe.largest = max([Probe.largest] + [t.numel() for t in (out if isinstance(out, (list, tuple)) else [out])
                                                   if isinstance(t, torch.Tensor)])
            return out

    x = torch.ones(3, requires_grad=True)
    with Probe(), comm.record() as log:
        Copy.apply(x).sum().backward()
        biggest = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(biggest, op=dist.ReduceOp.MAX)
        parts = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, biggest)
    return (verdicts, bool(torch.isfinite(model.head.weight).all()), x.grad.tolist(), biggest.item(),
            [c.op for c in log], Probe.largest)


def test_forbidden_apis_raise_on_a_rank_and_training_still_works():
    for verdicts, trained, grad, biggest, calls, largest in distlab.run(try_forbidden, gs.forbidden_list(SLUG), nprocs=2):
        assert set(verdicts.values()) == {"ForbiddenError"}, verdicts
        assert trained and grad == [2.0] * 3 and biggest == 1.0
        assert calls == ["all_reduce", "all_reduce", "all_gather"] and largest == 3


def test_the_exercise_runs_on_2_and_4_ranks_with_hidden_tests():
    found = gs.assert_tasks_graded_on_2_and_4_ranks(SLUG)
    assert all("on_ranks(" in found[task] for task in ("task1-tests", "task2-tests", "task3-tests"))
    for question in "abcd":
        assert "### BEGIN HIDDEN TESTS" in found[f"concept-{question}-tests"], question


BIAS_BEFORE_THE_SUM = (  # the solution's row-parallel forward, with the bias added on every rank
    "        partial = F.linear(x, self.weight)\n        return reduce_from_region(partial) + self.bias\n",
    "        return reduce_from_region(F.linear(x, self.weight, self.bias))   # N biases summed\n")

GATHER_LAST_DIMENSION = '''
class {name}(torch.autograd.Function):
    """All-gather along the {what} forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, t):
        size, rank = world()
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        size, rank = world()
        return grad.chunk(size, dim=-1)[rank].contiguous()
'''
"""An autograd function Task 2's wrong answer below writes for itself."""

GATHERED_HIDDEN = GATHER_LAST_DIMENSION.format(name="GatherHidden", what="features") + '''

class ParallelMLPBlock(nn.Module):
    """Right numbers, but the hidden activation is all-gathered before fc2 takes its slice of it."""

    def __init__(self, block):
        super().__init__()
        size, rank = world()
        self.norm = copy.deepcopy(block.norm)
        self.fc1 = ColumnParallelLinear(block.fc1)
        self.fc2 = nn.Linear(block.fc2.in_features // size, block.fc2.out_features)
        with torch.no_grad():
            self.fc2.weight.copy_(block.fc2.weight.chunk(size, dim=1)[rank])
            self.fc2.bias.copy_(block.fc2.bias)

    def forward(self, x):
        size, rank = world()
        hidden = GatherHidden.apply(F.gelu(self.fc1(self.norm(x))))
        partial = F.linear(hidden.chunk(size, dim=-1)[rank], self.fc2.weight)
        return x + reduce_from_region(partial) + self.fc2.bias
'''

GATHERED_LOGITS = '''
class VocabParallelCrossEntropy(torch.autograd.Function):
    """Right loss and gradients, but every rank gathers the full logits."""

    @staticmethod
    def forward(ctx, local_logits, targets):
        size, rank = world()
        parts = [torch.empty_like(local_logits) for _ in range(size)]
        dist.all_gather(parts, local_logits.contiguous())
        full = torch.cat(parts, dim=-1)
        probs = full.softmax(dim=-1)
        ctx.save_for_backward(probs.chunk(size, dim=-1)[rank].contiguous(), targets)
        ctx.first = rank * local_logits.shape[-1]
        return -probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).log()

    @staticmethod
    def backward(ctx, grad_loss):
        probs, targets = ctx.saved_tensors
        local = targets - ctx.first
        owned = (local >= 0) & (local < probs.shape[-1])
        grad = probs.clone()
        grad.scatter_add_(-1, local.clamp(0, probs.shape[-1] - 1).unsqueeze(-1),
                          -owned.to(grad.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None
'''

ONE_HOT_ON_EVERY_RANK = (  # the solution's backward, subtracting the one-hot on ranks that do not own the target
    "owned.unsqueeze(-1).to(probs.dtype))", "torch.ones_like(probs[..., :1]))   # forgot: only where I own it")


test_plausible_wrong_answers_score_zero_on_their_task = gs.wrong_answers_test(
    SLUG, {"task1-answer": BIAS_BEFORE_THE_SUM, "task2-answer": GATHERED_HIDDEN, "task3-answer": GATHERED_LOGITS},
    {"task1-tests": "a row-parallel layer adding its bias on every rank",
     "task2-tests": "an MLP block that all-gathers its hidden activation",
     "task3-tests": "a cross-entropy that gathers the full logits"},
    reasons=("row-parallel layer (12 -> 16 features, 2 ranks): the output on rank 0 is off",
             "exactly one all_reduce forward per block", "as large as the full logits"))

test_a_backward_that_subtracts_the_one_hot_on_every_rank_scores_zero_on_task_3 = gs.wrong_answers_test(
    SLUG, {"task3-answer": ONE_HOT_ON_EVERY_RANK}, {"task3-tests": "a one-hot subtracted on every rank"},
    reasons=("2 ranks: the logits' gradient on rank",))

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_test_helpers_accept_the_reference_on_the_shapes_they_offer():
    """Each task's check, run on the solution with the edge shapes its helpers accept: a single
    token (no leading dimensions), a leading dimension of 1, one block and three, a vocabulary
    of one entry per rank, logits large enough to overflow without the maximum."""
    nb = gs.notebook_definitions(SLUG)
    with distlab.Pool(2, backend="relay"):
        nb["check_task1"]([(12, 16, (), 1), (2, 2, (1,), 2)], nprocs=2)
        nb["check_task2"]([(8, 16, 1, (1,), 3), (8, 16, 3, (2, 2), 4)], nprocs=2)
        nb["check_task3"]([((), 64, 3.0, 5), ((1,), 2, 3.0, 6), ((4,), 64, 200.0, 7)], nprocs=2)


# -- issue 43: the grader's network counts every byte, whatever the rank's own record says ----------

test_whole_rows_all_reduced_with_the_guard_removed_score_zero_on_task_3 = gs.wrong_answers_test(
    SLUG, {"task3-answer": ("""        sums = probs.sum(dim=-1)
        dist.all_reduce(sums)
""", """        import gc
        for obj in gc.get_objects():                 # the guard's own registrations, removed
            if isinstance(obj, torch.library.Library):
                obj._destroy()
        ops = torch._ops._OpNamespace("_c10d_functional")
        totals = []
        for row in probs.reshape(-1, width):         # each token's whole row, one at a time (never the
            whole = row.new_zeros(n * width)         # full logits), through a built-in all-reduce
            whole[lo:lo + width] = row
            totals.append(ops.wait_tensor(ops.all_reduce(whole, "sum", dist.group.WORLD.group_name)).sum())
        sums = torch.stack(totals).reshape(probs.shape[:-1])
""")},
    {"task3-tests": "whole rows of the softmax all-reduced with the guard removed through gc"},
    reasons=["through the grader's network (counted there, outside the ranks)"])
