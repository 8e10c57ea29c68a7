"""``python -m distlab.grade authoring``: the spread of right letters, and the unlinked glossary terms.

The spread it prints is the one tests/grade/test_grading.py holds the chapters to, counted by that
test's own reading of the notebooks; the terms it names for a page are the ones
tests/book/test_book.py would fail the page for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import test_grading

from distlab.grade.author import authoring

REPO = Path(__file__).resolve().parents[2]


def test_the_spread_is_the_one_the_grading_tests_count():
    expected = []
    for slug in test_grading.all_slugs():
        answers = test_grading.solution_concept_answers(slug)
        expected += [(slug, name, answers[name]) for name in test_grading.concept_options(slug)]
    found = authoring.right_answers(REPO)
    assert sorted((c, v, r) for c, v, r, _ in found) == sorted(expected) and len(found) >= 10
    counts = authoring.letter_counts(REPO)
    assert counts == {letter: [r for *_, r in expected].count(letter) for letter in "abcd"}
    least = authoring.least_used_letter(REPO)
    assert counts[least] == min(counts.values())


def test_it_names_the_terms_a_page_uses_without_linking_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nEvery {term}`rank` joins the all-reduce; then the pipeline bubble shrinks.\n\n"
                    "```python\nbubble = 0  # code is not prose\n```\n")
    assert authoring.unlinked(REPO, [page]) == {page: ["all-reduce", "bubble"]}   # not rank: linked
    done = subprocess.run([sys.executable, "-m", "distlab.grade", "authoring", str(page)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "right letters over" in done.stdout and "next right letter" in done.stdout
    assert f"{page}: uses without linking all-reduce, bubble\n" in done.stdout, done.stdout
