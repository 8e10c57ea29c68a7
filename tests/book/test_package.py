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

import distlab
from distlab import chapters
from distlab.grade.author import book_checks

SRC = Path(distlab.__file__).resolve().parent
REPO = SRC.parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import package_map  # noqa: E402

MAX_LINES = package_map.MAX_LINES
"""A module longer than this must say in its docstring why it is one piece (the word "one piece")."""

CHAPTER_PACKAGES = ["distlab.runtime", *chapters.packages()]
"""The runtime (what the first steps use) and every chapter's reference package (src/distlab/chapters.py)."""

modules = package_map.modules
imports_of = package_map.imports_of
"""The package's modules and what each imports, as scripts/package_map.py draws them."""


def test_no_import_cycle_between_modules():
    graph = package_map.import_graph(modules())
    found = package_map.cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)
    assert "distlab.runtime.launchers.local" in graph["distlab.runtime.launchers"], "the checker saw no imports"


def test_the_cycle_finder_finds_every_cycle_and_none_where_there_is_none():
    assert package_map.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert package_map.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert package_map.cycles({"a": {"a2"}, "a2": set(), "b": {"c"}, "c": {"b"}, "d": {"d"}}) == [
        ["b", "c", "b"], ["d", "d"]]


def test_the_package_map_draws_every_package_with_no_cycle_and_no_unexplained_long_module():
    """`python scripts/package_map.py`: a line a package with what it imports; the instruments
    (distlab.tools) import nothing above them; no cycle between modules or between packages."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "package_map.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("distlab")}
    assert set(rows) >= {*CHAPTER_PACKAGES, "distlab.tools", "distlab.grade", "distlab.models"}, done.stdout
    assert rows["distlab.tools"].endswith("-> -"), rows["distlab.tools"]
    assert "module cycles:  none" in done.stdout and "package cycles: none" in done.stdout, done.stdout
    packages = package_map.package_graph(package_map.import_graph(modules()))
    assert "distlab.tools" in packages["distlab.collectives"] and "distlab.grade" not in packages["distlab.runtime"]


GRADE_ROOMS = ("distlab.grade.boundary", "distlab.grade.pipeline", "distlab.grade.course", "distlab.grade.author")
"""The rooms of distlab.grade (its docstring names each); checks, the CLI and the settings sit at its top."""


def test_the_graders_rooms_have_no_cycle_and_the_boundary_leans_on_no_other_room():
    """`python scripts/package_map.py --depth 3`: grade/ drawn as rooms, none importing another that
    imports it back; the trust boundary uses only the settings and the failure a check raises, so
    no change in the pipeline, the class, the authoring commands or checks can weaken it unseen."""
    rooms = package_map.package_graph(package_map.import_graph(modules()), depth=3)
    grade = {room: {t for t in targets if t.startswith("distlab.grade")} for room, targets in rooms.items()
             if room.startswith("distlab.grade")}
    assert set(GRADE_ROOMS) <= set(grade), sorted(grade)
    found = package_map.cycles(grade)
    assert not found, "cycles between grade's rooms: " + "; ".join(" -> ".join(c) for c in found)
    assert grade["distlab.grade.boundary"] == {"distlab.grade.config", "distlab.grade.failures"}, \
        grade["distlab.grade.boundary"]
    assert "distlab.grade.boundary" in grade["distlab.grade.checks"], "the checker saw no imports"
    for room in GRADE_ROOMS:
        assert f":mod:`{room}`" in importlib.import_module("distlab.grade").__doc__, room
        assert len(importlib.import_module(room).__doc__) > 200, f"{room}'s docstring says too little"


def test_the_instruments_sit_below_everything_and_import_no_chapter():
    known = modules()
    for name, path in known.items():
        if name.startswith("distlab.tools"):
            above = {t for t in imports_of(name, path, known) if not t.startswith("distlab.tools")}
            assert not above, f"{name} imports {sorted(above)}: distlab.tools is the bottom layer"


def test_no_module_is_long_unless_its_docstring_says_why():
    long = {name: lines for name, (lines, said) in package_map.long_modules(modules()).items() if not said}
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
    places += [REPO / "README.md", REPO / "grader" / "nbgrader_config.py"] + list((REPO / "tests").rglob("*.py"))
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
