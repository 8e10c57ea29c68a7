"""What a chapter's author otherwise works out by hand: ``python -m distlab.grade authoring [PAGE ...]``.

Two rules of the tests concern the whole book rather than one page, and were found by reading
every notebook and page:

* across all chapters, the right letters of the multiple-choice concept questions are spread
  (each letter right at least twice, none in more than half the questions) and some wrong
  option is longer than the right one (``tests/grade/test_grading.py``): :func:`right_answers` lists
  them, :func:`letter_counts` counts them, and ``new-chapter`` puts its sample's right option on the
  letter right least often;
* every glossary term a page's running text uses is linked somewhere on the page
  (``tests/book/test_book.py``): :func:`unlinked` lists, per page, the terms used and never linked.

The command prints both: the spread over the chapters of ``solutions/`` and the terms of the
pages named (every page of ``book/`` when none is).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from distlab.grade.author import book_checks

LETTERS = "abcd"
OPTION = re.compile(r'^\* `"([a-d])"` — (.*(?:\n  .*)*)', re.M)


def concept_cells(notebook: Path) -> dict[str, str]:
    cells = json.loads(notebook.read_text())["cells"]
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").startswith("concept")}


def right_answers(repo: Path) -> list[tuple[str, str, str, str]]:
    """(chapter, question's variable, right letter, ``"longest"``, ``"ties for the longest"`` or
    ``""``) for every multiple-choice concept question of ``solutions/``. The right letter is the one the
    solution's ``concepts-answer`` cell assigns (the instructor's own notebook, run here)."""
    found = []
    for notebook in sorted(Path(repo, "solutions").glob("*/*.ipynb")):
        cells = concept_cells(notebook)
        if "concepts-text" not in cells:
            continue
        answers: dict = {}
        exec(cells.get("concepts-answer", ""), answers)  # noqa: S102 - the instructor's solution notebook
        for question in re.split(r"\n(?=\*\*\([a-z]\)\*\*)", cells["concepts-text"]):
            variable = re.search(r"\bin\s+`(\w+)`", question)
            options = {letter: " ".join(body.split()) for letter, body in OPTION.findall(question)}
            if variable and options and answers.get(variable.group(1)) in options:
                right = answers[variable.group(1)]
                lengths = sorted(len(text) for text in options.values())
                longest = "" if len(options[right]) < lengths[-1] else (
                    "longest" if lengths.count(lengths[-1]) == 1 else "ties for the longest")
                found.append((notebook.parent.name, variable.group(1), right, longest))
    return found


def letter_counts(repo: Path) -> dict[str, int]:
    """How often each letter is the right one, over every chapter's multiple-choice questions."""
    letters = [right for _, _, right, _ in right_answers(repo)]
    return {letter: letters.count(letter) for letter in LETTERS}


def least_used_letter(repo: Path) -> str:
    counts = letter_counts(repo)
    return min(LETTERS, key=lambda letter: (counts[letter], letter))


def unlinked(repo: Path, pages: list[Path]) -> dict[Path, list[str]]:
    """``{page: glossary terms its running text uses and no link of it reaches}``."""
    entries = book_checks.glossary_entries(repo)
    return {page: book_checks.unlinked_terms(page.read_text(), entries) for page in pages}


def book_pages(repo: Path) -> list[Path]:
    return sorted(p for p in Path(repo, "book").rglob("*.md")
                  if p.name != "glossary.md" and not p.relative_to(Path(repo, "book")).parts[0].startswith("_"))


def command(repo: Path, paths: list[str], say) -> int:
    """``authoring [PAGE ...]``: print the spread of right letters and the unlinked terms."""
    answers = right_answers(repo)
    counts = letter_counts(repo)
    total = len(answers)
    say(f"right letters over {total} multiple-choice questions: "
        + ", ".join(f"{letter} {counts[letter]}" for letter in LETTERS)
        + f" (the tests want each at least 2, none over {total // 2}); "
        f"next right letter: {least_used_letter(repo)!r}")
    for chapter, variable, right, longest in answers:
        say(f"  {chapter} {variable}: {right!r}" + (f"  (the right option {longest})" if longest else ""))
    longest = sum(1 for *_, length in answers if length)
    say(f"the right option is the longest, or ties for it, in {longest} of {total} "
        "(the tests want none: some wrong option must be longer)")
    pages = [Path(p).resolve() for p in paths] or book_pages(repo)
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        say(f"authoring: no such page {missing}")
        return 2
    terms = unlinked(repo, pages)
    for page, names in terms.items():
        if names or paths:
            shown = page.relative_to(repo) if page.is_relative_to(repo) else page
            say(f"{shown}: " + (f"uses without linking {', '.join(names)}" if names else "links every glossary term it uses"))
    return 0
