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

import glob
import html
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "_build" / "html"
SUBPATH = "/distlab-book/"
ARTIFACTS = REPO / "artifacts" / "book"
sys.path.insert(0, str(REPO / "book" / "_ext"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import distlab_book  # noqa: E402  (book/_ext/distlab_book.py)

CONFIG = yaml.safe_load((REPO / "_config.yml").read_text())
TOC = yaml.safe_load((REPO / "_toc.yml").read_text())
BUILD_TIMEOUT = 1500  # a full build executes every page: minutes on 2 cores


# --- fast checks -----------------------------------------------------------------------------

def toc_files() -> list[str]:
    """Every ``file:`` of _toc.yml (docnames, relative to the repository, no suffix)."""
    files = [TOC["root"]]
    for part in TOC["parts"]:
        files += [entry["file"] for entry in part["chapters"] if "file" in entry]
    return files


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
    scripts = list(sphinx["nb_ipywidgets_js"]) + [sphinx["mathjax_path"]]
    assert len(scripts) == 3
    for script in scripts:
        assert "://" not in script, f"{script} would be loaded from the network"
        assert script.startswith("../vendor/"), script   # relative to _static/, outside it
        local = REPO / "book" / "_extra" / script.removeprefix("../")
        assert local.is_file(), local
        assert (local.parent / "LICENSE.txt").is_file(), f"license missing beside {local}"
    assert sphinx["html_extra_path"] == ["book/_extra"]
    # Jupyter Book 1 adds every .js under _static/ to every page: keep scripts out of it.
    assert not list(REPO.glob("_static/**/*.js")), "no JavaScript in _static/"
    assert str(CONFIG["copyright"]) != "2023"


def test_launch_buttons_are_configured_in_one_place():
    assert CONFIG["launch_buttons"]["jupyterhub_url"].startswith("https://")
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    assert CONFIG["repository"]["branch"]


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
    start = time.monotonic()
    result = subprocess.run(["make", "--no-print-directory", "book"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=BUILD_TIMEOUT)
    return result, time.monotonic() - start


@pytest.fixture(scope="session")
def built_book() -> Path:
    """``make book`` once per session (pages whose code and package are unchanged come from
    the cache); fails the tests that need it if the build warns or fails."""
    result, seconds = make_book()
    assert result.returncode == 0, f"make book failed:\n{result.stdout[-6000:]}"
    assert "book built in" in result.stdout
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
    assert seconds < 60, f"cached rebuild took {seconds:.0f} s"


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


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_student_notebooks_are_published_unexecuted_with_launch_and_download_buttons(built_book):
    hub = CONFIG["launch_buttons"]["jupyterhub_url"].rstrip("/")
    repo_url = CONFIG["repository"]["url"]
    for source in notebook_sources():
        relative = source.relative_to(REPO).with_suffix("")
        page = built_book / relative.with_suffix(".html")
        assert page.exists(), f"{source} is not in the book (toc glob notebooks/*/*)"
        html = page.read_text()
        assert 'class="cell_output' not in html, f"{page} shows outputs: it was executed"
        launch = re.findall(r'href="([^"]*git-pull[^"]*)"', html)
        assert launch, f"{page} has no JupyterHub launch button"
        query = urllib.parse.parse_qs(urllib.parse.urlparse(launch[0].replace("&amp;", "&")).query)
        assert launch[0].startswith(f"{hub}/hub/user-redirect/git-pull")
        assert query["repo"] == [repo_url]
        assert query["urlpath"][0].endswith(f"{relative.as_posix()}.ipynb")
        assert f"_sources/{relative.as_posix()}.ipynb" in html, "no .ipynb download button"
    for name in html_pages(built_book):
        if not name.startswith("notebooks/"):
            assert not re.search(r'href="[^"]*git-pull', (built_book / name).read_text()), (
                f"{name}: launch buttons belong on the .ipynb notebooks only")


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


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_every_page_loads_cleanly_with_working_images_and_links(built_book, site, browser):
    pages = html_pages(built_book)
    assert "index.html" in pages and len(pages) >= 5
    problems, links, images = [], set(), set()
    for name in pages:
        page = browser.open(site + name)
        problems += [f"{name}: {error}" for error in page.errors]
        problems += [f"{name}: loads {url} from outside the site" for url in page.requests
                     if not url.startswith((site, "data:", "blob:", "about:"))]
        links |= set(browser.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)"))
        sources = browser.evaluate("[...document.images].map(i => i.currentSrc || i.src)")
        images |= {url for url in sources if not url.startswith(("blob:", "data:"))}
        # Images made in the page (a widget's blob: or data: picture) cannot be fetched again:
        # ask the browser whether they decoded.
        undecoded = browser.evaluate("[...document.images].filter(i => /^(blob|data):/.test(i.src)"
                                     " && i.complete && i.naturalWidth === 0).length")
        if undecoded:
            problems.append(f"{name}: {undecoded} in-page image(s) did not decode")
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
    assert not problems, "\n".join(problems)
    outside = [(path, code) for path, code in site.requests
               if not path.startswith(SUBPATH) and path != "/favicon.ico"]
    assert not outside, f"requests outside the sub-path: {outside}"


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
    assert shown == {"globalBatch": "64", "worldSize": "2", "microBatch": "32"}
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
    assert browser.wait_for(visible + "?.worldSize === '4' && " + visible)["microBatch"] == "16"
    click("global batch", "256")
    shown = browser.wait_for(visible + "?.globalBatch === '256' && " + visible)
    assert shown == {"globalBatch": "256", "worldSize": "4", "microBatch": "64"}
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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, docname in first_pages.items():
        page = browser.open(site + docname + ".html", settle=1.0)
        assert not page.errors, page.errors
        title = browser.evaluate("document.querySelector('h1')?.textContent || ''")
        assert title.strip(), f"{docname} has no title"
        browser.screenshot(ARTIFACTS / f"{name}.png")
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000


def test_show_lists_the_source_itself_and_a_method_from_its_def():
    from distlab.figures.listing import show
    from distlab.zero.fully_shard import FullyShardedModel

    text = show(FullyShardedModel.gather).data
    assert text.startswith("```python\ndef gather(self, index: int) -> None:\n") and text.endswith("```")
    assert "all_gather_parameters(self.shards[index], buffer)" in text
