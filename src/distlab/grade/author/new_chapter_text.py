"""The files ``python -m distlab.grade new-chapter`` writes, as templates (:mod:`distlab.grade.author.new_chapter`).

``$slug``, ``$title``, ``$about`` (the chapter's description, without MyST roles), ``$number``
(no leading zero), ``$nn``, ``$package``, ``$short`` (the package's folder), ``$chapter_url``
(its published page) are filled in; in the concept questions also ``$label`` (``a``, ``b``),
``$heading``, and for the multiple-choice one ``$right``, ``$options`` and ``$revisit``.

The sample is deliberately small: one reference function that adds up the squares of every
rank's tensor with one all-reduce, one task that asks for it, and two concept questions about
it, one of each kind (``--questions`` keeps one kind only): a numeric one on what it adds up
and a multiple-choice one on why it adds before it communicates. It follows every convention
the tests check, so a chapter starts green and stays green while its author replaces the
sample with the chapter's own content.
"""

PAGE = '''---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

($slug-chapter)=
# $title

<!-- Made by `python -m distlab.grade new-chapter`: replace the sample below with the
chapter's pages (learning objectives, "what this costs at scale", summary, further reading). -->

:::{admonition} Learning objectives
:class: tip
After this chapter you can

- add up a value that every {term}`rank` holds a part of, with one {term}`all-reduce`.
:::

Every figure comes from code run while the book is built. Here each of 2 ranks holds its
own numbers, and the chapter's reference code, `$package.reference`, adds up their squares:

```{code-cell} ipython3
import torch
import torch.distributed as dist

import distlab
from $package import reference


def squares_on_each_rank():
    mine = torch.arange(3.0) + 3 * dist.get_rank()
    return reference.sum_of_squares(mine).item()


distlab.run(squares_on_each_rank, nprocs=2)
```

**The exercise:** {doc}`/notebooks/$slug/$slug`. Its page has a download button and, where a
course has set up its hub, a launch button that opens the notebook there
({doc}`/book/getting-started/how-to-use` explains both).
'''

PACKAGE_INIT = '''"""Chapter $number ($title): $about

The reference code the chapter's pages and its exercise use (the sample, for now):

* :func:`$package.reference.sum_of_squares`: the sum over all ranks of every element squared,
  with one all-reduce of one number.

Made by ``python -m distlab.grade new-chapter`` as a start: replace the sample with the
chapter's reference code, one idea per module, readable (students read this package), and
keep the chapter's entry in :mod:`distlab.chapters` up to date (its ``uses`` names what the
chapter map and the README's table show of this package; then
``python -m distlab.grade chapter-rows --write``).
"""
'''

REFERENCE = '''"""The sum of squares over all ranks: each rank adds up its own part, one all-reduce adds the parts.

The sample reference of chapter $number ($title), made by ``python -m distlab.grade
new-chapter``: the book's page calls it, and the exercise's Task 1 asks students to write it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def sum_of_squares(t: torch.Tensor, group=None) -> torch.Tensor:
    """On every rank of ``group``: the sum over its ranks of ``t``'s squared elements, a 0-d
    tensor of ``t``'s dtype. Each rank adds its own squares in float64 (one number, whatever
    the size of ``t``), and one all-reduce adds the ranks' numbers."""
    mine = t.to(torch.float64).square().sum()
    dist.all_reduce(mine, group=group)
    return mine.to(t.dtype)
'''

TESTS = '''"""Chapter $number's exercise ($title), as ``python -m distlab.grade new-chapter`` made it:
graded on 2 and 4 ranks with the grading seed, its package forbidden, the reference right,
and a plausible wrong answer loses its own task and nothing else."""

from __future__ import annotations

import grading_support as gs
import torch
import torch.distributed as dist

import distlab
from distlab import chapters

SLUG = "$slug"


def test_each_task_is_graded_on_2_and_4_ranks_with_the_grading_seed():
    gs.assert_tasks_graded_on_2_and_4_ranks(SLUG, tasks=("task1-tests",))


def test_the_exercise_forbids_the_chapters_reference_package():
    assert chapters.by_slug(SLUG).package in gs.forbidden_list(SLUG)


def squares_of_my_values(values):
    from $package import reference

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
'''

INTRO = '''
# Exercise $number — $title

**Read first.** This exercise follows [chapter $number]($chapter_url).

**Learning objectives.** After this exercise you can

* add up a value that every rank holds a part of, with one all-reduce, and say what the result adds up.
'''

SETUP = '''
import torch
import torch.distributed as dist

import distlab
from distlab.grade import checks, exercise

# Switched off while your functions run (see "Rules" above).
FORBIDDEN = ("$package",)


def on_ranks(fn, yours, cases, nprocs, given=None):
    """fn(*yours, *case) for every case, all in one launch of nprocs ranks: results[case][rank].

    `yours` are your functions, passed along explicitly (the grader runs them apart from the test code)."""
    return exercise.on_ranks(fn, yours, cases, nprocs, forbidden=FORBIDDEN, given=given)
'''

