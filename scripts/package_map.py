"""The map of src/distlab drawn from its own imports: which package uses which, any cycle, long modules.

    python scripts/package_map.py             # one line a package: its size and what it imports
    python scripts/package_map.py --depth 3   # the rooms inside each package (distlab.grade.*)

Read from the source as text (``ast``), nothing imported: a module's imports are every
``import`` and ``from ... import`` in it, inside functions too, each resolved to the distlab
module it names (``from distlab.tools import comm`` depends on ``distlab.tools.comm``, not on
the package's ``__init__``). A package's imports are its modules' imports outside it.

Printed: one line a package (modules, lines, the packages it imports); the import cycles, between
modules (a bug: an import that works only in one order) and between packages (a layer that
leans on one above it); and the modules over :data:`MAX_LINES` lines, saying which of them
explain in their docstring why they are one piece. Exit status 1 when a module cycle or an
unexplained long module is found. tests/book/test_package.py asserts the same, with these functions.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "distlab"

MAX_LINES = 350
"""A module longer than this must say in its docstring why it is one piece (the words "one piece")."""


def modules(src: Path = SRC) -> dict[str, Path]:
    """``{module name: file}`` of every module of the package (a package's name for its ``__init__``)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
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


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: the distlab modules it imports}`` for every module of ``known``."""
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``, each once, as ``[a, b, ..., a]``: one per back edge of a
    depth-first walk in name order, so an empty list means the graph has no cycle at all."""
    found, done, path_now = [], set(), []

    def visit(node: str) -> None:
        path_now.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in path_now:
                found.append(path_now[path_now.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt)
        path_now.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node)
    return found


def package_of(module: str, depth: int) -> str:
    """The package a module is drawn in: its first ``depth`` dotted parts (``distlab.grade`` at 2)."""
    return ".".join(module.split(".")[:depth])


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The module graph folded into packages of ``depth`` parts; a package's imports of itself dropped."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = package_of(module, depth)
        folded.setdefault(here, set()).update(package_of(t, depth) for t in targets)
    return {package: targets - {package} for package, targets in folded.items()}


def long_modules(known: dict[str, Path]) -> dict[str, tuple[int, bool]]:
    """``{module: (lines, whether its docstring says why it is one piece)}`` of those over MAX_LINES."""
    long = {}
    for name, path in known.items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_LINES:
            long[name] = (lines, "one piece" in (ast.get_docstring(ast.parse(text)) or ""))
    return long


def draw(known: dict[str, Path], depth: int = 2) -> tuple[str, bool]:
    """The map as text, and whether the package is sound (no module cycle, no unexplained long module)."""
    graph = import_graph(known)
    packages = package_graph(graph, depth)
    sizes: dict[str, list[int]] = {}
    for name, path in known.items():
        size = sizes.setdefault(package_of(name, depth), [0, 0])
        size[0] += 1
        size[1] += len(path.read_text().splitlines())
    width = max(map(len, packages))
    lines = [f"{p:<{width}}  {sizes[p][0]:3d} modules {sizes[p][1]:6d} lines  -> {', '.join(sorted(packages[p])) or '-'}"
             for p in sorted(packages)]
    module_cycles, package_cycles = cycles(graph), cycles(packages)
    lines.append("module cycles:  " + ("; ".join(" -> ".join(c) for c in module_cycles) or "none"))
    lines.append("package cycles: " + ("; ".join(" -> ".join(c) for c in package_cycles) or "none"))
    long = long_modules(known)
    lines.append(f"modules over {MAX_LINES} lines: " + (", ".join(
        f"{name} ({n}{', one piece' if said else ', NOT EXPLAINED'})" for name, (n, said) in sorted(long.items()))
        or "none"))
    return "\n".join(lines), not module_cycles and all(said for _, said in long.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=2, help="dotted parts a package is drawn at (default: 2)")
    options = parser.parse_args(argv)
    text, sound = draw(modules(), options.depth)
    print(text)
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
