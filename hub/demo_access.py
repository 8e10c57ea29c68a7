"""What the students' servers may read of the machine, and what they may not.

Part of the demo course (hub/demo.py). The servers run as the students, from the course
environment and the repository's ``src/``: every folder above those must let other users
through, and the interpreter must be one they may run. The instructor-only files of the
repository (``INSTRUCTOR_ONLY``, ``.git``, their compiled copies) are closed to them
(tests/hub/test_hub_private_files.py).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from distlab.grade.author.edition import INSTRUCTOR_ONLY

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import instructor_account  # noqa: E402
from demo_processes import HubError  # noqa: E402


def readable_by_everyone(folder: Path) -> bool:
    """Can any user list and read ``folder`` (and search every folder above it)?"""
    folder = Path(os.path.realpath(folder))
    mode = os.stat(folder).st_mode
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in folder.parents) and mode & stat.S_IROTH and mode & stat.S_IXOTH


def let_everyone_through(folder: Path) -> None:
    """Make every folder above ``folder`` searchable by all users (``o+x``: pass through, not
    list), saying so: the students' servers must reach the course environment and the package
    source, wherever the repository was cloned (a CI runner's folder may be 0700)."""
    for parent in reversed(Path(os.path.realpath(folder)).parents):
        mode = os.stat(parent).st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, mode | stat.S_IXOTH)
            print(f"course hub: made {parent} searchable by other users (o+x), so servers reach the course",
                  file=sys.stderr)


def server_python(course_env: Path, run_dir: Path) -> Path:
    """The interpreter the students' servers run: the course environment's own, if they may.

    A course environment made from a Python in root's home (pyenv, here) cannot be run by the
    students. Then a small environment of the system's Python of the same version stands in:
    it imports the course environment's packages (one .pth file), so nothing is installed twice.
    """
    own = course_env / "bin" / "python"
    if instructor_account.runnable_by_everyone(own):
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = Path("/usr/bin") / version
    if not system.exists() or not instructor_account.runnable_by_everyone(system):
        raise HubError(f"{own} cannot be run by other users (its base Python is private) and there is "
                       f"no {system} to stand in: install Debian's {version} or build the course "
                       "environment from a Python every user can run")
    bridge = run_dir / "server-env"
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(bridge)], check=True, timeout=120)
    site = course_env / "lib" / version / "site-packages"
    (bridge / "lib" / version / "site-packages" / "course-environment.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n")
    return bridge / "bin" / "python"


def make_instructor_folders_private() -> list[Path]:
    """chmod o-rwx the repository's INSTRUCTOR_ONLY folders, its ``.git`` (whose objects hold
    them all) and the compiled copies of its instructor-only modules: the students' servers
    read the repository (the course environment is installed from it), but not these."""
    folders = [REPO / name for name in (*INSTRUCTOR_ONLY, ".git") if (REPO / name).exists()]  # files too, since issue 35
    # A module's compiled copy (__pycache__/<name>.cpython-*.pyc) holds its code and constants
    # (new_chapter_text's sample solution and hidden tests): hidden with its source. Python
    # writes later ones with the source's mode, so they stay hidden.
    folders += [compiled for name in INSTRUCTOR_ONLY if name.endswith(".py")
                for compiled in sorted((REPO / name).parent.glob(f"__pycache__/{Path(name).stem}.*.pyc"))]
    for folder in folders:
        os.chmod(folder, os.stat(folder).st_mode & ~0o007)
    return folders
