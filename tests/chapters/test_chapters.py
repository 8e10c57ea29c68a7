"""The registry of chapters (src/distlab/chapters.py) against the disk and the places that list chapters.

Adding a chapter is one registry entry and its ``_toc.yml`` line (``python -m distlab.grade
new-chapter`` writes both): these tests fail when a chapter's folders exist without an entry,
when an entry points at nothing, and when the chapter map of ``distlab/__init__.py``, the
README's table or the reading path of ``book/intro.md`` is not the text
``python -m distlab.grade chapter-rows --write`` makes from the registry.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shutil
from pathlib import Path

import distlab
from distlab import chapters
from distlab.grade.author import book_checks, chapter_rows
from distlab.runtime import isolation

REPO = Path(__file__).resolve().parents[2]
SLUG = re.compile(r"^\d\d-[a-z0-9-]+$")
SAMPLE_PACKAGE = "distlab." + "sample"   # a chapter that does not exist (split: the dotted-name check reads this file)


def test_every_chapter_folder_on_disk_is_registered_and_every_entry_is_on_disk():
    registered = {c.slug for c in chapters.CHAPTERS}
    assert len(registered) == len(chapters.CHAPTERS), "two entries with one slug"
    numbers = [c.number for c in chapters.CHAPTERS]
    assert numbers == sorted(set(numbers)), f"chapter numbers repeat or are out of order: {numbers}"
    solutions = {p.name for p in (REPO / "solutions").iterdir() if p.is_dir()}
    pages = {p.name for p in (REPO / "book").iterdir() if p.is_dir() and SLUG.match(p.name)}
    assert solutions <= registered, f"solutions/ folders with no entry in src/distlab/chapters.py: {solutions - registered}"
    assert pages <= registered, f"book/ chapter folders with no entry in src/distlab/chapters.py: {pages - registered}"
    toc = book_checks.toc_files(REPO)
    for chapter in chapters.CHAPTERS:
        assert chapter.page in toc, f"{chapter.slug}: its page {chapter.page} is not in _toc.yml"
        notebook = REPO / "solutions" / chapter.slug / f"{chapter.slug}.ipynb"
        assert notebook.is_file() == chapter.exercise, f"{chapter.slug}: exercise={chapter.exercise}, but {notebook}"
        if chapter.exercise:
            assert (REPO / "notebooks" / chapter.slug / f"{chapter.slug}.ipynb").is_file(), (
                f"{chapter.slug}: not released (python -m distlab.grade release {chapter.slug})")


def test_every_package_imports_and_every_graded_reference_resolves():
    for chapter in chapters.CHAPTERS:
        if chapter.package:
            importlib.import_module(chapter.package)
        for reference in chapter.graded:
            module, _, name = reference.partition(":")
            assert module == chapter.package or module.startswith(chapter.package + "."), (
                f"{chapter.slug}: {reference} is not in its package {chapter.package}")
            target = getattr(importlib.import_module(module), name, None)
            assert target is not None, f"{chapter.slug}: {reference} does not exist"
            assert inspect.isfunction(target) or inspect.isclass(target), f"{reference}: not a function or class"


def test_a_chapter_with_an_exercise_and_a_package_names_the_references_of_its_graded_tasks():
    """Otherwise the book's guard (tests/book/test_book.py::test_the_book_never_prints_the_reference_of_a_graded_task)
    has nothing to look for in that chapter's pages, and a page could print the answer."""
    for chapter in chapters.CHAPTERS:
        if chapter.exercise and chapter.package:
            assert chapter.graded, f"{chapter.slug}: no graded references in src/distlab/chapters.py"
    from test_book import GRADED_REFERENCES

    assert GRADED_REFERENCES == {c.slug: list(c.graded) for c in chapters.CHAPTERS if c.graded}


def test_the_warm_ranks_preload_every_chapter_package():
    for package in chapters.packages():
        assert package in isolation.PRELOADED, f"{package} is not preloaded on warm ranks"


def test_the_three_lists_of_chapters_are_what_the_registry_gives():
    """The chapter map of distlab/__init__.py, the README's table and the reading path of
    book/intro.md are written from the registry (distlab.grade.author.chapter_rows): nobody keeps them."""
    stale = chapter_rows.stale(REPO)
    assert not stale, f"{stale} differ from src/distlab/chapters.py: run {chapter_rows.COMMAND}"


