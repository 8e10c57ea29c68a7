"""Chapter 8's exercise (Context parallelism), as ``python -m distlab.grade new-chapter`` made it:
graded on 2 and 4 ranks with the grading seed, its package forbidden, the reference right,
and a plausible wrong answer loses its own task and nothing else."""

from __future__ import annotations

import grading_support as gs
import torch
import torch.distributed as dist

import distlab
from distlab import chapters

SLUG = "08-context-parallel"


def test_each_task_is_graded_on_2_and_4_ranks_with_the_grading_seed():
    gs.assert_tasks_graded_on_2_and_4_ranks(SLUG, tasks=("task1-tests",))


def test_the_exercise_forbids_the_chapters_reference_package():
    assert chapters.by_slug(SLUG).package in gs.forbidden_list(SLUG)


def squares_of_my_values(values):
    from distlab.context_parallel import reference

    return reference.sum_of_squares(values[dist.get_rank()])


def test_the_reference_adds_every_ranks_squares():
    values = [torch.arange(3.0), torch.arange(4.0) * 2]
    expected = sum((v.double() ** 2).sum() for v in values).float()
    for out in distlab.run(squares_of_my_values, values, nprocs=2, timeout=60):
        assert torch.equal(out, expected)


ONLY_MY_SHARE = """
def sum_of_squares(t):
    return (t.double() ** 2).sum().to(t.dtype)   # this rank's squares only: no all-reduce
"""

test_a_sum_over_one_rank_only_loses_its_task = gs.wrong_answers_test(
    SLUG, {"task1-answer": ONLY_MY_SHARE}, {"task1-tests": "the sum of this rank's squares only"})
