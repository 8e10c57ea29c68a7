"""The book, checked the way a reader meets it.

Fast checks (configuration, the cache-follows-source rule) run everywhere. The slow ones
build the book with ``make book`` (executed pages come from the cache when nothing
changed), serve ``_build/html`` on localhost under a sub-path, as a static host would, and
drive headless Chromium through every page: it loads without console errors or failed
requests, images and internal links resolve, the widget's embedded state renders and
reacts, launch buttons point at the student notebooks, and nothing from ``solutions/`` is
published. Screenshots of the first page of each part go to ``artifacts/book/``.
"""

from __future__ import annotations

import functools
import glob
import gzip
import html
import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

import grading_support as gs
import pytest
import yaml
from process_support import run_in_own_group

from distlab import chapters
from distlab.grade.author import book_checks, near_copy

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "_build" / "html"
SUBPATH = "/distlab-book/"
ARTIFACTS = REPO / "artifacts" / "book"
sys.path.insert(0, str(REPO / "book" / "_ext"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import distlab_book  # noqa: E402  (book/_ext/distlab_book.py)

CONFIG = yaml.safe_load((REPO / "_config.yml").read_text())
TOC = yaml.safe_load((REPO / "_toc.yml").read_text())
BUILD_TIMEOUT = 2400
"""A full build executes every page: 9 to 17 minutes on 2 cores, 22 beside a full test run
(a build beside another one and the tests, issue 36); this bounds a hang, it is no speed target."""


# --- fast checks -----------------------------------------------------------------------------

def toc_files() -> list[str]:
    """Every ``file:`` of _toc.yml (docnames, relative to the repository, no suffix), its root first."""
    return book_checks.toc_files(REPO)


def source_of(docname: str) -> Path:
    for suffix in (".md", ".ipynb"):
        if (REPO / (docname + suffix)).exists():
            return REPO / (docname + suffix)
    raise FileNotFoundError(docname)


def test_every_page_in_the_toc_exists_and_executable_pages_have_jupytext_metadata():
    for docname in toc_files():
        path = source_of(docname)
        text = path.read_text()
        assert text.strip(), f"{path} is empty"
        if path.suffix == ".md" and "```{code-cell}" in text:
            front = text.split("---", 2)[1] if text.startswith("---") else ""
            meta = yaml.safe_load(front) or {}
            assert "jupytext" in meta and "kernelspec" in meta, (
                f"{path} has code cells but no jupytext/kernelspec front matter: Sphinx would "
                "render it as a plain page and never execute it")


def test_glossary_defines_at_least_45_terms_and_pages_link_to_it():
    text = (REPO / "book" / "appendices" / "glossary.md").read_text()
    body = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    definitions = re.findall(r"(?:^[^\s:].*\n)+(?:^  \S.*\n?)+", body, re.M)
    assert len(definitions) >= 45, f"{len(definitions)} glossary entries"
    for page in ("book/intro.md", "book/getting-started/first-steps.md"):
        assert "{term}`" in (REPO / page).read_text(), f"{page} links no glossary term"


def test_glossary_has_the_terms_of_the_seeds_that_pages_use():
    """The three data-sharding strategies, MoE, ring attention, selective recomputation and
    gather are used by the pages; each has an entry (a term's first line in the glossary)."""
    text = (REPO / "book" / "appendices" / "glossary.md").read_text()
    entries = {line.strip().lower() for line in text.splitlines() if line and not line.startswith((" ", "`", "#"))}
    for term in ("iterable sharding", "batch-sampler sharding", "dispatching", "mixture of experts", "moe",
                 "ring attention", "selective recomputation", "gather"):
        assert term in entries, f"the glossary has no entry {term!r}"


def glossary_entries() -> list[list[str]]:
    return book_checks.glossary_entries(REPO)


def test_every_page_links_the_glossary_terms_it_uses():
    """A term a page uses in its running text is a link to the glossary somewhere on that page
    (tools/linking it at its first use is how pages were brought in line)."""
    entries = glossary_entries()
    unlinked = []
    for page in sorted((REPO / "book").rglob("*.md")):
        if page.name == "glossary.md" or page.relative_to(REPO / "book").parts[0].startswith("_"):
            continue
        unlinked += [f"{page.relative_to(REPO)}: {name!r}" for name in book_checks.unlinked_terms(page.read_text(), entries)]
    assert not unlinked, "terms used but never linked to the glossary:\n" + "\n".join(unlinked)


def test_term_links_are_spelled_as_the_glossary_spells_the_term():
    """Sphinx finds a ``{term}`` ignoring case, so the word "zero" became a link to ZeRO on four
    pages, and ``penalty_method = "zero"`` in the instructor's guide a link inside code. A link
    whose text is another word than its term, in any page, fails here (the sources, not the
    build: the build resolves the link without a warning)."""
    names = [name for entry in glossary_entries() for name in entry]
    wrong = []
    for page in sorted((REPO / "book").rglob("*.md")):
        for problem in book_checks.term_links_spelled_unlike_their_term(page.read_text(), names):
            wrong.append(f"{page.relative_to(REPO)}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_term_spelling_check_tells_the_word_from_the_term():
    names = ["ZeRO", "Rank", "DTensor", "Bucket", "Reshard after forward", "DDP"]
    def check(link):
        return book_checks.term_links_spelled_unlike_their_term(link, names)

    for good in ("{term}`ZeRO`", "{term}`rank`", "{term}`Rank`", "{term}`DTensors <DTensor>`",
                 "{term}`buckets <bucket>`", "{term}`resharding <reshard after forward>`", "{term}`DDP`",
                 "{term}`Reshard After\n  Forward`"):
        assert not check(good), good
    for bad in ("{term}`zero`", "{term}`Zero`", "{term}`zero <zero>`", "{term}`Zero <ZeRO>`",
                "{term}`ddp`", "{term}`dtensors <DTensor>`", "{term}`ranks`", "{term}`RANK`"):
        assert check(bad), bad


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def test_every_exercise_notebook_links_back_to_the_pages_it_rests_on():
    """A student who opens an exercise on the hub finds the way back to the book: the intro
    links every page of its chapter, and every task and concept block names the pages that
    explain it. Each link is the page's published address (``html.baseurl`` of _config.yml
    and the page's path, ``.html``): on the hub it opens the rendered page with its figures,
    where a relative ``.md`` path would open the MyST source in JupyterLab
    (scripts/link_notebooks_to_book.py writes them)."""
    base = CONFIG["html"]["baseurl"]
    assert base.startswith("https://") and base.endswith("/"), "html.baseurl: the book's published address"
    toc_pages = {f for f in toc_files() if f.startswith("book/")}
    problems = []
    for path in sorted((REPO / "notebooks").glob("*/*.ipynb")):
        slug = path.parent.name
        cells = json.loads(path.read_text())["cells"]
        linked = {}
        for cell in cells:
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
            if cell["cell_type"] != "markdown":
                continue
            links = [target for _, target in _LINK.findall("".join(cell["source"]))]
            problems += [f"{slug}/{grade_id}: {target} opens the page's source, not the published page"
                         for target in links if target.partition("#")[0].endswith(".md")]
            if not (grade_id == "intro" or grade_id.endswith("-text")):
                continue
            targets = []
            for target in links:
                address = target.partition("#")[0]
                if not (address.startswith(base) and address.endswith(".html")):
                    continue
                docname = address[len(base):-len(".html")]
                if docname not in toc_pages:
                    problems.append(f"{slug}/{grade_id}: {target} is not a page of the book")
                targets.append(docname)
            linked[grade_id] = targets
            if not targets:
                problems.append(f"{slug}/{grade_id}: links no page of the book at {base}")
        chapter = sorted(f for f in toc_pages if f.startswith(f"book/{slug}/") and not f.endswith("/index"))
        missing = set(chapter) - set(linked.get("intro", []))
        if missing:
            problems.append(f"{slug}: the intro does not link {sorted(missing)}")
    assert not problems, "\n".join(problems)


def test_notebook_links_follow_the_configured_address():
    """The rewriting script turns a source link and another copy's address into this book's."""
    sys.path.insert(0, str(REPO / "scripts"))
    import link_notebooks_to_book as relinking

    base = "https://courses.example/distlab/"
    text = ("[a](../../book/04-zero-fsdp/memory.md), [b](https://old.example/x/book/03-ddp/overlap.html#hooks), "
            "[c](https://pytorch.org/docs/stable/fsdp.html)")
    assert relinking.relink(text, base) == (
        "[a](https://courses.example/distlab/book/04-zero-fsdp/memory.html), "
        "[b](https://courses.example/distlab/book/03-ddp/overlap.html#hooks), "
        "[c](https://pytorch.org/docs/stable/fsdp.html)")
    assert relinking.published_base() == CONFIG["html"]["baseurl"]


def test_config_keeps_tools_and_solutions_out_of_the_sources():
    excluded = set(CONFIG["exclude_patterns"])
    for name in (".venv", "_build", "tests", "grader", "benchmarks", "solutions", "src"):
        assert name in excluded, f"{name} must be excluded from the Sphinx sources"
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["execute"]["execute_notebooks"] == "cache"
    assert CONFIG["execute"]["timeout"] > 0
    # myst-nb matches these against the end of the notebook's absolute path
    student_notebook = PurePosixPath(REPO.as_posix()) / "notebooks/01-x/01-x.ipynb"
    assert any(student_notebook.match(p) for p in CONFIG["execute"]["exclude_patterns"])
    page = PurePosixPath(REPO.as_posix()) / "book/getting-started/first-steps.md"
    assert not any(page.match(p) for p in CONFIG["execute"]["exclude_patterns"])
    notebooks_parts = [e["glob"] for p in TOC["parts"] for e in p["chapters"] if "glob" in e]
    assert "notebooks/*/*" in notebooks_parts


def test_widget_and_math_javascript_is_served_from_the_book_not_from_static():
    sphinx = CONFIG["sphinx"]["config"]
    widgets, mathjax = list(sphinx["nb_ipywidgets_js"]), sphinx["mathjax_path"]
    assert widgets == ["../distlab/widgets.js"], widgets   # the book's own, a few kB
    for script in widgets + [mathjax]:
        assert "://" not in script, f"{script} would be loaded from the network"
        assert script.startswith("../"), script   # relative to _static/, outside it
        local = REPO / "book" / "_extra" / script.removeprefix("../")
        assert local.is_file(), local
    assert (REPO / "book" / "_extra" / mathjax.removeprefix("../")).parent.joinpath("LICENSE.txt").is_file()
    assert (REPO / "book" / "_extra" / "distlab" / "widgets.js").stat().st_size < 20_000
    assert sphinx["html_extra_path"] == ["book/_extra"]
    # Jupyter Book 1 adds every .js under _static/ to every page: keep scripts out of it.
    assert not list(REPO.glob("_static/**/*.js")), "no JavaScript in _static/"
    assert str(CONFIG["copyright"]) != "2023"


def test_launch_buttons_are_configured_in_one_place():
    """One setting, empty until a course names its hub: no link to a host that does not exist."""
    assert CONFIG["launch_buttons"]["jupyterhub_url"] == ""
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    assert CONFIG["repository"]["branch"]
    placeholder = "jupyter.example" + ".org"    # the old default, spelled so this file does not name it
    mentions = [p for p in REPO.rglob("*") if p.suffix in (".md", ".yml", ".py", ".cfg", ".toml")
                and not {".venv", "_build", "node_modules", ".git"} & set(p.parts)
                and placeholder in p.read_text(errors="replace")]
    assert not mentions, f"a placeholder hub is named in {mentions}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_configured_hub_gets_an_nbgitpuller_launch_button_on_exercise_notebooks(tmp_path):
    """Set ``launch_buttons.jupyterhub_url`` (the one setting) and build two pages without
    executing anything: the exercise notebook links to the hub through nbgitpuller, the
    executed text page does not (a hub would open its .md as plain text)."""
    hub = "http://127.0.0.1:8000"
    config = dict(CONFIG, launch_buttons=dict(CONFIG["launch_buttons"], jupyterhub_url=hub))
    config["execute"] = dict(CONFIG["execute"], execute_notebooks="off")
    config["sphinx"] = dict(CONFIG["sphinx"], local_extensions={"distlab_book": str(REPO / "book" / "_ext")})
    notebook = "notebooks/00-first-steps/00-first-steps"
    toc = {"format": "jb-book", "root": "book/intro",
           "parts": [{"caption": "Pages", "chapters": [{"file": "book/getting-started/how-to-use"},
                                                       {"file": notebook}]}]}
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc))
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run([str(jupyter_book), "build", str(REPO), "--config", str(tmp_path / "_config.yml"),
                            "--toc", str(tmp_path / "_toc.yml"), "--path-output", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=540)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    html_dir = tmp_path / "out" / "_build" / "html"
    page = (html_dir / f"{notebook}.html").read_text()
    launch = re.findall(r'href="([^"]*git-pull[^"]*)"', page)
    assert launch, "no JupyterHub launch button on the exercise notebook"
    link = urllib.parse.urlparse(html.unescape(launch[0]))
    query = urllib.parse.parse_qs(link.query)
    assert f"{link.scheme}://{link.netloc}" == hub and link.path == "/hub/user-redirect/git-pull"
    assert query["repo"] == [CONFIG["repository"]["url"]] and query["branch"] == [CONFIG["repository"]["branch"]]
    assert query["urlpath"][0].endswith(f"{notebook}.ipynb")
    # tests/hub/test_hub.py follows hub/demo.py's launch_link in a real hub: it must be this link.
    sys.path.insert(0, str(REPO / "hub"))
    import demo

    assert html.unescape(launch[0]) == demo.launch_link(hub)
    text_page = (html_dir / "book/getting-started/how-to-use.html").read_text()
    assert not re.search(r'href="[^"]*git-pull', text_page), "launch buttons belong on the .ipynb notebooks only"


def test_source_hash_follows_every_file_of_the_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").write_text("B = 1\n")
    first = distlab_book.source_hash(package)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert distlab_book.source_hash(package) == first, "byte code must not count"
    (package / "sub" / "b.py").write_text("B = 2\n")
    second = distlab_book.source_hash(package)
    assert second != first
    (package / "sub" / "b.py").rename(package / "sub" / "c.py")
    assert distlab_book.source_hash(package) not in (first, second), "a rename counts"


def test_cache_is_cleared_only_when_the_source_hash_changes(tmp_path):
    cache = tmp_path / ".jupyter_cache"
    cache.mkdir()
    (cache / "executed.ipynb").write_text("{}")
    assert distlab_book.sync_cache_with_source(cache, "aaa") is True  # no record yet: clear
    (cache / "executed.ipynb").write_text("{}")
    assert distlab_book.sync_cache_with_source(cache, "aaa") is False
    assert (cache / "executed.ipynb").exists()
    assert distlab_book.sync_cache_with_source(cache, "bbb") is True
    assert not (cache / "executed.ipynb").exists()
    assert (cache / distlab_book.STAMP_NAME).read_text().strip() == "bbb"


# --- building ---------------------------------------------------------------------------------

def make_book() -> tuple[subprocess.CompletedProcess, float]:
    """``make book``; on a timeout (ours or pytest-timeout's) no build, kernel or rank is left behind."""
    start = time.monotonic()
    result = run_in_own_group(["make", "--no-print-directory", "book"], BUILD_TIMEOUT, cwd=REPO,
                              stderr=subprocess.STDOUT)
    return result, time.monotonic() - start


@pytest.fixture(scope="session")
def built_book() -> Path:
    """``make book`` once per session (pages whose code and package are unchanged come from
    the cache); fails the tests that need it if the build warns or fails."""
    result, seconds = make_book()
    assert result.returncode == 0, f"make book failed:\n{result.stdout[-6000:]}"
    assert "book built in" in result.stdout
    executed = [Path(p) for p in re.findall(r"^(\S+\.md): Executing notebook", result.stdout, re.M)]
    if executed:   # their kernels were forked from the template
        assert "[distlab] the pages' kernels are forked from a template" in result.stdout, result.stdout[-3000:]
    if any("distlab.Pool(" in page.read_text() for page in executed):   # they borrowed the build's warm ranks
        calls = re.search(r"\[distlab\] the pages ran (\d+) calls on the shared warm ranks", result.stdout)
        assert calls and int(calls.group(1)) > 0, result.stdout[-3000:]
        if "scaling.md: Executing notebook" in result.stdout:   # the page that pools 8 ranks first
            assert "[distlab] a warm pool of 8 ranks shared from book/03-ddp/scaling on" in result.stdout
    print(f"make book: {seconds:.0f} s")
    return SITE


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT * 2)
def test_second_build_reuses_the_execution_cache(built_book):
    result, seconds = make_book()
    assert result.returncode == 0, result.stdout[-6000:]
    why = [line for line in result.stdout.splitlines()
           if "[distlab]" in line or "updating environment" in line or "Executing" in line]
    assert "Executing notebook" not in result.stdout, (
        "an unchanged page was executed again (did someone edit src/distlab or a page during "
        "the test?):\n" + "\n".join(why))
    print(f"cached rebuild: {seconds:.0f} s")   # a measurement, not a bound: no page ran again


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cache_follows_package_source(tmp_path):
    """A page whose code is unchanged is re-executed when the package it imports changes."""
    book = tmp_path / "book"
    package = book / "pkg" / "fakepkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 'first'\n")
    (book / "_config.yml").write_text(yaml.safe_dump({
        "title": "cache test", "only_build_toc_files": True,
        "execute": {"execute_notebooks": "cache", "timeout": 120},
        "sphinx": {"local_extensions": {"distlab_book": str(REPO / "book" / "_ext")},
                   "config": {"distlab_source_dir": "pkg/fakepkg"}}}))
    (book / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    (book / "page.md").write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n"
        "kernelspec:\n  name: python3\n  display_name: Python 3\n---\n"
        "# Page\n\n```{code-cell} ipython3\nimport sys\nsys.path.insert(0, 'pkg')\n"
        "import fakepkg\nprint('VALUE IS', fakepkg.VALUE)\n```\n")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"

    def build() -> tuple[str, str]:
        result = subprocess.run([str(jupyter_book), "build", str(book), "-W"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:]
        return result.stdout, (book / "_build" / "html" / "page.html").read_text()

    log, html = build()
    assert "VALUE IS first" in html and "Executing notebook" in log
    log, html = build()
    assert "VALUE IS first" in html and "Executing notebook" not in log, "cache not reused"
    (package / "__init__.py").write_text("VALUE = 'second'\n")
    log, html = build()
    assert "VALUE IS second" in html, "the page kept outputs made with the old package source"


# --- the built site ---------------------------------------------------------------------------

def html_pages(site: Path) -> list[str]:
    """Every page of the site, as paths relative to its root."""
    skip = ("_static/", "_sources/", "_images/", "vendor/")
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.relative_to(site).as_posix().startswith(skip))


