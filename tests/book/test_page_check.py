"""``make page`` (distlab.grade.author.page_check) on small scratch pages, never the real book.

A page passes when its code runs and it keeps the book's rules; it fails, saying why, on a
broken glossary link, a failing cell, a warning in an output, an unlinked glossary term, a
dotted name that names nothing, and a listing of a graded task's reference.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from distlab import chapters
from distlab.collectives import all_reduce
from distlab.grade.author import page_check

REPO = Path(__file__).resolve().parents[2]
MISSING = "distlab.zero." + "no_such_thing"   # split: the dotted-name check of test_package reads this file
FRONT = ("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
         "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n")


def page(folder: Path, name: str, body: str, front: bool = True) -> Path:
    path = folder / name
    path.write_text((FRONT if front else "") + body)
    return path


def check(path: Path, cache: Path) -> list[str]:
    said = []
    problems = page_check.check(path, REPO, chapters.CHAPTERS, cache_dir=cache, say=said.append)
    assert said[0].startswith(f"page {path}") and said[0].endswith("ok" if not problems else "problem(s)"), said
    return problems


GOOD = """
# A good page

Every {term}`rank` runs the cell below; the sum is what {term}`all-reduce` would give.

```{code-cell} ipython3
print("the sum is", sum(range(4)))
```
"""


@pytest.mark.timeout(600)
def test_a_good_page_passes_and_its_outputs_are_cached(tmp_path):
    good = page(tmp_path, "good.md", GOOD)
    assert check(good, tmp_path / "cache") == []
    notebook, how, error = page_check.execute(good, REPO, tmp_path / "cache")
    assert how.startswith("outputs from the cache") and error is None
    assert "the sum is 6" in notebook.cells[-1].outputs[0]["text"]


@pytest.mark.timeout(600)
def test_a_failing_cell_and_a_warning_fail_the_page(tmp_path):
    failing = page(tmp_path, "failing.md", GOOD.replace('print("the sum is", sum(range(4)))',
                                                        'raise ValueError("this cell breaks the build")'))
    problems = check(failing, tmp_path / "cache")
    assert len(problems) == 1 and "a cell failed" in problems[0] and "this cell breaks the build" in problems[0]
    warning = page(tmp_path, "warning.md", GOOD.replace('print("the sum is", sum(range(4)))',
                                                        'import warnings\nwarnings.warn("old API")'))
    problems = check(warning, tmp_path / "cache")
    assert problems and all("stderr" in p or "warning" in p for p in problems) and "old API" in problems[0]


def test_make_page_fails_on_a_broken_glossary_link_and_passes_a_page_of_prose(tmp_path):
    broken = page(tmp_path, "broken.md", "# Broken\n\nEach {term}`rnak` holds a shard.\n", front=False)
    done = subprocess.run(["make", "--no-print-directory", "page", f"PAGE={broken}"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0, done.stdout
    assert "no glossary name is spelled 'rnak'" in done.stdout and "0 of 1 page(s) passed" in done.stdout, done.stdout
    fine = page(tmp_path, "fine.md", "# Fine\n\nEach {term}`rank` holds a shard.\n", front=False)
    done = subprocess.run(["make", "--no-print-directory", "page", f"PAGE={fine}"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "1 of 1 page(s) passed" in done.stdout, done.stdout + done.stderr


def test_the_text_rules_of_the_book_are_the_page_checks():
    """Unlinked terms, names that do not exist, code cells the book would not execute, and a
    printed graded reference, each said plainly; the same page without them passes."""
    reference = textwrap.dedent(inspect.getsource(all_reduce.ring_all_reduce))
    text = ("# Rules\n\nA data-parallel step ends with an all-reduce, see `" + MISSING + "`.\n\n"
            f"```python\n{reference}```\n\n```{{code-cell}} ipython3\nprint(1)\n```\n")
    problems = page_check.text_problems(text, REPO, chapters.CHAPTERS)
    assert any("'all-reduce' used but not linked" in p for p in problems), problems
    assert any(p.startswith(MISSING + ": no such name") for p in problems), problems
    assert any("no jupytext/kernelspec front matter" in p for p in problems), problems
    from distlab.grade.author import book_checks

    shown = book_checks.near_copies([reference], [], book_checks.graded_references(chapters.CHAPTERS))
    assert shown and "02-collectives: distlab.collectives.all_reduce:ring_all_reduce" in shown[0], shown
    clean = "# Rules\n\nA data-parallel step ends with an {term}`all-reduce`, see `distlab.zero.theory`.\n"
    assert page_check.text_problems(clean, REPO, chapters.CHAPTERS) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_book_build_takes_a_page_run_by_make_page_from_the_cache(tmp_path):
    """A page executed by make page is not executed again by the next build: the same reader,
    the same cache, the same source-hash rule (a one-page book with the book's extension)."""
    import shutil
    import sys

    import yaml

    book = tmp_path / "book"
    shutil.copytree(REPO / "book" / "_ext", book / "book" / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    (book / "src" / "distlab").mkdir(parents=True)
    (book / "src" / "distlab" / "__init__.py").write_text("VALUE = 'first'\n")
    (book / "_config.yml").write_text(yaml.safe_dump({
        "title": "cache test", "only_build_toc_files": True,
        "execute": {"execute_notebooks": "cache", "timeout": 120},
        "sphinx": {"local_extensions": {"distlab_book": "book/_ext"}, "config": {"distlab_source_dir": "src/distlab"}}}))
    (book / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    path = page(book, "page.md", "# Page\n\n```{code-cell} ipython3\nprint('VALUE IS', 6 * 7)\n```\n")
    notebook, how, error = page_check.execute(path, book)
    assert how.startswith("executed in") and error is None, (how, error)
    built = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(book), "-W"], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600,
                           env={**os.environ, "DISTLAB_BOOK_SHARED_POOLS": ""})
    assert built.returncode == 0, built.stdout[-4000:]
    assert "Using cached notebook" in built.stdout and "Executing notebook" not in built.stdout, built.stdout[-4000:]
    assert "VALUE IS 42" in (book / "_build" / "html" / "page.html").read_text()
