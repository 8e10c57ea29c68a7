"""Close a file's tabs in the student's saved JupyterLab workspaces, before JupyterLab restores them.

Why it exists. JupyterLab saves which tabs are open (its *workspace*, a JSON file per workspace
in ``~/.jupyter/lab/workspaces``) and reopens them all on the next page load, beside the file
the URL names. A student who followed a chapter's launch link before the instructor released
it had the course clone's notebook open, ``distlab/notebooks/<slug>/<slug>.ipynb``; after the
release the same link opens the fetched assignment, ``<slug>/<slug>.ipynb``
(``course_launch``), and JupyterLab restored the clone's tab beside it: two tabs named
"<slug>.ipynb", told apart only by their tooltips, one of them never handed in.

What it does. ``course_launch`` calls :func:`close_tabs_of` with the clone's notebook just
before it redirects the browser to the fetched copy, so the page that loads next finds the
clone's tab gone from the saved layout and restores only the others. Nothing else in the
workspace changes; the clone's file stays where it is (the file browser still shows it).

A workspace holds, among others, one entry per open document (``"notebook:<path>": {"data":
{"path": ..., "factory": ...}}``, which JupyterLab reopens) and the layout of the main area
(``layout-restorer:data``: tab areas listing those entries' names, in split areas). Both lose
the document's entries; a tab area left empty is dropped from its split area.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

WORKSPACE_SUFFIX = ".jupyterlab-workspace"   # jupyterlab_server's WORKSPACE_EXTENSION


def close_tabs_of(workspaces: Path | str, path: str) -> int:
    """Remove every tab of the file ``path`` (relative to the server's root) from the saved
    workspaces in the folder ``workspaces``; return how many tabs went. A workspace that cannot
    be read or parsed is left alone (JupyterLab copes with it as before)."""
    closed = 0
    for file in sorted(Path(workspaces).glob(f"*{WORKSPACE_SUFFIX}")):
        try:
            workspace = json.loads(file.read_text())
            data = workspace["data"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        names = {name for name, entry in data.items()
                 if isinstance(entry, dict) and isinstance(entry.get("data"), dict) and entry["data"].get("path") == path}
        if not names:
            continue
        for name in names:
            del data[name]
        main = data.get("layout-restorer:data", {}).get("main", {})
        if isinstance(main, dict):
            if isinstance(main.get("dock"), dict):
                main["dock"] = _without(main["dock"], names)
                if main["dock"] is None:
                    del main["dock"]
            if main.get("current") in names:
                del main["current"]
        _write(file, workspace)
        closed += len(names)
    return closed


def _without(area: dict, names: set[str]) -> dict | None:
    """A dock area (a tab area, or a split area of them) without the widgets ``names``; None
    when nothing is left in it."""
    if area.get("type") == "tab-area":
        widgets = [w for w in area.get("widgets", []) if w not in names]
        if not widgets:
            return None
        current = area.get("currentIndex", 0)
        shown = area["widgets"][current] if 0 <= current < len(area.get("widgets", [])) else None
        return {**area, "widgets": widgets, "currentIndex": widgets.index(shown) if shown in widgets else 0}
    if area.get("type") == "split-area":
        children = [child for child in area.get("children", []) if isinstance(child, dict)]
        sizes = area.get("sizes") or []
        sizes = sizes if len(sizes) == len(children) else [1 / max(1, len(children))] * len(children)
        kept = [(_without(child, names), size) for child, size in zip(children, sizes)]
        kept = [(child, size) for child, size in kept if child is not None]
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0][0]
        total = sum(size for _, size in kept) or 1
        return {**area, "children": [c for c, _ in kept], "sizes": [s / total for _, s in kept]}
    return area


def _write(file: Path, workspace: dict) -> None:
    """Replace ``file`` at once (a page loading meanwhile reads the old or the new, never half)."""
    handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=".", suffix=WORKSPACE_SUFFIX + ".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(workspace, out)
        os.chmod(temporary, file.stat().st_mode & 0o777)
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