def notebook_sources() -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(REPO / "notebooks" / "*" / "*.ipynb")))


def normalized(text: str) -> str:
    return " ".join(text.split())


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def solution_blocks() -> list[str]:
    """What only the instructor's notebooks hold: the body of every solution and hidden-test
    block that the released student notebook does not also contain (whitespace-normalised)."""
    blocks = []
    for path in sorted(glob.glob(str(REPO / "solutions" / "*" / "*.ipynb"))):
        release = REPO / "notebooks" / Path(path).relative_to(REPO / "solutions")
        released = normalized(notebook_code(release)) if release.exists() else ""
        pattern = r"### BEGIN (SOLUTION|HIDDEN TESTS)(.*?)### END \1"
        for _, body in re.findall(pattern, notebook_code(Path(path)), re.S):
            body = normalized(body)
            if len(body) > 40 and body not in released:
                blocks.append(body)
    return blocks


def published_text(path: Path) -> str:
    """A published file's text as a reader could copy it (tags and escapes removed)."""
    if path.suffix == ".ipynb":
        return normalized(notebook_code(path))
    text = path.read_text(errors="replace")
    if path.suffix == ".html":
        text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return normalized(text)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_nothing_from_solutions_is_published(built_book):
    blocks = solution_blocks()
    if glob.glob(str(REPO / "solutions" / "*" / "*.ipynb")):
        assert blocks, "found no solution blocks: has the nbgrader marker syntax changed?"
    for path in built_book.rglob("*"):
        relative = path.relative_to(built_book).as_posix()
        assert "solutions" not in relative.split("/"), f"published: {relative}"
        if not path.is_file() or path.suffix not in (".html", ".ipynb", ".md", ".txt", ".py"):
            continue
        if path.suffix == ".ipynb":   # nbgrader strips the markers from every release
            assert "BEGIN SOLUTION" not in notebook_code(path), f"{relative}: solution markers"
            assert "BEGIN HIDDEN TESTS" not in notebook_code(path), f"{relative}: hidden tests"
        text = published_text(path)
        for block in blocks:
            assert block not in text, f"{relative} contains solution code: {block[:120]!r}"


