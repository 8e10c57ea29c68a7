"""The package's shape: folders that are the course, no import cycle, short modules, names that resolve.

Cheap checks on the source as text, no ranks: they keep the layout of ``src/distlab`` from
drifting back into the flat tangle it was regrouped from.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import distlab
from distlab import chapters
from distlab.grade import book_checks

SRC = Path(distlab.__file__).resolve().parent
REPO = SRC.parent.parent

MAX_LINES = 350
"""A module longer than this must say in its docstring why it is one piece (the word "one piece")."""

CHAPTER_PACKAGES = ["distlab.runtime", *chapters.packages()]
"""The runtime (what the first steps use) and every chapter's reference package (src/distlab/chapters.py)."""


def modules() -> dict[str, Path]:
    """``{module name: file}`` of every module of the package (a package's name for its ``__init__``)."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The distlab modules a module imports, anywhere in it (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base] * bool(base))
            # `from pkg import module` depends on the module, not on the package's body
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_no_import_cycle_between_modules():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    done, path_now = set(), []

    def visit(node):
        if node in path_now:
            cycle = path_now[path_now.index(node):] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        path_now.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        path_now.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert "distlab.runtime.launchers.local" in graph["distlab.runtime.launchers"], "the checker saw no imports"


def test_the_instruments_sit_below_everything_and_import_no_chapter():
    known = modules()
    for name, path in known.items():
        if name.startswith("distlab.tools"):
            above = {t for t in imports_of(name, path, known) if not t.startswith("distlab.tools")}
            assert not above, f"{name} imports {sorted(above)}: distlab.tools is the bottom layer"


def test_no_module_is_long_unless_its_docstring_says_why():
    long = {}
    for name, path in modules().items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and "one piece" not in (ast.get_docstring(ast.parse(path.read_text())) or ""):
            long[name] = lines
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_module_has_a_docstring_that_teaches():
    missing = [name for name, path in modules().items() if len(ast.get_docstring(ast.parse(path.read_text())) or "") < 40]
    assert not missing, f"modules without a docstring: {missing}"


def test_the_chapter_map_names_every_chapter_package_and_each_exists():
    doc = distlab.__doc__
    for package in CHAPTER_PACKAGES + ["distlab.models", "distlab.tools", "distlab.figures", "distlab.grade"]:
        assert f":mod:`{package}`" in doc, f"the chapter map in distlab/__init__.py does not name {package}"
        importlib.import_module(package)
    readme = (REPO / "README.md").read_text()
    for package in CHAPTER_PACKAGES:
        assert f"`{package}`" in readme, f"the README's chapter map does not name {package}"


DOTTED = book_checks.DOTTED
resolves = book_checks.resolves


def test_every_dotted_distlab_name_in_the_code_the_book_and_the_notebooks_exists():
    places = list(SRC.rglob("*.py")) + list((REPO / "book").rglob("*.md")) + list((REPO / "solutions").rglob("*.ipynb"))
    places += [REPO / "README.md", REPO / "grader" / "nbgrader_config.py"] + list((REPO / "tests").glob("*.py"))
    broken = {}
    for path in places:
        for found in DOTTED.findall(path.read_text(errors="replace")):
            if found.endswith((".toml", ".py")) or found in broken:
                continue
            if not resolves(found):
                broken[found] = str(path.relative_to(REPO))
    assert not broken, f"names that no longer exist: {broken}"


def test_the_warm_ranks_preload_every_module_of_the_reference_packages():
    from distlab.runtime import isolation

    preloaded = set(isolation.preloaded_modules())
    known = modules()
    for package in chapters.packages() + ["distlab.tools"]:
        missing = [name for name in known if name.startswith(package + ".") and name not in preloaded]
        assert not missing, f"warm ranks would first import these during a call: {missing}"


def test_import_distlab_is_cheap_and_the_planner_needs_no_torch():
    code = ("import sys, distlab, distlab.parallel3d.mesh, distlab.parallel3d.planner, distlab.parallel3d.recommend, "
            "distlab.zero.theory; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
