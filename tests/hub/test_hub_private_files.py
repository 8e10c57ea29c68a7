"""What ``make hub`` hides from the students: the instructor-only files, with their compiled copies.

The students' servers read the repository (the course environment is installed from it).
``make hub`` removes other users' access to the instructor-only paths; a module's compiled copy
in ``__pycache__`` holds its code and constants (``new_chapter_text``'s sample solution and hidden
tests) and stayed readable (0644) beside its hidden source. Tried on a copy of the layout.
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


def _others_may_read(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IROTH)


def test_the_compiled_copies_of_instructor_only_modules_are_hidden_with_their_sources(tmp_path, monkeypatch):
    grade = tmp_path / "src" / "distlab" / "grade"
    hidden_module = grade / "author" / "new_chapter_text.py"
    for source in (hidden_module, grade / "checks.py"):   # instructor-only, and the students' own
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"SAMPLE = {'### BEGIN HIDDEN TESTS' if source == hidden_module else 'ok'!r}\n")
        source.chmod(0o644)
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    compiled = Path(importlib.util.cache_from_source(str(hidden_module)))
    compiled.chmod(0o644)
    assert _others_may_read(compiled)
    monkeypatch.setattr(demo_access, "REPO", tmp_path)   # hub/demo_access.py: what make hub hides

    hidden = demo_access.make_instructor_folders_private()

    assert compiled in hidden and not _others_may_read(compiled)
    assert not _others_may_read(hidden_module)
    assert _others_may_read(Path(importlib.util.cache_from_source(str(grade / "checks.py"))))
    assert _others_may_read(grade / "checks.py")
    compiled.unlink()   # Python compiles it again later: with its hidden source's mode
    py_compile.compile(str(hidden_module), cfile=str(compiled))
    assert not _others_may_read(compiled)