# The reference code that solves each graded task: the book may call it, never print it
# (src/distlab/chapters.py; tests/chapters/test_chapters.py checks that every chapter with an exercise
# and a package names its references, so no chapter escapes the guard below).
GRADED_REFERENCES = {c.slug: list(c.graded) for c in chapters.CHAPTERS if c.graded}


@functools.lru_cache(maxsize=1)
def rendered_listings(site: Path) -> dict[str, list[list[str]]]:
    """Every code block of every book page (the student notebooks aside: their given code is
    the task's frame), as normalised tokens."""
    listings = {}
    for name in html_pages(site):
        if name.startswith("notebooks/"):
            continue
        blocks = [near_copy.normalised_tokens(b) for b in near_copy.code_blocks_of_html((site / name).read_text())]
        listings[name] = [b for b in blocks if len(b) >= near_copy.MIN_RUN]
    return listings


def best_listing(tokens: list[str], listings: dict[str, list[list[str]]]) -> tuple[float, str]:
    return max(((near_copy.copied_fraction(tokens, blocks), page) for page, blocks in listings.items()),
               default=(0.0, ""))


def test_the_near_copy_measure_sees_through_renaming_but_not_through_a_different_algorithm():
    import inspect

    from distlab.collectives import all_reduce

    listing = near_copy.normalised_tokens(textwrap.dedent(inspect.getsource(all_reduce.ring_reduce_scatter)))
    renamed = inspect.getsource(all_reduce.ring_reduce_scatter)
    for old, new in (("chunks", "pieces"), ("on_step", "callback"), ("group", "grp"), ("    ", "  ")):
        renamed = renamed.replace(old, new)
    renamed = "# my own work\n" + renamed.replace('"""', '"""Written by me. ', 1)
    assert near_copy.copied_fraction(near_copy.normalised_tokens(textwrap.dedent(renamed)), [listing]) > 0.9
    other = near_copy.normalised_tokens(textwrap.dedent(inspect.getsource(all_reduce.tree_all_reduce)))
    assert near_copy.copied_fraction(other, [listing]) < near_copy.NEAR_COPY
    html_page = '<p>x</p><pre><span class="k">def</span> f(a):\n    <span>return</span> a &lt; 2</pre>'
    assert near_copy.code_blocks_of_html(html_page) == ["def f(a):\n    return a < 2"]


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_no_graded_solution_is_a_near_copy_of_code_the_book_shows(built_book):
    listings = rendered_listings(built_book)
    assert sum(map(len, listings.values())) > 100, "found almost no code in the book: has the HTML changed?"
    solutions = gs.graded_solution_tokens()
    assert len(solutions) >= 20
    copies = []
    for chapter, grade_id, tokens in solutions:
        # One-line answers (chapter 0's my_rank and global_mean) are shorter than a few idioms:
        # any correct one looks like the book's all_reduce examples, and there is nothing to copy.
        if len(tokens) < 4 * near_copy.MIN_RUN:
            continue
        share, page = best_listing(tokens, listings)
        if share >= near_copy.NEAR_COPY:
            copies.append(f"{chapter} {grade_id}: {share:.0%} of it is in a listing of {page}")
    assert not copies, "graded solutions the book prints:\n" + "\n".join(copies)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_the_book_never_prints_the_reference_of_a_graded_task(built_book):
    # Each graded reference, a class whole and method by method (a page may print it in pieces),
    # one-line wrappers left out: the same list make page checks a page against (book_checks).
    listings = rendered_listings(built_book)
    printed = []
    for label, tokens in book_checks.graded_references(chapters.CHAPTERS):
        share, page = best_listing(tokens, listings)
        if share >= near_copy.NEAR_COPY:
            printed.append(f"{label} is {share:.0%} printed on {page}")
    assert not printed, "\n".join(printed)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_student_notebooks_are_published_unexecuted_with_a_download_button_and_no_hub_by_default(built_book):
    for source in notebook_sources():
        relative = source.relative_to(REPO).with_suffix("")
        page = built_book / relative.with_suffix(".html")
        assert page.exists(), f"{source} is not in the book (toc glob notebooks/*/*)"
        text = page.read_text()
        assert 'class="cell_output' not in text, f"{page} shows outputs: it was executed"
        assert f"_sources/{relative.as_posix()}.ipynb" in text, "no .ipynb download button"
    for name in html_pages(built_book):
        assert not re.search(r'href="[^"]*git-pull', (built_book / name).read_text()), (
            f"{name}: a launch button, although no hub is configured")


