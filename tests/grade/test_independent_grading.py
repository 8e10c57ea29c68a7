"""Each task is graded on its own: a later task that calls an earlier one is checked with the
earlier task's reference, so one bug costs the points of its own task only.

For every chapter where a later answer calls an earlier one, the earlier answer is broken in a
plausible way and the later task's visible check is run, as the notebook defines it, on the
solution's later answer: with the references its test cell gives the grader (its first hidden
block) the check passes; without them (a student's own notebook) the same check fails, which
shows the broken earlier answer really reaches the later task. The grader's own path (answers
defined on the ranks as stand-ins) is covered by tests/grade/test_checks.py and, end to end, by
chapter 3's wrong-answers test, whose wrong Task 2 calls the broken Task 1.
"""

from __future__ import annotations

import os

import grading_support as gs
import pytest

import distlab
from distlab.grade import checks

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS\n"

# slug: (the later task's test cell, the earlier answer cell, (old, new) in its solution)
BROKEN_EARLIER_TASK = {
    "02-collectives": ("task3-tests", "task1-answer",
                       ("        chunks[recv_index] += incoming\n",
                        "        chunks[recv_index] = incoming            # keeps one term, not the sum\n")),
    "03-ddp": ("task2-tests", "task1-answer",
               ("            dist.broadcast(tensor.data, src=0)\n", "            pass  # no broadcast\n")),
    "05-tensor-parallel": ("task2-tests", "task1-answer",
                           ("        dist.all_reduce(total)    # each rank holds only its part of dL/dx\n",
                            "        pass                      # forgot: the identity backward\n")),
    "06-pipeline": ("task2-tests", "task1-answer",
                    ("            out = loss_of(out, self.targets[i]) / self.m",
                     "            out = loss_of(out, self.targets[i])")),
    "07-3d-parallelism": ("task2-tests", "task1-answer",
                          ("key = tuple(where[a] for a in AXES if a != axis)",
                           "key = tuple(where[a] for a in AXES if a == axis)")),   # groups along the wrong axis
    "08-context-parallel": ("task2-tests", "task1-answer",
                            ("    return (shares.unsqueeze(-1) * outs).sum(dim=0), lse",
                             "    return (shares.unsqueeze(-1) * outs).mean(dim=0), lse")),   # averages the blocks
}


def later_check(slug: str, with_references: bool):
    """Run the later task's visible check with the earlier answer broken; return what it raised."""
    test_id, earlier_id, (old, new) = BROKEN_EARLIER_TASK[slug]
    found = gs.grade_cells(slug)
    assert old in found[earlier_id], f"{slug}: the solution's {earlier_id} changed: update this test"
    namespace = {"__name__": f"__{slug.replace('-', '_')}_notebook__"}
    exec(compile(found["setup"], "<setup>", "exec"), namespace)  # noqa: S102 - our own notebook
    for grade_id, source in gs.solution_answers(slug).items():
        if grade_id.startswith("task"):
            source = source.replace(old, new) if grade_id == earlier_id else source
            exec(compile(source, f"<{grade_id}>", "exec"), namespace)  # noqa: S102
    for grade_id, source in found.items():   # earlier test cells' helpers (chapter 6's one_step)
        if grade_id.endswith("-tests") and grade_id < test_id:
            exec(compile(gs.definitions_only(gs.visible_part(source)), f"<{grade_id}>", "exec"), namespace)  # noqa: S102
    cell = found[test_id]
    assert cell.startswith(HIDDEN_BEGIN), f"{slug} {test_id}: the references should open the cell"
    references, rest = cell.split(HIDDEN_END, 1)
    visible = rest.split(HIDDEN_BEGIN)[0]
    assert "EARLIER_TASKS = {" in references and "given=EARLIER_TASKS" in visible
    if with_references:
        exec(compile(references + HIDDEN_END, f"<{test_id} references>", "exec"), namespace)  # noqa: S102
    try:
        exec(compile(visible, f"<{test_id}>", "exec"), namespace)  # noqa: S102
    except Exception as error:  # noqa: BLE001 - the verdict is the test's
        return error
    return None


def chosen_slugs() -> list[str]:
    """Every chapter above, or only the one ``make test-chapter CHAPTER=<slug>`` names
    (DISTLAB_TEST_CHAPTER): the Makefile runs this file only for a chapter it lists."""
    chosen = os.environ.get("DISTLAB_TEST_CHAPTER")
    return [slug for slug in sorted(BROKEN_EARLIER_TASK) if chosen in (None, slug)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("slug", chosen_slugs())
def test_a_broken_earlier_task_costs_nothing_in_the_later_one(slug):
    # Both checks on the same warm ranks, as in a notebook: two ranks on the grader's relay, where
    # each chapter's setup cell runs its visible checks (network="relay"); a gloo pool served none.
    with distlab.Pool(2, backend="relay") as pool:
        graded = later_check(slug, with_references=True)
        assert graded is None, f"{slug}: the later task failed with the references: {graded}"
        own = later_check(slug, with_references=False)
        assert pool.calls >= 2, f"{slug}: the checks started ranks of their own instead of the warm ones"
    assert isinstance(own, checks.CheckFailed), (
        f"{slug}: with the broken earlier answer and no references the later check should fail, got {own!r}")
