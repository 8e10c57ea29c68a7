"""Sphinx extension for the distlab book: small rules that Jupyter Book 1 lacks.

1. **Executed outputs follow the package source.** jupyter-cache keys a page on its code
   cells only, so after a change in ``src/distlab`` it would keep serving outputs made by
   the old code. At every build we hash the package source; when the hash differs from the
   one recorded in the cache folder, the cache is cleared, and because the hash is also an
   ``env`` config value, Sphinx re-reads (and so re-executes) every page.

2. **Launch buttons only where a hub can open the file.** The theme puts a JupyterHub
   button on every executed page, pointing at the page's source. For MyST Markdown pages
   that source is a ``.md`` file, which a hub without jupytext opens as plain text; the
   buttons belong on the student notebooks (``.ipynb``). We remove them elsewhere.

3. (Widgets need no rule here: pages with widgets load book/_extra/distlab/widgets.js,
   which draws them from the embedded state; see _config.yml, ``nb_ipywidgets_js``.)

4. **No script twice.** Jupyter Book 1.0.4 writes one inline script twice on every page,
   which the browser reports as an error; we drop exact duplicates.

5. **Search finds a collective however it is spelled.** Prose writes "all-reduce", code
   ``all_reduce``, other texts "allreduce"; Sphinx's index splits the first into two words
   and keeps the others whole, so each spelling found a different set of pages. Every
   mention of a collective is indexed under all its spellings.

6. **Search results quote prose.** Sphinx quotes the page's whole main block, so results
   showed the page's table of contents and its code; on the search page we quote the
   article's text without them.

7. **Warm ranks for every page.** A page that starts ``distlab.Pool(nprocs=4)`` in its own
   kernel would pay a cold start (torchrun, four ranks importing torch: about 5 s on 2 cores)
   for ranks the page before it had just thrown away. The build keeps warm pools of 2 and 4
   ranks from the first page it reads to its end, and the kernels borrow them
   (:mod:`distlab.runtime.shared_pools`); before each page, ranks a page left unfit (a failed
   or hung call) are replaced. ``DISTLAB_BOOK_SHARED_POOLS=""`` turns this off (for comparing
   build times); ``"2,4"`` is the default.

8. **Kernels that start with torch imported.** Each page's kernel is forked from a template
   process that imported torch, matplotlib and distlab once (:mod:`forked_kernels`), instead
   of a new Python importing them again: about two seconds less per page.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import forked_kernels
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.search import languages as search_languages
from sphinx.search.en import SearchEnglish
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

STAMP_NAME = "distlab-source.sha256"
"""File in the jupyter-cache folder recording the source hash its outputs were made with."""


def source_hash(directory: Path) -> str:
    """SHA-256 over every file of a package directory: relative paths and contents.

    Byte-code caches are skipped: they change without the source changing.
    """
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def sync_cache_with_source(cache_dir: Path, current: str) -> bool:
    """Clear ``cache_dir`` if it was filled with another source hash; record ``current``.

    Returns True when the cache was cleared.
    """
    stamp = cache_dir / STAMP_NAME
    recorded = stamp.read_text().strip() if stamp.exists() else None
    cleared = False
    if recorded != current and cache_dir.exists():
        shutil.rmtree(cache_dir)
        cleared = True
    cache_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(current + "\n")
    return cleared


def _on_config_inited(app: Sphinx, config: Config) -> None:
    source_dir = Path(app.srcdir, config.distlab_source_dir)
    if not source_dir.is_dir():
        LOGGER.warning(f"distlab_source_dir {source_dir} is not a directory")
        return
    current = source_hash(source_dir)
    # This file's own hash too: a change in these rules must rewrite every page.
    config.distlab_source_hash = current + ":" + hashlib.sha256(
        Path(__file__).read_bytes()).hexdigest()
    cache_dir = Path(config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache")
    if not cache_dir.is_absolute():
        cache_dir = Path(app.srcdir, cache_dir)
    if sync_cache_with_source(cache_dir, current):
        LOGGER.info(f"[distlab] {source_dir} changed: cleared the execution cache {cache_dir}")


def _remove_launch_buttons_from_text_pages(app, pagename, templatename, context, doctree):
    if context.get("page_source_suffix") == ".ipynb" or "header_buttons" not in context:
        return
    context["header_buttons"] = [
        button for button in context["header_buttons"]
        if button.get("label") != "launch-buttons"
    ]


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    """Keep the first of identical ``<script>`` entries.

    Jupyter Book 1.0.4 emits the inline scripts of sphinx-thebe and sphinx-togglebutton
    twice on every page (once with filename None, once with ""), and the second
    ``const THEBE_JS_URL = ...`` is a SyntaxError in the browser console.
    """
    seen, unique = set(), []
    for script in context.get("script_files", []):
        attributes = tuple(sorted(getattr(script, "attributes", {}).items()))
        key = (getattr(script, "filename", str(script)) or "", attributes)  # None == ""
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


COLLECTIVE = re.compile(r"(?<![a-z])(all|reduce)[-_ ]?(reduce|gather|scatter|to[-_ ]?all)(?:e?s)?(?![a-z])",
                        re.IGNORECASE)
"""A collective's name in any spelling: all-reduce, all_reduce, allreduce, All-gathers, all-to-all."""


