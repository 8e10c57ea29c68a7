"""One book page, executed as the book build executes it and checked as the book's tests check it.

``make page PAGE=book/03-ddp/buckets.md`` (``python -m distlab.grade page PATH ...``) is the loop
of a page's author: seconds for a page of prose or one whose outputs are cached, half a minute
to a few minutes for one that trains (the cost model's page: 30 s; the first steps, which train
on 1, 2 and 4 ranks: 200 s on two loaded cores), where ``make book`` takes a quarter of an hour
and ``tests/book/test_book.py`` needs the whole built site. Unlike the build, it starts no shared warm
ranks and no forked kernels (book/_ext/distlab_book.py): the page pays its own cold starts. It

1. executes the page with the book's settings (``_config.yml``'s ``execute:``): its MyST code
   cells, read as myst-nb reads them, run in a kernel whose working folder is the page's, with
   the build's timeout per cell and no error allowed; through the build's execution cache
   (``_build/.jupyter_cache``, cleared when ``src/distlab`` changes, as
   ``book/_ext/distlab_book.py`` does), so a page whose code and package did not change is not
   run again, and a page run here is not run again by the next ``make book``;
2. checks what the book's tests check of a page (:mod:`distlab.grade.author.book_checks`): code cells
   need the jupytext front matter, every ``{term}`` link names a glossary entry as the glossary
   spells it, every glossary term of the running text is linked on the page, every dotted
   ``distlab.…`` name exists, no code block or output shows a graded solution or the reference
   of a graded task, and no output is an error, a stderr stream or a warning.

It prints each problem on a line of its own and exits 1 when there is one. ``make
test-chapter`` runs it on every page of a chapter (``--chapter SLUG``). What it does not do is
render HTML: cross-references between pages, citations and the site's look are checked by
``make book`` and ``tests/book/test_book.py``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import yaml

from distlab.grade.author import book_checks

NOISE = re.compile(r"Warning\b|warnings\.warn|USDT|deprecat|(?<![A-Za-z0-9])[WE]\d{4} \d\d:\d\d:\d\d", re.I)
"""What a reader should never see in an output: warnings, deprecations, torch's C++ log lines."""
FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1", re.M | re.S)


def settings(repo: Path) -> dict:
    """The book's execution settings, from its ``_config.yml``."""
    execute = yaml.safe_load((repo / "_config.yml").read_text()).get("execute", {})
    return {"timeout": execute.get("timeout", 30), "allow_errors": execute.get("allow_errors", False),
            "cache": repo / (execute.get("cache") or "_build/.jupyter_cache"),
            "in_temp": execute.get("run_in_temp", False)}


def read_page(path: Path):
    """The page as the notebook myst-nb makes of it (the same cells, so the same cache key)."""
    from myst_nb.core.read import read_myst_markdown_notebook

    return read_myst_markdown_notebook(path.read_text(), add_source_map=True, path=str(path))


def synced_cache(repo: Path, cache_dir: Path):
    """The build's jupyter-cache, cleared first if ``src/distlab`` changed since it was filled."""
    from jupyter_cache import get_cache

    sys.path.insert(0, str(repo / "book" / "_ext"))
    try:
        import distlab_book
    finally:
        sys.path.remove(str(repo / "book" / "_ext"))
    distlab_book.sync_cache_with_source(cache_dir, distlab_book.source_hash(repo / "src" / "distlab"))
    return get_cache(str(cache_dir))


def execute(path: Path, repo: Path, cache_dir: Path | None = None) -> tuple[object, str, str | None]:
    """(the executed notebook, "cached" or "executed in N s", the error or None)."""
    import tempfile
    from contextlib import nullcontext, suppress

    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.executors.utils import single_nb_execution

    config = settings(repo)
    notebook = read_page(path)
    cache = synced_cache(repo, Path(cache_dir or config["cache"]))
    with suppress(KeyError):
        record = cache.match_cache_notebook(notebook)
        _, merged = cache.merge_match_into_notebook(notebook)
        return merged, f"outputs from the cache (record {record.pk})", None
    with tempfile.TemporaryDirectory() if config["in_temp"] else nullcontext(str(path.parent.resolve())) as cwd:
        result = single_nb_execution(notebook, cwd=cwd, timeout=config["timeout"],
                                     allow_errors=config["allow_errors"], meta_override=True)
    if result.err is not None:
        return notebook, f"failed after {result.time:.1f} s", result.exc_string or repr(result.err)
    stage = cache.add_nb_to_project(str(path), read_data={"type": "plugin", "name": "myst_nb_md"})   # as myst-nb
    cache.cache_notebook_bundle(CacheBundleIn(notebook, stage.uri, data={"execution_seconds": result.time}),
                                check_validity=False, overwrite=True)
    return notebook, f"executed in {result.time:.1f} s", None


