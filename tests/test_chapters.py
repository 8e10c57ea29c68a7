"""The registry of chapters (src/distlab/chapters.py) against the disk and the hand-written places.

Adding a chapter is one registry entry (``python -m distlab.grade new-chapter`` writes it, and
the chapter's row in each of the three places below, from the entry): these tests fail when a
chapter's folders exist without an entry, when an entry points at nothing, and when the chapter
map of ``distlab/__init__.py``, the README's table or the reading path of ``book/intro.md``
leaves a registered chapter out.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import yaml

import distlab
from distlab import chapters
from distlab.runtime import isolation

REPO = Path(__file__).resolve().parent.parent
SLUG = re.compile(r"^\d\d-[a-z0-9-]+$")


def toc_files() -> set[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                yield entry["file"]
            yield from walk(entry.get("sections", []))

    return {f for part in toc["parts"] for f in walk(part["chapters"])}


def test_every_chapter_folder_on_disk_is_registered_and_every_entry_is_on_disk():
    registered = {c.slug for c in chapters.CHAPTERS}
    assert len(registered) == len(chapters.CHAPTERS), "two entries with one slug"
    numbers = [c.number for c in chapters.CHAPTERS]
    assert numbers == sorted(set(numbers)), f"chapter numbers repeat or are out of order: {numbers}"
    solutions = {p.name for p in (REPO / "solutions").iterdir() if p.is_dir()}
    pages = {p.name for p in (REPO / "book").iterdir() if p.is_dir() and SLUG.match(p.name)}
    assert solutions <= registered, f"solutions/ folders with no entry in src/distlab/chapters.py: {solutions - registered}"
    assert pages <= registered, f"book/ chapter folders with no entry in src/distlab/chapters.py: {pages - registered}"
    toc = toc_files()
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
    """Otherwise the book's guard (tests/test_book.py::test_the_book_never_prints_the_reference_of_a_graded_task)
    has nothing to look for in that chapter's pages, and a page could print the answer."""
    for chapter in chapters.CHAPTERS:
        if chapter.exercise and chapter.package:
            assert chapter.graded, f"{chapter.slug}: no graded references in src/distlab/chapters.py"
    from test_book import GRADED_REFERENCES

    assert GRADED_REFERENCES == {c.slug: list(c.graded) for c in chapters.CHAPTERS if c.graded}


def test_the_warm_ranks_preload_every_chapter_package():
    for package in chapters.packages():
        assert package in isolation.PRELOADED, f"{package} is not preloaded on warm ranks"


def test_the_chapter_map_and_the_readme_name_every_chapter():
    """Prose, checked against the registry: a row per chapter, starting with its number and
    naming its package. new-chapter writes a new chapter's row; its author refines the wording."""
    rows = {"src/distlab/__init__.py chapter map": re.findall(r"^(\d+) {2,}(.*?)$", distlab.__doc__, re.M),
            "README.md chapter table": re.findall(r"^\| (\d+) ([^|]*\|[^|]*)\|", (REPO / "README.md").read_text(), re.M)}
    for where, found in rows.items():
        by_number = {int(number): text for number, text in found}
        for chapter in chapters.CHAPTERS:
            assert chapter.number in by_number, f"the {where} has no row for chapter {chapter.number} ({chapter.slug})"
            if chapter.package:
                assert chapter.package in by_number[chapter.number], (
                    f"the {where}'s row for chapter {chapter.number} does not name {chapter.package}")


def test_the_reading_path_of_the_intro_links_every_chapter():
    """Prose too: an item per chapter linking its opening page (new-chapter writes a new chapter's)."""
    text = (REPO / "book" / "intro.md").read_text()
    path = text.split("## The path through the book", 1)[1].split("\n## ", 1)[0]
    for chapter in chapters.CHAPTERS:
        target = chapter.page.removeprefix("book/") + ".md"
        assert f"]({target})" in path, f"book/intro.md's reading path does not link {target} ({chapter.title})"
