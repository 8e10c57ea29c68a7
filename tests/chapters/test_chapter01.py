"""Chapter 1's exercise: the forbidden built-ins are closed, and plausible wrong answers lose their points.

The gates every assignment passes (release equals notebooks/, the solution scores full marks,
the blank release zero, within the time bound) are in tests/grade/test_grading.py, parametrized
over every folder of solutions/, this one included.
"""

from __future__ import annotations

import grading_support as gs

import distlab

SLUG = "01-data-loading"


def try_the_forbidden(forbidden):
    from distlab.grade.boundary.forbid import forbid

    forbid(*forbidden)
    import torch.utils.data

    from distlab.data import sharding

    return gs.try_each({
        "torch.utils.data.DistributedSampler": lambda: torch.utils.data.DistributedSampler(range(10), 2, 0),
        "distlab.data.sharding": lambda: sharding.DistributedSampler(10, 2, 0),
    })


def test_the_reference_sampler_and_torchs_are_closed_on_graded_ranks():
    forbidden = gs.forbidden_list(SLUG)
    for verdicts in distlab.run(try_the_forbidden, forbidden, nprocs=2):
        assert verdicts == {"torch.utils.data.DistributedSampler": "ForbiddenError",
                            "distlab.data.sharding": "ForbiddenError"}, verdicts


def test_the_exercise_runs_on_2_and_4_ranks_with_hidden_tests():
    cells = gs.notebook_cells(gs.solution_path(SLUG))
    tests = [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(tests) >= 5 and all("BEGIN HIDDEN TESTS" in t for t in tests)
    coding = [t for t in tests if "on_ranks" in t or "step_on_ranks" in t]
    assert len(coding) >= 2 and all("n=2" in t and "n=4" in t for t in coding)


NO_PADDING = '''
def shard_indices(num_samples, epoch, seed, shuffle, drop_last, rank, world_size):
    """Forgets the padding rule: right whenever the size divides, wrong otherwise."""
    if shuffle:
        order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    else:
        order = list(range(num_samples))
    return order[rank::world_size]
'''

STRIDED_SLICES = '''
def batch_sampler_shard(num_samples, global_batch_size, epoch, seed, rank, world_size):
    """Every world_size-th index instead of a contiguous slice: disjoint, complete, but not the asked slices."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch))
    steps = num_samples // global_batch_size
    batches = order[: steps * global_batch_size].view(steps, global_batch_size)
    return [batch[rank::world_size].tolist() for batch in batches]
'''


test_a_sampler_without_padding_and_strided_slices_score_zero = gs.wrong_answers_test(
    SLUG, {"task1-answer": NO_PADDING, "task2-answer": STRIDED_SLICES},
    {"task1-tests": "a sampler without padding", "task2-tests": "strided slices"})
# -- issue 43: graded ranks talk only through the grader's relay, which records every message ----

DISPATCHED_BY_RANK_0 = '''
def shard_indices(num_samples, epoch, seed, shuffle, drop_last, rank, world_size):
    """Rank 0 alone computes the order and hands it out with a built-in broadcast (not forbidden
    here): right lists on every rank, so it passed on gloo; the task's ranks send nothing."""
    per_rank = num_samples // world_size if drop_last else -(-num_samples // world_size)
    order = torch.zeros(max(num_samples, per_rank * world_size), dtype=torch.long)
    if rank == 0:
        base = (torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)) if shuffle
                else torch.arange(num_samples)).tolist()
        while len(base) < per_rank * world_size:
            base += base[: per_rank * world_size - len(base)]
        order[: per_rank * world_size] = torch.tensor(base[: per_rank * world_size])
    dist.broadcast(order, src=0)
    return [int(i) for i in order[: per_rank * world_size][rank::world_size]]
'''

SLICES_THROUGH_TMP = '''
def batch_sampler_shard(num_samples, global_batch_size, epoch, seed, rank, world_size):
    """Rank 0 writes the global batches to a file in /tmp and the others read it (a channel the
    grader does not own): each graded rank has a /tmp of its own, so the others find nothing."""
    import os
    import time
    path = f"/tmp/batches-{num_samples}-{global_batch_size}-{epoch}-{seed}.pt"
    if rank == 0:
        order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch))
        steps = num_samples // global_batch_size
        torch.save(order[: steps * global_batch_size].view(steps, global_batch_size), path + ".part")
        os.replace(path + ".part", path)
    deadline = time.monotonic() + 5
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"rank {rank}: {path} never appeared")
        time.sleep(0.05)
    batches = torch.load(path)
    per_rank = global_batch_size // world_size
    return [batch[rank * per_rank:(rank + 1) * per_rank].tolist() for batch in batches]
'''

test_a_sampler_dispatched_by_broadcast_and_slices_through_tmp_score_zero = gs.wrong_answers_test(
    SLUG, {"task1-answer": DISPATCHED_BY_RANK_0, "task2-answer": SLICES_THROUGH_TMP},
    {"task1-tests": "a sampler rank 0 computes and broadcasts", "task2-tests": "slices handed out through /tmp"},
    reasons=("a distributed sampler needs no communication", "broadcast on ranks", "never appeared"))