def test_each_list_has_a_row_per_chapter_with_its_number_title_package_and_page():
    """What the generator writes, read back from the files as a reader meets them."""
    map_rows = dict(re.findall(r"^(\d+) {2,}(.*?)$", distlab.__doc__, re.M))
    readme_rows = dict(re.findall(r"^\| (\d+) ([^|]*\|[^|]*)\|", (REPO / "README.md").read_text(), re.M))
    path = (REPO / "book" / "intro.md").read_text().split("## The path through the book", 1)[1].split("\n## ", 1)[0]
    items = dict(re.findall(r"^(\d+)\. (.*)$", path, re.M))
    for chapter in chapters.CHAPTERS:
        number, package = str(chapter.number), chapter_rows.package_of(chapter)
        assert chapter.about and chapter.uses, f"{chapter.slug}: its entry needs about= and uses="
        assert map_rows.get(number, "").startswith(chapter.title + "  ") and f":mod:`{package}`" in map_rows[number]
        assert readme_rows.get(number, "").startswith(f"{chapter.title} | `{package}` ")
        target = chapter.page.removeprefix("book/") + ".md"
        assert items.get(number, "").startswith(f"**[{chapter.title}]({target})**: "), (number, items)
    assert len(items) == len(map_rows) == len(readme_rows) == len(chapters.CHAPTERS)


def test_every_name_a_chapter_says_it_uses_exists():
    """``uses`` names its package's modules and what is in them, in backquotes: each resolves,
    as ``package.name``, as a dotted name of its own, or inside a name it follows (``overlap``
    (``OverlappedDDP``, ``no_sync``): the class in the module, the method in the class)."""
    from test_package import resolves

    for chapter in chapters.CHAPTERS:
        package, found = chapter_rows.package_of(chapter), []
        for name in re.findall(r"`([^`]+)`", chapter.uses):
            if name.startswith("%"):
                continue
            places = [f"{package}.{name}", name, *(f"{earlier}.{name}" for earlier in reversed(found))]
            resolved = [place for place in places if resolves(place)]
            assert resolved, f"{chapter.slug}: uses `{name}`, which is none of {places}"
            found.append(resolved[0])


def copy_of_the_places(target: Path) -> Path:
    for name in (*chapter_rows.PLACES, "src/distlab/chapters.py"):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    return target


def test_a_new_entry_changes_the_generated_rows_and_nothing_else(tmp_path):
    repo = copy_of_the_places(tmp_path)
    before = {name: (repo / name).read_text() for name in chapter_rows.PLACES}
    number = chapters.CHAPTERS[-1].number + 1   # after the last chapter, whatever it is (a scratch clone's too)
    new = chapters.Chapter(f"{number:02d}-sample", "MoE Routing and Context Parallelism, a long title", SAMPLE_PACKAGE,
                           (SAMPLE_PACKAGE + ".reference:f",), f"book/{number:02d}-sample/index",
                           about="a sentence about the chapter.", uses="`reference` (`f`)")
    assert chapter_rows.write(repo, (*chapters.CHAPTERS, new)) == list(chapter_rows.PLACES)
    assert chapter_rows.stale(repo, (*chapters.CHAPTERS, new)) == []
    for name in chapter_rows.PLACES:
        added, removed = diff_lines(before[name], (repo / name).read_text())
        words = " ".join(" ".join(added).split())   # the map wraps a long title within its column
        assert new.title in words or all(w in words for w in new.title.split()), (name, added)
        if name != chapter_rows.MAP:   # the map's columns widen for the long title: its rows move
            assert not removed, (name, removed)
    readme = (repo / "README.md").read_text()
    assert f"| {number} {new.title} | `{SAMPLE_PACKAGE}` | `reference` (`f`) |" in readme
    assert f"{number}. **[MoE Routing and Context Parallelism, a long title]({number:02d}-sample/index.md)**: a sentence" in (
        repo / "book/intro.md").read_text()
    table = (repo / chapter_rows.MAP).read_text().split('"""')[1]
    assert all(len(line) <= chapter_rows.MAP_WIDTH for line in table.splitlines()), "a line past the docstring's width"
    header = next(line for line in table.splitlines() if line.startswith("ch. "))
    row = next(line for line in table.splitlines() if line.startswith(f"{number} "))
    assert row.index(":mod:") == header.index("package"), "the new row is not aligned with the columns"
    assert row.split("  ")[-1].strip() == "``reference`` (``f``)"
    outside = [(name, text) for name, text in before.items()]
    for name, text in outside:   # what is outside the generated bounds stays as it was
        after = (repo / name).read_text()
        assert text[:text.index("===" if name == chapter_rows.MAP else "<!--")] == after[:after.index(
            "===" if name == chapter_rows.MAP else "<!--")]


def test_the_command_says_which_place_differs_and_how_to_rewrite_it(tmp_path):
    repo = copy_of_the_places(tmp_path)
    readme = repo / "README.md"
    readme.write_text(readme.read_text().replace("| 1 Data loading |", "| 1 data loading |"))
    said = []
    assert chapter_rows.command(repo, False, said.append) == 1
    assert "README.md" in said[-1] and chapter_rows.COMMAND in said[-1], said
    assert chapter_rows.command(repo, True, said.append) == 0 and chapter_rows.stale(repo) == []
    readme.write_text(readme.read_text().replace(chapter_rows.END, "the end"))
    assert chapter_rows.command(repo, False, said.append) == 2 and "README.md: no generated chapter list" in said[-1]


def diff_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    import difflib

    added, removed = [], []
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        (added if line.startswith("+ ") else removed if line.startswith("- ") else []).append(line[2:])
    return added, removed