def listings(notebook) -> list[str]:
    """Every block of code a reader of the page sees: code cells, fenced blocks of the text,
    and what the outputs show (text, Markdown fences, HTML ``<pre>`` blocks)."""
    from distlab.grade.author import near_copy

    found = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            found.append(cell.source)
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                found += [output.get("text", ""), data.get("text/plain", "")]
                found += [m.group(2) for m in FENCE.finditer(data.get("text/markdown", ""))]
                found += near_copy.code_blocks_of_html(data.get("text/html", ""))
        elif cell.cell_type == "markdown":
            found += [m.group(2) for m in FENCE.finditer(cell.source)]
    return [block for block in found if block.strip()]


def noisy_outputs(notebook) -> list[str]:
    """Stderr streams and warnings among the outputs (the book's test of its pages; a cell that
    raised is reported by :func:`execute`, as the build stops there)."""
    found = []
    for index, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                found.append(f"code cell {index + 1}: wrote to stderr: {output.get('text', '').strip()[:200]!r}")
            else:
                text = output.get("text", "") + output.get("data", {}).get("text/plain", "")
                if match := NOISE.search(text):
                    line = text[text.rfind("\n", 0, match.start()) + 1:].split("\n", 1)[0]
                    found.append(f"code cell {index + 1}: a warning in its output: {line[:200]!r}")
    return found


def text_problems(text: str, repo: Path, chapters) -> list[str]:
    """What the page's source breaks of the book's rules (no execution needed)."""
    problems = []
    if "```{code-cell}" in text:
        front = yaml.safe_load(text.split("---", 2)[1]) if text.startswith("---") else None
        if not (isinstance(front, dict) and "jupytext" in front and "kernelspec" in front):
            problems.append("code cells but no jupytext/kernelspec front matter: the book would never execute them")
    entries = book_checks.glossary_entries(repo)
    problems += [f"glossary link {p}" for p in
                 book_checks.term_links_spelled_unlike_their_term(text, [n for e in entries for n in e])]
    problems += [f"glossary term {name!r} used but not linked on the page ({{term}}`{name}` at its first use)"
                 for name in book_checks.unlinked_terms(text, entries)]
    problems += [f"{name}: no such name in distlab" for name in book_checks.unresolved_names(text)]
    return problems


def check(path: Path, repo: Path, chapters, cache_dir: Path | None = None, say=print) -> list[str]:
    """Execute and check one page; say what happened; return its problems."""
    start = time.monotonic()
    text = path.read_text()
    problems = text_problems(text, repo, chapters)
    if "```{code-cell}" in text:
        notebook, how, error = execute(path, repo, cache_dir)
        if error:
            plain = re.sub(r"\x1b\[[0-9;]*m", "", error).strip()   # the traceback without its colours
            problems.append(f"a cell failed (the build would stop here):\n{plain[-3000:]}")
        problems += noisy_outputs(notebook)
        shown = listings(notebook)
    else:
        how, shown = "no code cells", [m.group(2) for m in FENCE.finditer(text)]
    problems += book_checks.near_copies(shown, book_checks.graded_solutions(repo), book_checks.graded_references(chapters))
    verdict = "ok" if not problems else f"{len(problems)} problem(s)"
    shown_path = path.relative_to(repo) if path.is_relative_to(repo) else path
    say(f"page {shown_path}: {how}; checked in {time.monotonic() - start:.1f} s: {verdict}")
    for problem in problems:
        say(f"  {shown_path}: {problem}")
    return problems


def chapter_pages(repo: Path, chapter) -> list[Path]:
    """The chapter's pages in ``_toc.yml``, in the toc's order: those in its opening page's folder."""
    pages = [repo / f"{f}.md" for f in book_checks.toc_files(repo) if f.rpartition("/")[0] == chapter.folder]
    return [page for page in pages if page.exists()]


def command(paths: list[str], slug: str | None, repo: Path, say) -> int:
    """``page PATH ...`` or ``page --chapter SLUG``."""
    from distlab import chapters

    pages = [Path(p).resolve() for p in paths]
    if slug:
        pages += chapter_pages(repo, chapters.by_slug(slug))
    missing = [str(p) for p in pages if not p.is_file()]
    if missing or not pages:
        say(f"page: no such page {missing}" if missing else "page: name a page (book/NN-x/page.md) or --chapter SLUG")
        return 2
    failed = [p for p in pages if check(p, repo, chapters.CHAPTERS, say=say)]
    say(f"page: {len(pages) - len(failed)} of {len(pages)} page(s) passed")
    return 1 if failed else 0
