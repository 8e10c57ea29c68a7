"""Point the exercise notebooks' links to the book at the published pages.

A student on the hub opens an exercise in JupyterLab; a relative link to a page's source
(``../../book/04-zero-fsdp/memory.md``) would open the MyST text there, without its
figures, widgets or executed outputs. The links in ``solutions/`` therefore name the
rendered page at the book's published address, the ``html.baseurl`` of ``_config.yml``:
``<baseurl>book/04-zero-fsdp/memory.html``. A course that publishes the book elsewhere sets
``html.baseurl`` and runs this script, then releases the notebooks again::

    python scripts/link_notebooks_to_book.py     # rewrites solutions/*/*.ipynb in place
    make grade-release                           # regenerates notebooks/ from them

It rewrites, in the markdown cells, every link to a page of the book, whether written as a
relative ``.md`` path or as an address of another published copy (``.../book/<page>.html``),
and leaves every other link alone. ``tests/book/test_book.py`` checks the result.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

# ](../../book/<page>.md) or ](<any address>/book/<page>.html), with an optional #anchor
_LINK = re.compile(r"\]\((?:\.\./)+(book/[^)\s#]+)\.md(#[^)\s]*)?\)|\]\(https?://[^)\s]*?/(book/[^)\s#]+)\.html(#[^)\s]*)?\)")


def published_base() -> str:
    """The book's published address, ending in "/" (``html.baseurl`` of _config.yml)."""
    base = (yaml.safe_load((REPO / "_config.yml").read_text()).get("html") or {}).get("baseurl") or ""
    if not base.startswith(("https://", "http://")):
        raise SystemExit("_config.yml: html.baseurl must be the book's published address, https://...")
    return base.rstrip("/") + "/"


def page_url(base: str, docname: str, anchor: str = "") -> str:
    """The published address of a page: ``docname`` is its path without suffix (book/...)."""
    return f"{base}{docname}.html{anchor}"


def relink(text: str, base: str) -> str:
    def replace(match: re.Match) -> str:
        docname, anchor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        return f"]({page_url(base, docname, anchor or '')})"

    return _LINK.sub(replace, text)


def main() -> int:
    base = published_base()
    for path in sorted((REPO / "solutions").glob("*/*.ipynb")):
        notebook = json.loads(path.read_text())
        changed = False
        for cell in notebook["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            source = cell["source"] if isinstance(cell["source"], list) else [cell["source"]]
            new = [relink(line, base) for line in source]
            if new != source:
                cell["source"], changed = new, True
        if changed:
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
            print(f"{path.relative_to(REPO)}: links now point to {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
