"""What ``make hub`` hides from the students: the instructor-only files, with their compiled copies.

The students' servers read the repository (the course environment is installed from it).
``make hub`` removes other users' access to the instructor-only paths; a module's compiled copy
in ``__pycache__`` holds its code and constants (``new_chapter_text``'s sample solution and hidden
tests) and stayed readable (0644) beside its hidden source. ``src/distlab/grade/author/`` is hidden
as a folder, so a module added there later is hidden with it. Tried on a copy of the layout.
"""

from __future__ import annotations

import importlib.util
import py_compile
import stat
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hub"))
import demo_access  # noqa: E402


def _others_may_read(path: Path, top: Path) -> bool:
    """Whether another user reaches ``path`` below ``top``: every folder on the way lets them
    through (o+x) and the path itself lets them read (o+r)."""
    folders = [top / Path(*path.relative_to(top).parts[:i]) for i in range(1, len(path.relative_to(top).parts))]
    return all(f.stat().st_mode & stat.S_IXOTH for f in folders) and bool(path.stat().st_mode & stat.S_IROTH)


def _module(path: Path, text: str) -> Path:
    """``path``, readable by all (0644, its folders 0755), with its compiled copy beside it; the copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    compiled = Path(importlib.util.cache_from_source(str(path)))
    py_compile.compile(str(path), cfile=str(compiled))
    for folder in (path.parent, compiled.parent):
        folder.chmod(0o755)
    for file in (path, compiled):
        file.chmod(0o644)
    return compiled


def test_the_compiled_copies_of_instructor_only_modules_are_hidden_with_their_sources(tmp_path, monkeypatch):
    grade = tmp_path / "src" / "distlab" / "grade"
    for folder in (tmp_path / "src", tmp_path / "src" / "distlab", grade):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
    # new_chapter_text's templates hold a sample solution and hidden tests; a module added to
    # grade/author/ later, which no list names, is hidden as its folder is.
    authors = {grade / "author" / name: _module(grade / "author" / name, "SAMPLE = '### BEGIN HIDDEN TESTS'\n")
               for name in ("new_chapter_text.py", "a_tool_added_later.py")}
    rewriter = tmp_path / "scripts" / "link_notebooks_to_book.py"   # instructor-only, in a folder that stays
    rewriter_compiled = _module(rewriter, "SOLUTIONS = 'solutions/'\n")
    students = grade / "checks.py"
    students_compiled = _module(students, "SAMPLE = 'ok'\n")
    assert all(_others_may_read(p, tmp_path) for pair in authors.items() for p in pair)
    assert _others_may_read(rewriter_compiled, tmp_path)
    monkeypatch.setattr(demo_access, "REPO", tmp_path)   # hub/demo_access.py: what make hub hides

    hidden = demo_access.make_instructor_folders_private()

    for source, compiled in authors.items():
        assert not _others_may_read(source, tmp_path) and not _others_may_read(compiled, tmp_path), source.name
    assert rewriter_compiled in hidden
    assert not _others_may_read(rewriter, tmp_path) and not _others_may_read(rewriter_compiled, tmp_path)
    assert _others_may_read(students, tmp_path) and _others_may_read(students_compiled, tmp_path)
    rewriter_compiled.unlink()   # Python compiles it again later: with its hidden source's mode
    py_compile.compile(str(rewriter), cfile=str(rewriter_compiled))
    assert not _others_may_read(rewriter_compiled, tmp_path)
