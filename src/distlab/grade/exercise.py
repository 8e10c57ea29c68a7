"""What every exercise notebook's setup cell shares: the per-case runner, the forbidden lists,
and the "Rules / How this notebook is graded / Tolerances" text of its introduction.

A notebook's setup cell imports these instead of carrying a copy of them::

    from distlab.grade import checks, exercise

    FORBIDDEN = ("distlab.collectives",)          # also in the notebook's metadata

    def on_ranks(fn, yours, cases, nprocs, given=None):
        return exercise.on_ranks(fn, yours, cases, nprocs, forbidden=FORBIDDEN, given=given)

and ``python -m distlab.grade new-chapter`` writes the introduction's paragraphs with
:func:`rules_text`, :func:`grading_text` and :func:`tolerances_text`. (Chapters 3 to 7 call
:func:`on_ranks` as above; chapters 1 and 2 have runners of their own kind, one of which also
counts each case's bytes. The introductions of chapters 1 to 7 predate this module and keep
their own, chapter-specific text.)

Why a test passes the student's code as ``yours`` rather than calling it by name: the grader
runs the student's answers apart from the test code, and ships them to the ranks as stand-ins
that define the answer on first use (:mod:`distlab.grade.references`); ``given`` replaces the
earlier tasks a later answer calls by their references (the notebook's ``EARLIER_TASKS``), so a
bug costs the points of its own task only.
"""

from __future__ import annotations

from distlab.grade import checks

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "gather", "scatter")
"""Every built-in collective of ``torch.distributed``, by name: an exercise about building
collectives from point-to-point messages forbids them all (chapter 2). Put the names in the
notebook's ``FORBIDDEN`` (and metadata) as they are: the tests compare the two lists."""


def on_ranks(fn, yours, cases, nprocs: int, forbidden=(), given=None, timeout: float = 120,
             network: str | None = None) -> list[list]:
    """``fn(*yours, *case)`` for every case, all in one launch of ``nprocs`` ranks, with
    ``forbidden`` switched off: ``results[case][rank]``.

    ``yours``: the student's functions or classes, passed along explicitly (see the module's
    docstring); ``given``: ``{name: reference}`` for earlier tasks (``EARLIER_TASKS``);
    ``network="relay"``: on the grader's network, whose record of the whole launch (every case)
    the returned list carries as ``.record`` (:func:`distlab.grade.checks.run_ranks`).
    """
    per_rank = checks.run_ranks(_each_case, nprocs=nprocs, args=(fn, tuple(yours), cases, given),
                                forbidden=forbidden, timeout=timeout, network=network).results
    return checks.RankResults([[per_rank[rank][i] for rank in range(nprocs)] for i in range(len(cases))],
                              per_rank.record, per_rank.wire)


def _each_case(fn, yours, cases, given=None):
    # In the grader the student's code arrives as a stand-in that defines it on first use: do
    # that once, with the earlier tasks it calls replaced where the test gives them.
    with checks.using_references(yours, given) as yours:
        return [fn(*yours, *case) for case in cases]


def _code(names) -> str:
    return ", ".join(f"`{name}`" for name in names)


def rules_text(forbidden, allowed: str = "every `torch.distributed` call and any tensor operation") -> str:
    """The "Rules" paragraph: what is switched off while the student's code runs."""
    return (f"**Rules.** While your code runs, {_code(forbidden)} "
            f"{'is' if len(forbidden) == 1 else 'are'} switched off: using "
            f"{'it' if len(forbidden) == 1 else 'any of them'} raises *\"not allowed in this exercise\"*. "
            f"Allowed: {allowed}.")


def grading_text(ranks=(2, 4)) -> str:
    """The "How this notebook is graded" paragraph."""
    return ("**How this notebook is graded.** Write your code where it says `YOUR CODE HERE` (delete the "
            "`raise NotImplementedError()` line). The grey test cells check your work; the grader runs "
            "them again, with hidden tests, in a fresh process outside your notebook, on "
            f"{' and '.join(map(str, ranks))} ranks, and compares with the plain single-process "
            "computation (the *reference*). Everything a function needs must be defined or imported "
            "in the cells above it, and what it returns must be plain data (tensors, numbers, "
            "strings, lists, tuples, dicts).")


def tolerances_text(what: str = "values") -> str:
    """The "Tolerances" paragraph for results that only float32 rounding separates from the reference."""
    return (f"**Tolerances.** Your {what} and the reference's add the same terms in another order, so "
            "float32 rounding is the only difference they may have: they must agree within "
            f"`rtol = {checks.VALUE_RTOL:g}` plus `{checks.VALUE_ATOL_SCALE:g} × max|reference|` "
            "(`checks.VALUE_RTOL`, `checks.VALUE_ATOL_SCALE`), far above rounding and far below any "
            "real mistake (a missing rank, a sum instead of a mean).")