@pytest.fixture(scope="module")
def site(built_book):
    from book_browser import serve_directory

    with serve_directory(built_book, SUBPATH) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def browser():
    from book_browser import Browser

    with Browser() as chromium:
        yield chromium


def fetch(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, b"", ""


# What may scroll sideways inside itself: code blocks, cell outputs, display formulas (MathJax 3
# cannot break a formula across lines). Anything else wider than the reader's window is a bug.
SIDEWAYS_PROBE = """(() => {
  const found = {page: document.scrollingElement.scrollWidth - window.innerWidth, scrollers: []};
  for (const el of document.querySelectorAll('.bd-article *')) {
    if (el.scrollWidth <= el.clientWidth + 1) continue;
    const overflow = getComputedStyle(el).overflowX;
    if (overflow !== 'auto' && overflow !== 'scroll') continue;
    if (el.closest('pre, div.highlight, .cell_output, .output, mjx-container')) continue;
    found.scrollers.push(el.tagName.toLowerCase() + '.' + el.className.split(' ')[0]
                         + ' (' + (el.textContent || '').trim().slice(0, 40) + ')');
  }
  return found;
})()"""


COMPRESSED_ON_THE_WIRE = (".html", ".js", ".css", ".json", ".svg", ".txt", ".ttf", ".eot")


@functools.lru_cache(maxsize=None)
def transfer_size(path: Path) -> int:
    """Bytes a static host sends for ``path``: text gzip-compressed (as GitHub Pages, Netlify or
    nginx with gzip do), images and woff fonts as they are (already compressed)."""
    data = path.read_bytes()
    return len(gzip.compress(data, compresslevel=6)) if path.suffix in COMPRESSED_ON_THE_WIRE else len(data)


def page_weight(site_dir: Path, base_url: str, requests: list[str], over_the_wire: bool = True) -> int:
    """Bytes of everything a page loaded from the site (HTML, scripts, styles, images, fonts):
    as sent over the wire (see :func:`transfer_size`), or as the browser holds them."""
    prefix = urllib.parse.urlsplit(base_url).path
    files = {site_dir / urllib.parse.unquote(urllib.parse.urlsplit(url).path)[len(prefix):]
             for url in requests if url.startswith(base_url)}
    size = transfer_size if over_the_wire else (lambda path: path.stat().st_size)
    return sum(size(path) for path in files if path.is_file())


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_every_chapter_links_to_its_exercise_notebook(built_book):
    """A reader who finishes a chapter's introduction finds the exercise from there."""
    for source in notebook_sources():
        slug = source.parent.name
        page = built_book / (chapters.by_slug(slug).page + ".html")
        target = f"notebooks/{slug}/{slug}.html"
        hrefs = re.findall(r'<a [^>]*href="([^"#]*)', page.read_text())
        assert any(h.endswith(target) for h in hrefs), f"{page.name} of {slug} does not link to {target}"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_every_page_at_three_widths_loads_cleanly_fits_and_links(built_book, site, browser):
    """Each page at a desktop's, a tablet's and a phone's width: no console error or failed
    request, nothing but code, outputs and formulas wider than the window, images and internal
    links that resolve, no page over 3 MB over the wire (everything it loads), none more than
    1 MB above the median page uncompressed."""
    from book_browser import WIDTHS

    pages = html_pages(built_book)
    assert "index.html" in pages and len(pages) >= 5
    problems, links, images, weights, raw = [], set(), set(), {}, {}
    for name in pages:
        browser.resize(WIDTHS["desktop"])
        page = browser.open(site + name)
        problems += [f"{name}: {error}" for error in page.errors]
        problems += [f"{name}: loads {url} from outside the site" for url in page.requests
                     if not url.startswith((site, "data:", "blob:", "about:"))]
        weights[name] = page_weight(built_book, site, page.requests)
        raw[name] = page_weight(built_book, site, page.requests, over_the_wire=False)
        widgets = browser.evaluate("!!document.querySelector('script[type=\"application/vnd.jupyter.widget-state+json\"]')")
        if not widgets:
            problems += [f"{name}: loads the widget script {url} but has no widget" for url in page.requests
                         if urllib.parse.urlsplit(url).path.endswith("/distlab/widgets.js")]
        links |= set(browser.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)"))
        sources = browser.evaluate("[...document.images].map(i => i.currentSrc || i.src)")
        images |= {url for url in sources if not url.startswith(("blob:", "data:"))}
        # Images made in the page (a widget's blob: or data: picture) cannot be fetched again:
        # ask the browser whether they decoded.
        undecoded = browser.evaluate("[...document.images].filter(i => /^(blob|data):/.test(i.src)"
                                     " && i.complete && i.naturalWidth === 0).length")
        if undecoded:
            problems.append(f"{name}: {undecoded} in-page image(s) did not decode")
        for label, width in WIDTHS.items():
            browser.resize(width)
            sideways = browser.evaluate(SIDEWAYS_PROBE)
            if sideways["page"] > 0:
                problems.append(f"{name} at {width} px ({label}): the page scrolls sideways by {sideways['page']} px")
            problems += [f"{name} at {width} px ({label}): {what} scrolls sideways" for what in sideways["scrollers"]]
    origin = site[: site.index("/", len("http://"))]
    for url in sorted(links):
        if not url.startswith(origin):
            continue                                # external: not ours to check offline
        if not url.startswith(site):
            problems.append(f"link leaves the sub-path (absolute link?): {url}")
            continue
        target, _, fragment = url.partition("#")
        status, body, _ = fetch(target)
        if status != 200:
            problems.append(f"broken link ({status}): {url}")
        elif fragment and f'id="{fragment}"'.encode() not in body:
            problems.append(f"link to a missing anchor: {url}")
    for url in sorted(images):
        status, body, content_type = fetch(url)
        if status != 200 or not (content_type.startswith("image/") and body):
            problems.append(f"broken image ({status}, {content_type}): {url}")
    heaviest = sorted(weights.items(), key=lambda item: -item[1])[:3]
    print("heaviest pages (MB over the wire, uncompressed):",
          [(name, round(size / 1e6, 2), round(raw[name] / 1e6, 2)) for name, size in heaviest])
    # A widget adds its views and a 6 kB script to what a typical page loads (the theme, MathJax
    # and their fonts: about 3.7 MB uncompressed, 1.2 MB over the wire), not ipywidgets' 3.6 MB.
    typical = sorted(raw.values())[len(raw) // 2]
    problems += [f"{name} loads {(size - typical) / 1e6:.1f} MB more than a typical page (at most 1 MB)"
                 for name, size in raw.items() if size - typical > 1e6]
    problems += [f"{name} weighs {size / 1e6:.1f} MB over the wire (at most 3 MB)" for name, size in weights.items()
                 if size > 3e6]
    assert not problems, "\n".join(problems)
    outside = [(path, code) for path, code in site.requests
               if not path.startswith(SUBPATH) and path != "/favicon.ico"]
    assert not outside, f"requests outside the sub-path: {outside}"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_sidebar_and_contents_toggles_open_and_close_at_every_width(built_book, site, browser):
    """Below 992 px the navigation and the page's contents open as drawers; above, the
    navigation collapses and comes back. Screenshots of the open drawers go to the artifacts."""
    from book_browser import WIDTHS

    drawer_open = "id => document.getElementById(id).open"
    for label, width in WIDTHS.items():
        browser.resize(width)
        assert not browser.open(site + "book/02-collectives/ring-all-reduce.html").errors
        toggle = browser.page.locator(".primary-toggle:visible")
        assert toggle.count() == 1, f"{label}: {toggle.count()} visible navigation buttons"
        if width >= 992:                          # the sidebar is in the page: the button hides it
            shown = "getComputedStyle(document.getElementById('pst-primary-sidebar')).visibility"
            assert browser.evaluate(shown) == "visible"
            toggle.click()
            browser.page.wait_for_function(f"{shown} === 'hidden'", timeout=5000)
            toggle.click()
            browser.page.wait_for_function(f"{shown} === 'visible'", timeout=5000)
            continue
        for button, drawer, link in ((".primary-toggle", "pst-primary-sidebar-modal", "Data parallelism"),
                                     (".secondary-toggle", "pst-secondary-sidebar-modal", "Watching the ring")):
            browser.page.locator(f"{button}:visible").click()
            browser.page.wait_for_function(f"({drawer_open})('{drawer}')", timeout=5000)
            entry = browser.page.locator(f"#{drawer} a", has_text=link).first
            assert entry.is_visible(), f"{label}: the {drawer} drawer opened without its '{link}' link"
            browser.screenshot(ARTIFACTS / f"drawer-{drawer.split('-')[1]}-{width}px.png")
            browser.page.keyboard.press("Escape")
            browser.page.wait_for_function(f"!({drawer_open})('{drawer}')", timeout=5000)


def cell_outputs(page_html: str) -> list[tuple[str, str]]:
    """(kind, text) of every executed cell output of a page: ``stream``, ``stderr``, ``traceback``..."""
    return [(kind, html.unescape(re.sub(r"<[^>]+>", "", body))) for kind, body in re.findall(
        r'<div class="output (\w+)[^"]*"[^>]*>(.*?)</pre>', page_html, flags=re.S)]


NOISE = re.compile(r"Warning\b|warnings\.warn|USDT|deprecat|(?<![A-Za-z0-9])[WE]\d{4} \d\d:\d\d:\d\d", re.I)
"""What a reader should never see in an output: warnings, deprecations, torch's C++ log lines."""


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_executed_outputs_carry_no_warning_or_stderr_line(built_book):
    noisy = []
    for name in html_pages(built_book):
        for kind, text in cell_outputs((built_book / name).read_text()):
            if kind in ("stderr", "traceback"):
                noisy.append(f"{name}: a {kind} output: {text.strip()[:200]!r}")
            elif match := NOISE.search(text):
                line = text[text.rfind("\n", 0, match.start()) + 1:].split("\n", 1)[0]
                noisy.append(f"{name}: {line[:200]!r}")
    assert not noisy, "\n".join(noisy)


def test_noise_pattern_catches_what_reached_pages_before():
    """The lines that once reached the book are caught; ordinary output is not."""
    seen = ["[rank 0] [rank0]:W1125 08:27:51.985000 746 torch/distributed/tensor/_redistribute.py:390] While",
            "STAGE:2026-11-20 10:00:00 1234:1234 ActivityProfilerController.cpp:312] USDT: profiler_start",
            "/x.py:3: UserWarning: TypedStorage is deprecated"]
    assert all(NOISE.search(line) for line in seen)
    fine = ["[rank 1] loss 2.31 after 3 steps", "all_reduce of 64 MiB: 0.41 s, 2 ranks", "Warned students: none"]
    assert not [line for line in fine if NOISE.search(line)]


PLURAL_AFTER_ONE = re.compile(r"(?<![\d.,+\-−])1 (ranks|buckets|GPUs|nodes|stages|micro-batches|layers|chunks|"
                              r"experts|steps|calls|processes|bytes|tokens)\b")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_no_page_says_one_with_a_plural(built_book):
    """"1 buckets", "1 ranks": the text a page prints and the labels inside its widgets."""
    wrong = []
    for name in html_pages(built_book):
        text = html.unescape(re.sub(r"<[^>]+>", "", (built_book / name).read_text()))
        wrong += [f"{name}: ...{text[max(0, m.start() - 40):m.end()]!r}" for m in PLURAL_AFTER_ONE.finditer(text)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_every_figure_has_alt_text_that_says_what_it_shows(built_book):
    """A screen reader (or a reader whose images did not load) gets a sentence, not a file name."""
    missing, figures = [], 0
    for name in html_pages(built_book):
        for tag in re.findall(r"<img [^>]*>", (built_book / name).read_text()):
            if "_images/" not in tag:
                continue                             # the logo, icons
            figures += 1
            alt = html.unescape(re.search(r'alt="([^"]*)"', tag).group(1)) if 'alt="' in tag else ""
            if len(alt.split()) < 6 or "_images/" in alt or alt.endswith(".png"):
                missing.append(f"{name}: alt={alt!r}")
    assert figures >= 25, f"only {figures} figures in the book"
    assert not missing, "\n".join(missing)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_search_finds_a_collective_under_every_spelling_and_quotes_prose(built_book, site, browser):
    def search(query: str) -> list[tuple[str, str]]:
        assert not browser.open(site + "search.html?q=" + urllib.parse.quote(query)).errors
        # Sphinx lists the results one by one (a 5 ms timer each) and says so when it is done;
        # the first results showing up is not the end (under load, lists were cut short).
        browser.page.wait_for_function("/Search finished|did not match/.test(document.querySelector("
                                       "'#search-results .search-summary')?.textContent || '')", timeout=60000)
        # then each result's summary is fetched from its page
        browser.page.wait_for_function("[...document.querySelectorAll('#search-results li')]"
                                       ".every(li => li.querySelector('p.context'))", timeout=30000)
        return browser.evaluate("[...document.querySelectorAll('#search-results li')].map(li => "
                                "[li.querySelector('a').textContent, li.querySelector('p.context')?.textContent || ''])")

    found = {query: search(query) for query in ("all-reduce", "allreduce", "all_reduce", "AllReduce")}
    pages = {query: {title for title, _ in results} for query, results in found.items()}
    assert len(pages["all-reduce"]) >= 10, pages["all-reduce"]
    assert pages["allreduce"] == pages["all_reduce"] == pages["AllReduce"], pages
    # "all-reduce" is two words to Sphinx (all AND reduce), so it also finds pages that say
    # "all" and "reduce" apart; every page about the collective must be among them.
    assert pages["allreduce"] <= pages["all-reduce"], (
        f"found as allreduce, missing under all-reduce: {pages['allreduce'] - pages['all-reduce']}")
    ring = next(snippet for title, snippet in found["allreduce"] if "ring all-reduce" in title)
    assert "  " not in ring and "\n" not in ring, f"the snippet is not prose: {ring!r}"
    assert "import " not in ring and "Contents" not in ring, f"the snippet quotes code or the contents: {ring!r}"
    assert ".pdf" not in ring and "\\(" not in ring, f"the snippet quotes buttons or formula markup: {ring!r}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(ARTIFACTS / "search-allreduce.png")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_tables_that_cells_display_are_rendered_as_tables(built_book):
    """A Markdown table in a cell's output must become an HTML table, not a paragraph of pipes."""
    raw = re.compile(r"\|\s*(---|—|–)+\s*\|")        # a header separator row, as typed or after smartquotes
    tables = 0
    for name in html_pages(built_book):
        page = (built_book / name).read_text()
        text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<pre.*?</pre>", " ", page, flags=re.S)))  # code may type tables
        assert not raw.search(text), f"{name}: a table was rendered as text: {raw.search(text).group(0)!r}"
        tables += page.count("<table")
    assert tables >= 20, f"only {tables} tables in the whole book"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_solutions_are_not_reachable_over_http(site):
    for path in ["solutions/", "../solutions/", "_sources/solutions/"] + [
            f"solutions/{p.parent.name}/{p.name}" for p in notebook_sources()]:
        status, _, _ = fetch(site + path)
        assert status == 404, f"{path} answered {status}"


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_data_parallel_widget_renders_from_embedded_state_and_reacts(built_book, site, browser):
    page = browser.open(site + "book/getting-started/first-steps.html")
    assert not page.errors, page.errors
    state = browser.evaluate(
        "JSON.parse(document.querySelector("
        "'script[type=\"application/vnd.jupyter.widget-state+json\"]').textContent)")
    models = {m["model_name"] for m in state["state"].values()}
    assert {"ToggleButtonsModel", "StackModel", "LinkModel", "HTMLModel"} <= models
    visible = ("(() => { const v = [...document.querySelectorAll('.dp-split')]"
               ".filter(e => e.offsetParent !== null); return v.length === 1 ? "
               "{...v[0].dataset} : null; })()")
    shown = browser.wait_for(visible)
    assert shown == {"globalBatch": "64", "worldSize": "2", "localBatch": "32"}
    browser.evaluate("document.querySelector('.dp-split').scrollIntoView({block: 'center'})")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(ARTIFACTS / "widget-before.png")

    def click(description: str, label: str) -> None:
        browser.evaluate(f"""(() => {{
            const box = [...document.querySelectorAll('.widget-toggle-buttons')].find(
                b => b.querySelector('.widget-label').textContent.trim() === '{description}');
            [...box.querySelectorAll('button')].find(b => b.textContent.trim() === '{label}').click();
        }})()""")

    click("ranks", "4")
    assert browser.wait_for(visible + "?.worldSize === '4' && " + visible)["localBatch"] == "16"
    click("global batch", "256")
    shown = browser.wait_for(visible + "?.globalBatch === '256' && " + visible)
    assert shown == {"globalBatch": "256", "worldSize": "4", "localBatch": "64"}
    browser.screenshot(ARTIFACTS / "widget-after.png")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_screenshots_of_the_first_page_of_each_part(built_book, site, browser):
    """Saved as test artifacts, for a person to look at."""
    first_pages = {"00-home": TOC["root"]}
    for number, part in enumerate(TOC["parts"], start=1):
        entry = part["chapters"][0]
        docnames = [entry["file"]] if "file" in entry else sorted(
            Path(p).relative_to(REPO).with_suffix("").as_posix()
            for p in glob.glob(str(REPO / (entry["glob"] + ".ipynb"))))
        if docnames:
            slug = re.sub(r"[^a-z0-9]+", "-", part["caption"].lower()).strip("-")
            first_pages[f"{number:02d}-{slug}"] = docnames[0]
    for index in sorted(REPO.glob("book/[0-9][0-9]-*/index.md")):
        first_pages[f"chapter-{index.parent.name}"] = index.relative_to(REPO).with_suffix("").as_posix()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (390, 1280):
        browser.resize(width)
        for name, docname in first_pages.items():
            page = browser.open(site + docname + ".html", settle=1.0)
            assert not page.errors, page.errors
            title = browser.evaluate("document.querySelector('h1')?.textContent || ''")
            assert title.strip(), f"{docname} has no title"
            browser.screenshot(ARTIFACTS / f"{name}-{width}px.png")
            assert (ARTIFACTS / f"{name}-{width}px.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_screenshots_of_every_widget_at_tablet_width(built_book, site, browser):
    """Each widget as a reader at 820 px sees it, saved for a person to look at: every one
    shows its buttons and a picture that decoded."""
    browser.resize(820)
    shots = 0
    for name in html_pages(built_book):
        if "widget-state+json" not in (built_book / name).read_text():
            continue
        assert not browser.open(site + name, settle=1.0).errors
        widgets = browser.page.locator(".cell_output .widget-vbox:not(.widget-vbox .widget-vbox)")  # outermost
        browser.page.wait_for_function("document.querySelectorAll('.cell_output .widget-vbox').length > 0",
                                       timeout=20000)
        for i in range(widgets.count()):
            widget = widgets.nth(i)
            widget.scroll_into_view_if_needed()
            decoded = widget.evaluate("w => [...w.querySelectorAll('img')].filter(i => i.offsetParent)"
                                      ".every(i => i.complete && i.naturalWidth > 0)")
            assert decoded, f"{name}: widget {i} shows an image that did not decode"
            path = ARTIFACTS / f"widget-{name.replace('/', '-').removesuffix('.html')}-{i}.png"
            widget.screenshot(path=str(path))
            shots += 1
    assert shots >= 5, f"only {shots} widgets in the book"


def test_show_lists_the_source_itself_and_a_method_from_its_def():
    from distlab.figures.listing import show
    from distlab.zero.fully_shard import FullyShardedModel

    text = show(FullyShardedModel.gather).data
    assert text.startswith("```python\ndef gather(self, index: int) -> None:\n") and text.endswith("```")
    assert "all_gather_parameters(self.shards[index], buffer)" in text


def test_explorer_views_are_palette_pngs_that_look_like_the_figure():
    """Every explorer view is embedded in its page, so each is stored with a 256-colour palette.

    The check decodes both images: the palette version must be at most half the size of the
    full-colour one, and no pixel may move by more than 12 of 255 in any channel (median-cut keeps
    the few flat colours of a chart exactly; only anti-aliased edges shift, by a shade).
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    from distlab.figures.widgets import figure_widget

    def chart():
        fig, ax = plt.subplots(figsize=(7, 2.4))
        for row in range(4):
            ax.barh([row] * 12, [0.3] * 12, left=np.arange(12) * 0.35 + row * 0.1, color=["C0", "C1"][row % 2])
        ax.set_title("interleaved schedule, 4 ranks")
        ax.set_xlabel("time (units of one forward)")
        return fig

    full = io.BytesIO()
    chart().savefig(full, format="png", dpi=90, bbox_inches="tight", facecolor="white")
    stored = figure_widget(chart()).value
    original, palette = Image.open(full), Image.open(io.BytesIO(stored))
    assert palette.mode == "P" and palette.size == original.size
    assert len(stored) * 2 <= len(full.getvalue()), (len(stored), len(full.getvalue()))
    difference = np.abs(np.asarray(original.convert("RGB"), int) - np.asarray(palette.convert("RGB"), int))
    assert difference.max() <= 12, difference.max()
