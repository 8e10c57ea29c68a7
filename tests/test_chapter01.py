"""Chapter 1's exercise: the forbidden built-ins are closed, and plausible wrong answers lose their points.

The gates every assignment passes (release equals notebooks/, the solution scores full marks,
the blank release zero, within the time bound) are in tests/test_grading.py, parametrized
over every folder of solutions/, this one included.
"""

from __future__ import annotations

import grading_support as gs

import distlab

SLUG = "01-data-loading"


def try_the_forbidden(forbidden):
    from distlab.grade.forbid import forbid

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