def collective_spellings(text: str) -> list[str]:
    """The index words every collective named in ``text`` should be found under.

    >>> collective_spellings("an all-reduce, then dist.all_to_all")
    ['allreduce', 'all_reduce', 'all', 'reduce', 'alltoall', 'all_to_all', 'all', 'to']
    """
    words = []
    for first, second in COLLECTIVE.findall(text):
        parts = [first.lower(), *re.split(r"[-_ ]", second.lower())]
        words += ["".join(parts), "_".join(parts), *parts[:2]]
    return words


class CollectiveSearchEnglish(SearchEnglish):
    """English search whose index knows every spelling of a collective (rule 5)."""

    def split(self, input: str) -> list[str]:
        return super().split(input) + collective_spellings(input)


SEARCH_SNIPPETS_FROM_PROSE = """
window.addEventListener("DOMContentLoaded", function () {
  if (typeof Search === "undefined") { return; }
  var sphinxText = Search.htmlToText;
  // Quote the article's prose: no table of contents, no code, no cell outputs, and
  // runs of blank space (left by the removed parts) folded into one.
  Search.htmlToText = function (htmlString, anchor) {
    var page = new DOMParser().parseFromString(htmlString, "text/html");
    page.querySelectorAll(".bd-toc, #jb-print-docs-body, .bd-header-article, .cell, div.highlight, pre, "
                          + ".headerlink, script, style").forEach(function (e) { e.remove(); });
    // Formulas are not typeset in a fetched page: show \\(N\\) as N.
    page.querySelectorAll("span.math").forEach(function (e) {
      e.textContent = e.textContent.replace(/^\\\\\\(|\\\\\\)$/g, "");
    });
    var text = sphinxText(page.documentElement.outerHTML, anchor);
    return text.replace(/\\s+/g, " ").trim();
  };
});
"""


def _quote_prose_in_search_results(app, pagename, templatename, context, doctree):
    if pagename == "search":
        app.add_js_file(None, body=SEARCH_SNIPPETS_FROM_PROSE, priority=900)


SHARED_POOL_SIZES = "DISTLAB_BOOK_SHARED_POOLS"
"""Environment variable: the pool sizes the build shares between its pages ("" for none)."""


POOL_SIZE = re.compile(r"distlab\.Pool\(\s*(?:nprocs\s*=\s*)?(\d+)")
"""A page's ``distlab.Pool(nprocs=N)``: a size it runs on warm ranks."""


def _share_warm_ranks(app: Sphinx, docname: str, source: list) -> None:
    """Before each page is read (and executed): start the shared pools once, then keep them fit.

    They start with the first page that has code to run: a build that re-reads only pages of
    prose starts no rank. A page that pools a size no pool has yet (8 ranks: the scaling page)
    starts that pool for itself and the pages after it."""
    from distlab.runtime.shared_pools import SharedPools

    pools = getattr(app, "distlab_shared_pools", None)
    if pools is None:
        if "{code-cell}" not in source[0]:
            return
        sizes = [int(n) for n in os.environ.get(SHARED_POOL_SIZES, "2,4").split(",") if n.strip()]
        template = forked_kernels.start()
        if template is not None:
            LOGGER.info("[distlab] the pages' kernels are forked from a template that imported torch")
        pools = app.distlab_shared_pools = SharedPools(sizes, parents=[template] if template else [])
        if sizes:
            pools.start()
            LOGGER.info(f"[distlab] warm pools of {', '.join(map(str, sizes))} ranks shared by the pages")
    elif pools.sizes:
        pools.refresh()
    if not pools.sizes or "{code-cell}" not in source[0]:
        return
    for nprocs in sorted({int(n) for n in POOL_SIZE.findall(source[0])} - set(pools.sizes)):
        pools.add(nprocs)
        LOGGER.info(f"[distlab] a warm pool of {nprocs} ranks shared from {docname} on")


def _stop_warm_ranks(app: Sphinx, exception) -> None:
    forked_kernels.stop()
    pools = getattr(app, "distlab_shared_pools", None)
    if pools is not None and pools.sizes:
        calls = pools.calls()
        pools.stop()
        LOGGER.info(f"[distlab] the pages ran {calls} calls on the shared warm ranks")
        if pools.restarts:
            LOGGER.info(f"[distlab] the shared ranks were replaced {pools.restarts} times (failed or hung calls)")


def setup(app: Sphinx) -> dict:
    search_languages["en"] = CollectiveSearchEnglish
    app.add_config_value("distlab_source_dir", "src/distlab", "env")
    # Changing this value makes Sphinx re-read every page (rebuild="env").
    app.add_config_value("distlab_source_hash", "", "env")
    app.connect("config-inited", _on_config_inited)
    # After the theme has added its launch buttons (priority 501).
    app.connect("html-page-context", _remove_launch_buttons_from_text_pages, priority=600)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", _quote_prose_in_search_results)
    app.connect("source-read", _share_warm_ranks)
    app.connect("build-finished", _stop_warm_ranks)
    # Pages are read one after the other: a parallel read would run two pages on the shared
    # ranks at once (a borrower that finds them taken starts its own; that works, but the
    # pages that measure would measure each other).
    return {"parallel_read_safe": False, "parallel_write_safe": True}
