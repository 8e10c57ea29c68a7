"""The three places that name every chapter, written from the registry (:mod:`distlab.chapters`).

The chapter map in the docstring of ``src/distlab/__init__.py``, the README's chapter table
and the reading path of ``book/intro.md`` each list the chapters. They used to be kept by
hand, each a copy of the registry that drifted from it; now each is text this module writes
from the registry's entries (title, package, ``about``, ``uses``), between fixed bounds, and
``tests/chapters/test_chapters.py`` fails, naming the command that rewrites them, when the text in a
file is not what the registry gives::

    python -m distlab.grade chapter-rows            # says which places differ (exit 1 if any)
    python -m distlab.grade chapter-rows --write    # rewrites them

The bounds: in the README and ``book/intro.md``, the lines between an opening comment
(``<!-- ... chapter-rows ... -->``) and ``<!-- end of the generated chapter list -->``; in the
package's docstring, the reStructuredText table from its first ``=====`` border to its third.
Everything outside the bounds stays as its author wrote it.

The files stay plain text in git (a reader of the README on a forge sees the table), and a
new chapter's author writes its entry and its ``_toc.yml`` line, never these rows.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path

from distlab import chapters as registry

MAP = "src/distlab/__init__.py"
README = "README.md"
INTRO = "book/intro.md"
PLACES = (MAP, README, INTRO)

COMMAND = "python -m distlab.grade chapter-rows --write"
END = "<!-- end of the generated chapter list -->"
BEGIN = re.compile(r"^<!-- .*chapter-rows.*-->\n", re.M)
BORDER = re.compile(r"^=+(?: +=+)+$", re.M)
RUNTIME = "distlab.runtime"
"""What the rows name for a chapter with no package of its own (the first steps use the runtime)."""
WIDTH = 110
"""The longest line of the reading path (book/intro.md's width)."""
MAP_WIDTH = 116
"""The longest line of the chapter map, a table in the package's docstring."""
LAST_COLUMN = 45
"""The narrowest the map's last column may be (what the chapter's pages use) before the title wraps."""


def package_of(chapter: registry.Chapter) -> str:
    return chapter.package or RUNTIME


def readme_table(chapters=registry.CHAPTERS) -> str:
    rows = ["| chapter | package | what its pages and exercise use |", "|---|---|---|"]
    rows += [f"| {c.number} {c.title} | `{package_of(c)}` | {c.uses} |" for c in chapters]
    return "\n".join(rows) + "\n"


def reading_path(chapters=registry.CHAPTERS) -> str:
    """A numbered list, numbered as the chapters are (from 0), each item the chapter's title
    linking its opening page, then what it is about."""
    items = []
    for c in chapters:
        head = f"{c.number}. "
        items += textwrap.wrap(f"{head}**[{c.title}]({c.page.removeprefix('book/')}.md)**: {c.about}", WIDTH,
                               subsequent_indent=" " * len(head), break_long_words=False, break_on_hyphens=False)
    return "\n".join(items) + "\n"


def rst(markdown: str) -> str:
    """Markdown's inline code as reStructuredText's: `x` becomes ``x``."""
    return re.sub(r"`([^`]+)`", r"``\1``", markdown)


def package_map(chapters=registry.CHAPTERS) -> str:
    """The reStructuredText simple table of the package's docstring, no line over
    :data:`MAP_WIDTH`: columns as wide as their widest cell, but a long title wraps so that the
    last column keeps :data:`LAST_COLUMN` characters, and the last column wraps to what is left
    (continuation lines leave the first column empty, which is how a simple table continues a row)."""
    head = ["ch.", "topic", "package"]
    cells = [[str(c.number), c.title, f":mod:`{package_of(c)}`", rst(c.uses)] for c in chapters]
    widths = [max(len(row[i]) for row in [head, *cells]) for i in range(3)]
    widths[1] = max(len("topic"), min(widths[1], MAP_WIDTH - LAST_COLUMN - widths[0] - widths[2] - 6))
    widths.append(MAP_WIDTH - sum(widths) - 6)
    border = "  ".join("=" * w for w in widths)

    def line(row: list[str]) -> str:
        return "".join(cell.ljust(w + 2) for cell, w in zip(row, widths)).rstrip()

    lines = [border, line([*head, "what its pages and exercise use"]), border]
    for row in cells:
        wrapped = [textwrap.wrap(cell, width, break_long_words=False, break_on_hyphens=False) or [""]
                   for cell, width in zip(row, widths)]
        for i in range(max(map(len, wrapped))):
            lines.append(line([column[i] if i < len(column) else "" for column in wrapped]))
    return "\n".join([*lines, border]) + "\n"


def between_markers(text: str, body: str, where: str) -> str:
    begin = BEGIN.search(text)
    end = text.find(END + "\n", begin.end()) if begin else -1
    if end < 0:
        raise ValueError(f"{where}: no generated chapter list (a line '<!-- ... chapter-rows ... -->', "
                         f"then a line '{END}')")
    return text[:begin.end()] + "\n" + body + "\n" + text[end:]


def in_table(text: str, body: str, where: str) -> str:
    borders = list(BORDER.finditer(text))
    if len(borders) < 3:
        raise ValueError(f"{where}: no chapter map (a table of '=====' borders) in the docstring")
    return text[:borders[0].start()] + body + text[borders[2].end() + 1:]


def load(repo: Path) -> tuple:
    """The chapters of ``repo``'s registry (which may be another checkout than the one imported:
    a scratch copy that ``new-chapter`` has just given an entry)."""
    name = "_distlab_chapters_of_" + re.sub(r"\W", "_", str(Path(repo).resolve()))
    spec = importlib.util.spec_from_file_location(name, Path(repo) / "src" / "distlab" / "chapters.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module.CHAPTERS


def generated(repo: Path, chapters=registry.CHAPTERS) -> dict[str, str]:
    """``{place: the text it should have}`` for each of the three places of ``repo``."""
    repo = Path(repo)
    return {MAP: in_table((repo / MAP).read_text(), package_map(chapters), MAP),
            README: between_markers((repo / README).read_text(), readme_table(chapters), README),
            INTRO: between_markers((repo / INTRO).read_text(), reading_path(chapters), INTRO)}


def stale(repo: Path, chapters=registry.CHAPTERS) -> list[str]:
    """The places whose text differs from what the registry gives."""
    return [place for place, text in generated(repo, chapters).items() if (Path(repo) / place).read_text() != text]


def write(repo: Path, chapters=registry.CHAPTERS) -> list[str]:
    """Rewrite the places that differ; return them."""
    changed = stale(repo, chapters)
    texts = generated(repo, chapters)
    for place in changed:
        (Path(repo) / place).write_text(texts[place])
    return changed


def command(repo: Path, rewrite: bool, say) -> int:
    """``chapter-rows [--write]``."""
    try:
        chapters = load(repo)
        changed = write(repo, chapters) if rewrite else stale(repo, chapters)
    except ValueError as error:
        say(f"chapter-rows: {error}")
        return 2
    if rewrite:
        say(f"chapter-rows: rewrote {', '.join(changed)}" if changed else "chapter-rows: every place was up to date")
        return 0
    if changed:
        say(f"chapter-rows: {', '.join(changed)} differ from src/distlab/chapters.py; run {COMMAND}")
        return 1
    say("chapter-rows: the chapter map, the README's table and the reading path match src/distlab/chapters.py")
    return 0
