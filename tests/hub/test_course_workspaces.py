"""hub/jupyter/course_workspaces.py: a file's tabs leave the saved JupyterLab workspaces, and nothing else does.

The workspaces are written as JupyterLab 4 saves them (a document entry per open tab, the main
area's layout naming them). tests/hub/test_hub.py opens the launch link in a browser before and
after a release and counts the tabs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hub" / "jupyter"))
from course_workspaces import close_tabs_of  # noqa: E402

CLONE = "distlab/notebooks/00-first-steps/00-first-steps.ipynb"
FETCHED = "00-first-steps/00-first-steps.ipynb"
NOTES = "notes.md"


def tab(path: str, factory: str = "Notebook") -> tuple[str, dict]:
    kind = "notebook" if factory == "Notebook" else "editor"
    return f"{kind}:{path}", {"data": {"path": path, "factory": factory}}


def workspace(dock: dict, current: str, *tabs: tuple[str, dict]) -> dict:
    return {"data": {"layout-restorer:data": {"main": {"dock": dock, "current": current},
                                              "left": {"collapsed": False, "current": "filebrowser",
                                                       "widgets": ["filebrowser"]}},
                     "file-browser-filebrowser:cwd": {"path": "distlab/notebooks/00-first-steps"},
                     **dict(tabs)},
            "metadata": {"id": "default"}}


def test_the_clone_s_tabs_are_closed_and_the_rest_of_the_layout_stays(tmp_path):
    clone, clone_as_text, notes = tab(CLONE), tab(CLONE, "Editor"), tab(NOTES, "Editor")
    split = {"type": "split-area", "orientation": "horizontal", "sizes": [0.25, 0.75], "children": [
        {"type": "tab-area", "currentIndex": 1, "widgets": [clone[0], notes[0]]},
        {"type": "tab-area", "currentIndex": 0, "widgets": [clone_as_text[0]]}]}
    saved = tmp_path / "default-37a8.jupyterlab-workspace"
    saved.write_text(json.dumps(workspace(split, clone[0], clone, clone_as_text, notes)))
    other = tmp_path / "lab-a511.jupyterlab-workspace"          # another workspace, the clone not open in it
    other.write_text(json.dumps(workspace({"type": "tab-area", "currentIndex": 0, "widgets": [notes[0]]},
                                          notes[0], notes)))
    untouched = other.read_text()
    broken = tmp_path / "broken.jupyterlab-workspace"
    broken.write_text("{not json")

    assert close_tabs_of(tmp_path, CLONE) == 2
    left = json.loads(saved.read_text())
    assert CLONE not in json.dumps(left), left
    main = left["data"]["layout-restorer:data"]["main"]
    # the split area lost its emptied half; the notes' tab is still shown, first of its area now
    assert main["dock"] == {"type": "tab-area", "currentIndex": 0, "widgets": [notes[0]]}, main
    assert "current" not in main                                # it named the clone's tab
    assert left["data"][notes[0]] == notes[1] and left["data"]["file-browser-filebrowser:cwd"]
    assert left["data"]["layout-restorer:data"]["left"]["widgets"] == ["filebrowser"]
    assert other.read_text() == untouched and broken.read_text() == "{not json"
    assert close_tabs_of(tmp_path, CLONE) == 0                  # again: nothing left to close
    assert close_tabs_of(tmp_path / "no-workspaces-yet", CLONE) == 0


def test_the_fetched_copy_s_tab_is_kept_and_the_one_shown_stays_shown(tmp_path):
    clone, fetched, notes = tab(CLONE), tab(FETCHED), tab(NOTES, "Editor")
    dock = {"type": "tab-area", "currentIndex": 2, "widgets": [clone[0], notes[0], fetched[0]]}
    saved = tmp_path / "default-37a8.jupyterlab-workspace"
    saved.write_text(json.dumps(workspace(dock, fetched[0], clone, fetched, notes)))
    assert close_tabs_of(tmp_path, CLONE) == 1
    main = json.loads(saved.read_text())["data"]["layout-restorer:data"]["main"]
    assert main["dock"]["widgets"] == [notes[0], fetched[0]] and main["dock"]["currentIndex"] == 1
    assert main["current"] == fetched[0]
