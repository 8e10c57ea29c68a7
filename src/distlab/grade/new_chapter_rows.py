"""The rows ``python -m distlab.grade new-chapter`` adds for a new chapter to the three places
that name every chapter in prose: the chapter map in the docstring of :mod:`distlab`, the
README's chapter table, and the reading path of ``book/intro.md``.

Each row is derived from the chapter's registry entry (number, title, package, graded
references, opening page) and, for the reading path, from the first line of its package's
docstring. It goes after the last chapter's row, in the format and alignment of the rows
already there; the chapter's author refines its wording later (tests/test_chapters.py checks
that every chapter has its row, not what the row says). :func:`rows` works out all three
before anything is written, and refuses (ValueError) when it cannot find where a row goes.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

MAP = "src/distlab/__init__.py"
README = "README.md"
INTRO = "book/intro.md"
PATH_HEADING = "## The path through the book"
BORDER = re.compile(r"^=+(?: +=+)+$")


def registered(registry: str) -> list[dict]:
    """The entries of a ``chapters.py`` (its text), in order: slug, title, package, graded, page."""
    fields = ("slug", "title", "package", "graded", "page")
    entries = []
    for node in ast.walk(ast.parse(registry)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Chapter":
            entry = dict(zip(fields, (ast.literal_eval(arg) for arg in node.args)))
            entry.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in fields})
            entries.append(entry)
    return entries


def topic(title: str) -> str:
    """The title as the map and the README say it: "Data loading" is "data loading", "ZeRO and FSDP" stays."""
    first = title.split(" ", 1)[0]
    return title[:1].lower() + title[1:] if first[1:] == first[1:].lower() else title


def description(docstring: str, number: int, title: str) -> str:
    """What the chapter is about, from the first line of its package's docstring, without a
    leading "Chapter N:", "Chapter N (Title):" or "Title (chapter N):"."""
    line = docstring.strip().splitlines()[0].strip()
    prefix = rf"^(?:chapter {number}\b\s*(?:\([^)]*\))?|{re.escape(title)}\s*(?:\(chapter {number}\))?)\s*[:,]\s*"
    rest = re.sub(prefix, "", line, count=1, flags=re.I) or line
    return rest if rest.endswith(".") else rest + "."


def uses(package: str, graded) -> list[tuple[str, list[str]]]:
    """The graded references by module, relative to the package: [("reference", ["sum_of_squares"])]."""
    modules: dict[str, list[str]] = {}
    for reference in graded:
        module, _, name = reference.partition(":")
        modules.setdefault(module.removeprefix(package).lstrip(".") or package, []).append(name)
    return list(modules.items())


def map_row(text: str, last: int, number: int, title: str, package: str, graded) -> str:
    """The docstring of distlab/__init__.py with the chapter's row after chapter ``last``'s."""
    lines = text.splitlines(keepends=True)
    border = next((line.rstrip("\n") for line in lines if BORDER.match(line.rstrip("\n"))), None)
    at = next((i for i, line in enumerate(lines) if re.match(rf"^{last} {{2,}}\S", line)), None)
    if border is None or at is None:
        raise ValueError(f"{MAP}: no chapter map with a row for chapter {last} (a table of '=====' borders, "
                         f"rows starting '{last}  '): cannot place chapter {number}'s row")
    starts = [m.start() for m in re.finditer("=+", border)]
    width = len(border) - starts[-1]
    cells = [str(number), topic(title), f":mod:`{package}`"]
    head = ""
    for cell, start in zip(cells, starts[1:]):
        head += cell + " " * max(2, start - len(head) - len(cell))
    used = ", ".join(f"``{module}.{name}``" for module, names in uses(package, graded) for name in names)
    body = textwrap.wrap(used or "the chapter's reference code", width, break_long_words=False,
                         break_on_hyphens=False)
    row = [head + body[0]] + [" " * starts[-1] + piece for piece in body[1:]]
    end = at + 1
    while end < len(lines) and lines[end].startswith(" ") and lines[end].strip():
        end += 1
    return "".join(lines[:end] + [line.rstrip() + "\n" for line in row] + lines[end:])


def readme_row(text: str, last: int, number: int, title: str, package: str, graded) -> str:
    """The README with the chapter's row in its chapter table, after chapter ``last``'s."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith(f"| {last} ")), None)
    if at is None:
        raise ValueError(f"{README}: no row '| {last} ...' in the chapter table: cannot place chapter {number}'s row")
    used = ", ".join(f"`{module}` ({', '.join(f'`{n}`' for n in names)})" for module, names in uses(package, graded))
    row = f"| {number} {topic(title)} | `{package}` | {used or 'its reference code'} |\n"
    return "".join(lines[:at + 1] + [row] + lines[at + 1:])


def intro_item(text: str, last_page: str, number: int, title: str, page: str, about: str) -> str:
    """book/intro.md with the chapter's item in the reading path, after the item that links
    ``last_page`` (the last chapter's opening page); the items below it are renumbered."""
    lines = text.splitlines(keepends=True)
    head = next((i for i, line in enumerate(lines) if line.rstrip("\n") == PATH_HEADING), None)
    link = "](" + last_page.removeprefix("book/") + ".md)"
    at = None
    if head is not None:
        end = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        items = [i for i in range(head + 1, end) if re.match(r"^\d+\. ", lines[i])]
        for i in items:
            block_end = next((j for j in range(i + 1, end) if not lines[j].startswith(" ") or not lines[j].strip()),
                             end)
            if link in "".join(lines[i:block_end]):
                at = (i, block_end)
    if at is None:
        raise ValueError(f"{INTRO}: no numbered item linking {link[1:]} under '{PATH_HEADING}': "
                         f"cannot place chapter {number}'s item")
    start, block_end = at
    item = int(re.match(r"^(\d+)\.", lines[start]).group(1)) + 1
    target = page.removeprefix("book/") + ".md"
    new = textwrap.wrap(f"{item}. **[{title}]({target})**: {about}", 110, subsequent_indent=" " * (len(str(item)) + 2),
                        break_long_words=False, break_on_hyphens=False)
    after = lines[block_end:]
    for j, line in enumerate(after):   # the items after it in the same list move down by one
        if not line.strip():
            break
        after[j] = re.sub(r"^(\d+)\.", lambda m: f"{int(m.group(1)) + 1}.", line, count=1)
    return "".join(lines[:block_end] + [piece + "\n" for piece in new] + after)


def rows(repo: Path, registry: str, number: int, title: str, package: str, graded, page: str,
         package_doc: str) -> dict[Path, str]:
    """The new text of each of the three places for the new chapter, by path; refuses
    (ValueError) when one of them has no row for the last registered chapter to follow."""
    last = registered(registry)[-1]
    last_number = int(last["slug"][:2])
    about = description(package_doc, number, title)
    return {repo / MAP: map_row((repo / MAP).read_text(), last_number, number, title, package, graded),
            repo / README: readme_row((repo / README).read_text(), last_number, number, title, package, graded),
            repo / INTRO: intro_item((repo / INTRO).read_text(), last["page"], number, title, page, about)}