TASK1_TEXT = '''
## Task 1 — the sum of squares over all ranks (2 points)

*Read:* [$title]($chapter_url).

Every rank holds its own tensor `t` (any shape; float32 or float64). Write `sum_of_squares(t)`
that returns, **on every rank**, the sum of the squares of all elements of all ranks' tensors:
a 0-dimensional tensor of `t`'s dtype.
'''

TASK1_ANSWER = '''
def sum_of_squares(t):
    """On every rank: the sum over all ranks of t's squared elements (a 0-d tensor of t's dtype)."""
    ### BEGIN SOLUTION
    total = (t.double() ** 2).sum()
    dist.all_reduce(total)
    return total.to(t.dtype)
    ### END SOLUTION
'''

TASK1_TESTS = '''
# Task 1 tests on 2 ranks: a few numbers per rank, then a matrix and an empty tensor.
def squares_here(sum_of_squares, per_rank):
    """On each rank: your function on this rank's tensor."""
    return sum_of_squares(per_rank[dist.get_rank()])


def check_task1(cases, nprocs):
    """Each case is one tensor per rank; every rank must return the sum of all their squares."""
    results = on_ranks(squares_here, (sum_of_squares,), [(case,) for case in cases], nprocs)
    with checks.Failures() as failures:   # every failing case is reported
        for index, (case, outputs) in enumerate(zip(cases, results)):
            expected = sum((x.double() ** 2).sum() for x in case).to(case[0].dtype)
            with failures.check():
                for rank, out in enumerate(outputs):
                    checks.assert_tensor_close(out, expected, name=f"case {index}: rank {rank}'s result")

check_task1([[torch.tensor([1.0, 2.0]), torch.tensor([3.0])], [torch.ones(2, 3), torch.zeros(0)]], nprocs=2)
print("task 1: visible tests passed")
### BEGIN HIDDEN TESTS
s = checks.grading_seed()
g = torch.Generator().manual_seed(s)
check_task1([[torch.randn(1000, generator=g) for _ in range(4)],
             [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(4)]], nprocs=4)
### END HIDDEN TESTS
'''

CONCEPTS_HEAD = '''
## $heading

*Read:* [$title]($chapter_url).
'''

NUMBER_TEXT = '''
**($label)** `sum_of_squares` runs on 6 ranks, each holding a tensor of 250 elements. How many
squared elements does the number it returns add up? Store the number in `squares_added`.
'''

NUMBER_PROMPT = "# ($label) squares_added = <how many squared elements the result adds up>"
NUMBER_SOLUTION = "squares_added = 6 * 250"

NUMBER_TESTS = '''
assert isinstance(squares_added, (int, float)), "squares_added should be a number"
print("($label) is a number")
### BEGIN HIDDEN TESTS
from distlab.grade.checks import check_number

ranks, elements_per_rank = 6, 250
check_number("squares_added", squares_added, ranks * elements_per_rank, 1e-9,
             "Every rank adds up the squares of all its own elements, and the all-reduce adds the "
             "ranks' sums: every element of every rank is in the result (index.md).")
### END HIDDEN TESTS
'''

CHOICE_TEXT = '''
**($label)** `sum_of_squares` adds up its own squares on each rank before its one all-reduce,
instead of all-reducing the squared tensor and adding up its elements afterwards. Why? Store
the letter in `why_add_first`.

$options
'''

CHOICE_RIGHT = "each rank then sends one number, whatever the size of its tensor, not the whole tensor."
CHOICE_WRONG = {
    "all-reducing the squared tensors would give another total, since squares do not add up across ranks.":
        "Adding the ranks' squared tensors element by element, then their elements, gives the same total: "
        "a sum does not depend on where its terms are added (index.md).",
    "an all-reduce only adds 0-dimensional tensors, so each tensor is made one number first.":
        "An all-reduce adds tensors of any shape element by element; what the order changes is how many "
        "bytes it moves (index.md).",
    "the squares are taken in float64, and an all-reduce does not send float64 tensors.":
        "An all-reduce sends every dtype its backend supports, float64 included; the float64 is there "
        "for the rounding of a long sum (index.md)."}
"""The multiple-choice question's options: the right one (never the longest) and each wrong
one with the hint its feedback gives. ``new-chapter`` puts the right one on the letter that is
right least often across the chapters (:func:`distlab.grade.author.authoring.letter_counts`)."""

CHOICE_PROMPT = '# ($label) why_add_first = <"a", "b", "c" or "d">'
CHOICE_SOLUTION = 'why_add_first = "$right"'

CHOICE_TESTS = '''
assert why_add_first in ("a", "b", "c", "d"), 'why_add_first should be "a", "b", "c" or "d"'
print("($label) is well-formed")
### BEGIN HIDDEN TESTS
from distlab.grade.checks import check_choice

elements, bytes_per_number = 1000, 8          # one rank's tensor, in float64
sent_adding_first, sent_squared_tensor = bytes_per_number, elements * bytes_per_number
correct = "$right" if sent_adding_first < sent_squared_tensor else "?"
check_choice("why_add_first", why_add_first, correct, $revisit)
### END HIDDEN TESTS
'''

OUTRO = '''
## Where this goes next

The sum of squares over all ranks is the squared norm of a tensor that no rank holds whole:
the gradient clipping of every sharded training run computes it this way.
'''
