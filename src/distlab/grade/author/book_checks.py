"""What a book page is held to, as functions of its text: the glossary, dotted names, near-copies.

``tests/book/test_book.py`` runs these on every page of the book, and ``python -m distlab.grade page``
(``make page``) on one page while its author writes it:

* every ``{term}`` link names a glossary entry as the glossary spells it (Sphinx looks terms
  up ignoring case, so ``{term}`zero``` lands on ZeRO without a warning), and every glossary
  term the running text uses is linked somewhere on the page (:func:`unlinked_terms`);
* every dotted ``distlab.…`` name exists (:func:`unresolved_names`);
* the page shows neither a graded solution nor the reference of a graded task, up to renaming
  (:func:`near_copies`, with :mod:`distlab.grade.author.near_copy`'s measure and thresholds).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import textwrap
from pathlib import Path

import yaml

from distlab.grade.author import near_copy

GLOSSARY = "book/appendices/glossary.md"
GLOSSARY_VERBS = {"reduce", "overlap", "scatter", "broadcast", "gather", "barrier", "collective", "sharding", "node",
                  "backend"}
"""Terms that are also ordinary words ("reduce the cost", "an autograd node"): pages link them
by hand where they mean the glossary's sense, and :func:`unlinked_terms` leaves them out."""
_PROTECTED = re.compile(r"\{[a-z:]+\}`[^`]*`|``[^`]*``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\[[^\]]*\]\([^)]*\)|<[^>]*>")
TERM = re.compile(r"\{term\}`([^`<]*?)(?:\s*<([^>]+)>)?`")
DOTTED = re.compile(r"(?<![\w/.-])distlab(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def glossary_entries(repo: Path) -> list[list[str]]:
    """The glossary's entries, each the list of its names (a term and its aliases)."""
    body = (Path(repo) / GLOSSARY).read_text().split("```{glossary}", 1)[1].split("\n```", 1)[0]
    entries, current = [], []
    for line in body.splitlines():
        if line and not line.startswith((" ", ":")):
            current.append(line.strip())
        elif current:
            entries.append(current)
            current = []
    return entries + ([current] if current else [])


def toc_files(repo: Path) -> list[str]:
    """Every page of ``_toc.yml`` in the book's order, its root first: docnames (paths from the
    repository root, without suffix), from every depth of ``sections``."""
    toc = yaml.safe_load((Path(repo) / "_toc.yml").read_text())

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                yield entry["file"]
            yield from walk(entry.get("sections", []))

    return [toc["root"], *(f for part in toc["parts"] for f in walk(part["chapters"]))]


def prose_lines(text: str) -> list[str]:
    """The lines of running text: no code, math blocks, headings, tables, directives or definition-list terms."""
    lines, found, fence, math = text.split("\n"), [], None, False
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if fence:
            fence = None if stripped.startswith(fence) else fence
            continue
        if opening := re.match(r"(`{3,}|~{3,})", stripped):
            fence = opening.group(1)
            continue
        if stripped.startswith("$$"):
            math = math if stripped.count("$$") >= 2 and len(stripped) > 2 else not math
            continue
        if math or not stripped or stripped.startswith(("#", ":", "|", "<", "(", "---", "+")):
            continue
        if i + 1 < len(lines) and lines[i + 1].startswith(": "):
            continue
        found.append(_PROTECTED.sub(" ", line))
    return found


def name_pattern(name: str) -> str:
    """A regular expression for a glossary name as prose writes it: its first letter in either
    case (a term opens a sentence or not), the rest as the glossary spells it where that has
    capitals ("ZeRO", "DTensor": the word "zero" is not the term), in any case where it has none."""
    head = f"[{re.escape(name[0].lower())}{re.escape(name[0].upper())}]" if name[:1].isalpha() else re.escape(name[:1])
    tail = name[1:]
    return head + (re.escape(tail) if tail != tail.lower() else f"(?i:{re.escape(tail)})")


def unlinked_terms(text: str, entries: list[list[str]]) -> list[str]:
    """The glossary names the running text of a page uses while no ``{term}`` link of the page
    reaches their entry (linking a term at its first use is the book's rule)."""
    names = {name.lower(): {n.lower() for n in entry} for entry in entries for name in entry}
    spelling = {name.lower(): name for entry in entries for name in entry}
    linked = set()
    for match in TERM.finditer(text):
        linked |= names.get((match.group(2) or match.group(1)).strip().lower(), set())
    prose = "\n".join(prose_lines(text.split("\n---", 1)[1] if text.startswith("---") else text))
    return [name for name in names if len(name) >= 3 and name not in linked and name not in GLOSSARY_VERBS
            and re.search(r"(?<![\w\-/.])" + name_pattern(spelling[name]) + r"(?![\w\-])", prose)]


def same_spelling(text: str, name: str, plural: bool = False) -> bool:
    """``text`` is ``name`` letter for letter, but for the case of each word's first letter
    ("Rank" and "rank", "Distributed Checkpoint" in a title; not "zero" for "ZeRO", whose
    other letters differ) and, with ``plural``, a plural ending."""
    def key(words: str) -> list[str]:
        return [word[:1].lower() + word[1:] for word in re.split(r"(\s+|-)", " ".join(words.split()))]

    forms = [name]
    if plural:
        forms += [name + "s", name + "es"] + ([name[:-1] + "ies"] if name.endswith("y") else [])
    return any(key(text) == key(form) for form in forms)


def term_links_spelled_unlike_their_term(text: str, names: list[str]) -> list[str]:
    """The term links of ``text`` that name no glossary entry, or reach one only because Sphinx
    looks terms up ignoring case: the word "zero" lands on "ZeRO", "ddp" on "DDP". A link's
    target (the part in angle brackets, or its whole text) must be a glossary name as the
    glossary spells it, the first letter aside. A visible text that is its target's word or
    plural in another spelling fails too ("Zeros <ZeRO>"); one that is deliberately another
    phrase ("ring algorithm <ring all-reduce>") is the author's choice and passes."""
    wrong = []
    for match in TERM.finditer(text):
        shown = " ".join(match.group(1).split())
        target = " ".join((match.group(2) or match.group(1)).split())
        if not any(same_spelling(target, name) for name in names):
            near = [name for name in names if name.lower() == target.lower()]  # what Sphinx links
            wrong.append(f"{match.group(0)}: no glossary name is spelled {target!r}"
                         + (f" (the glossary has {near[0]!r}: another word)" if near else ""))
        elif (match.group(2) and same_spelling(shown.lower(), target.lower(), plural=True)
              and not same_spelling(shown, target, plural=True)):
            wrong.append(f"{match.group(0)}: {shown!r} is {target!r} in another spelling")
    return wrong


def resolves(dotted: str) -> bool:
    """Does a dotted name (``distlab.zero.theory``, ``distlab.run``) name a module, or an attribute of one?"""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unresolved_names(text: str) -> list[str]:
    """The dotted ``distlab.…`` names of ``text`` that name nothing (file names aside)."""
    found = dict.fromkeys(DOTTED.findall(text))
    return [name for name in found if not name.endswith((".toml", ".py")) and not resolves(name)]


def graded_solutions(repo: Path) -> list[tuple[str, str, list[str]]]:
    """(chapter, answer grade id, normalised tokens of its solution lines) for every graded
    answer cell of ``solutions/``: the code a page must not show."""
    found = []
    for path in sorted((Path(repo) / "solutions").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            source = "".join(cell["source"])
            if meta.get("solution") and "BEGIN SOLUTION" in source:
                found.append((path.parent.name, meta["grade_id"],
                              near_copy.normalised_tokens(source, solution_lines(source))))
    return found


def solution_lines(source: str) -> set[int]:
    """The 1-based line numbers between nbgrader's BEGIN/END SOLUTION markers."""
    inside, lines = False, set()
    for number, line in enumerate(source.split("\n"), start=1):
        if "BEGIN SOLUTION" in line:
            inside = True
        elif "END SOLUTION" in line:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def graded_references(chapters) -> list[tuple[str, list[str]]]:
    """(label, normalised tokens) of the reference of every graded task, a class also method by
    method (a page may print it in pieces); one-line wrappers are left out, as in the book's test."""
    found = []
    for chapter in chapters:
        for reference in chapter.graded:
            module, name = reference.split(":")
            target = getattr(importlib.import_module(module), name)
            parts = {reference: target}
            if inspect.isclass(target):
                parts |= {f"{reference}.{n}": f for n, f in vars(target).items() if inspect.isfunction(f)}
            for label, part in parts.items():
                tokens = near_copy.normalised_tokens(textwrap.dedent(inspect.getsource(part)))
                if len(tokens) >= 4 * near_copy.MIN_RUN:
                    found.append((f"{chapter.slug}: {label}", tokens))
    return found


def near_copies(listings: list[str], solutions, references) -> list[str]:
    """What of ``solutions`` and ``references`` (as made above) the code blocks ``listings`` of
    one page show, at :data:`near_copy.NEAR_COPY` or more; short solutions are not measured."""
    blocks = [tokens for tokens in map(near_copy.normalised_tokens, listings) if len(tokens) >= near_copy.MIN_RUN]
    found = []
    for chapter, grade_id, tokens in solutions:
        share = near_copy.copied_fraction(tokens, blocks) if len(tokens) >= 4 * near_copy.MIN_RUN else 0.0
        if share >= near_copy.NEAR_COPY:
            found.append(f"{share:.0%} of the graded solution {chapter} {grade_id} is in a code block of the page")
    for label, tokens in references:
        share = near_copy.copied_fraction(tokens, blocks)
        if share >= near_copy.NEAR_COPY:
            found.append(f"{share:.0%} of the graded reference {label} is printed on the page")
    return found
