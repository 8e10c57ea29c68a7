"""The instructor on the demo hub: an unprivileged account with its own copy of the course.

Root starts the hub, the cluster and the grading sandbox, nothing more. The instructor's
commands (``python -m distlab.grade publish / collect / autograde / feedback / return /
export``) run as the course's instructor account, as a centre's instructor runs them from
their own login: whatever a student leaves in the exchange or in a graded folder, the worst
a mistake in the grader can let it do is act with the instructor's rights, never root's.

The instructor works in a private copy of the course (the instructor edition, with
``solutions/``, ``grader/`` and ``tests/``), as they would in their own clone of the private
repository: ``<run folder>/instructor/course``, owned by the account and closed to everyone
else (0700). Its grading folder (gradebook, submissions, feedback) is theirs too.
``PYTHONPATH`` puts the copy's ``src/`` first, so ``distlab.grade`` finds the copy's solutions and grader
configuration (its course root is the folder its package comes from). The interpreter is the
one the course environment was made from (see :func:`runnable_python`).

    argv = command(instructor, "autograde", "00-first-steps")
    subprocess.run(argv, cwd=instructor["course"])
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from distlab.grade.boundary import cgroups
from distlab.grade.config import COURSE_ID

RUNUSER = "/usr/sbin/runuser"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def runnable_by_everyone(path: Path) -> bool:
    """Can any user execute ``path`` (every folder above it searchable, the file executable)?"""
    path = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents) and bool(os.stat(path).st_mode & stat.S_IXOTH)


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)          # the same file, no copy: instant, no space
    except OSError:                      # another file system (a tmpfs /tmp)
        shutil.copy2(source, target)


def runnable_python(course_env: Path, run_dir: Path) -> tuple[Path, dict]:
    """The course environment's Python, as a program the instructor's account can run, and the
    variables it needs: ``(python, environment)``.

    Where the course environment's own interpreter is runnable by every user (a centre's
    shared software tree), it is that one. A course environment made from a Python in root's
    home (pyenv, on this machine) cannot be run by another account. The students' servers then
    run Debian's Python of the same minor version (demo.server_python), but it is not the same
    patch release (3.11.2 against 3.11.7 here), and nbconvert's HTML export, which the feedback
    pages need, fails on 3.11.2 (its CSS selectors use possessive quantifiers, broken in Python's
    ``re`` before 3.11.5). So the instructor gets the very interpreter the course environment was
    made from: its executable, shared library and standard library, hard-linked (or copied)
    into ``run_dir/python-base``, and a small environment of it that imports the course
    environment's packages (one .pth file), so nothing is installed twice.
    """
    own = course_env / "bin" / "python"
    if runnable_by_everyone(own):
        return own, {}
    base, copy = Path(os.path.realpath(sys.base_prefix)), run_dir / "python-base"
    wanted = [base / "bin" / VERSION, *(base / "lib").glob("libpython*")]
    stdlib = base / "lib" / VERSION
    for folder, subfolders, files in os.walk(stdlib):
        subfolders[:] = [d for d in subfolders if not (folder == str(stdlib) and d == "site-packages")]
        wanted += [Path(folder) / name for name in files]
    for source in wanted:
        _link_or_copy(source, copy / source.relative_to(base))
    (copy / "lib" / VERSION / "site-packages").mkdir(exist_ok=True)
    variables = {"LD_LIBRARY_PATH": str(copy / "lib")}   # before the interpreter's RUNPATH, into root's home
    env = run_dir / "instructor-env"
    subprocess.run([str(copy / "bin" / VERSION), "-m", "venv", "--without-pip", str(env)], check=True, timeout=120,
                   env=dict(os.environ, **variables))
    (env / "lib" / VERSION / "site-packages" / "course-environment.pth").write_text(
        f"import site; site.addsitedir({str(course_env / 'lib' / VERSION / 'site-packages')!r})\n")
    console_scripts(course_env, env)
    for top in (copy, env):
        os.chmod(top, 0o755)
    return env / "bin" / "python", variables


def console_scripts(course_env: Path, env: Path) -> list[str]:
    """The course environment's commands (``alembic``, ``jupyter``, ``nbgrader`` ...) in ``env``,
    run by its Python: nbgrader calls ``alembic`` by name to make a new gradebook, and the
    originals start with the course environment's own Python's path."""
    made = []
    for script in sorted((course_env / "bin").iterdir()):
        target = env / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        with script.open("rb") as handle:
            first = handle.readline()
        if not first.startswith(b"#!") or not first[2:].strip().startswith(str(course_env / "bin" / "python").encode()):
            continue
        target.write_bytes(b"#!" + str(env / "bin" / "python").encode() + b"\n" + script.read_bytes().split(b"\n", 1)[1])
        target.chmod(0o755)
        made.append(script.name)
    return made


def course_files(repo: Path) -> list[str]:
    """The course's files as the working tree has them: tracked ones and new ones git does not
    ignore (no virtual environment, build or run folders), relative to ``repo``."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, timeout=120)
    if listed.returncode != 0:
        raise RuntimeError(f"cannot list the course's files in {repo} (is it a git checkout?): {listed.stderr}")
    return [name for name in listed.stdout.split("\0") if name and (repo / name).is_file()]


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    for folder, subfolders, files in os.walk(top):
        os.chown(folder, uid, gid, follow_symlinks=False)
        for name in subfolders + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def set_up(run_dir: Path, user: str, repo: Path, grading: Path, course_env: Path, exchange: Path,
           slurm_conf: str) -> dict:
    """Give ``user`` a private copy of the course in ``run_dir/instructor`` and the grading
    folder ``grading``; return what :func:`command` needs."""
    account = pwd.getpwnam(user)
    python, variables = runnable_python(course_env, run_dir)
    home = run_dir / "instructor"
    course = home / "course"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(mode=0o700)
    for name in course_files(repo):
        target = course / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target, follow_symlinks=False)
    grading.mkdir(mode=0o700, exist_ok=True)
    os.chmod(grading, 0o700)
    for top in (home, grading):
        _chown_tree(top, account.pw_uid, account.pw_gid)
    # The exchange's course folder is the instructor's before any student could make it (the
    # exchange's root is 1777: whoever makes it first owns it; publish refuses one not its own).
    course_folder = exchange / COURSE_ID
    course_folder.mkdir(mode=0o755, exist_ok=True)
    if course_folder.is_symlink() or course_folder.stat().st_uid not in (0, account.pw_uid):
        raise RuntimeError(f"{course_folder} was made by uid {course_folder.stat().st_uid}, not by the instructor "
                           f"{user}: remove it and start the hub again")
    os.chown(course_folder, account.pw_uid, account.pw_gid, follow_symlinks=False)
    # Control groups of its own, so its grading caps each submission's processes together.
    groups = cgroups.delegate(user, f"distlab-grading-{user}")
    environment = {
        "HOME": account.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
        "PATH": f"{python.parent}:/usr/bin:/bin", **variables,
        "PYTHONPATH": str(course / "src"),
        # nbconvert's templates (feedback pages) are data files of the course environment
        "JUPYTER_PATH": str(course_env / "share" / "jupyter"),
        "DISTLAB_GRADE_WORK": str(grading), "DISTLAB_GRADE_EXCHANGE": str(exchange), "SLURM_CONF": slurm_conf,
        cgroups.PARENTS_VARIABLE: os.pathsep.join(map(str, groups)),
    }
    return {"user": user, "course": course, "python": python, "environment": environment, "cgroups": groups}


def tear_down(instructor: dict) -> None:
    """What :func:`set_up` made outside the run folder: the account's control groups."""
    cgroups.undelegate(instructor["cgroups"])


def command(instructor: dict, *args: str, env: dict | None = None) -> list[str]:
    """``python -m distlab.grade ARGS`` as the instructor: their account, a clean environment
    (theirs plus ``env``, e.g. the gradebook server's URL), run from their copy of the course."""
    variables = {**instructor["environment"], **(env or {})}
    return [RUNUSER, "-u", instructor["user"], "--", "env", "-i", *[f"{k}={v}" for k, v in variables.items()],
            str(instructor["python"]), "-m", "distlab.grade", *args]


def shell_profile(instructor: dict) -> Path:
    """Write ``course-env.sh`` into the instructor's folder: ``source`` it after ``su -`` to the
    account, and ``python -m distlab.grade`` works as in :func:`command`."""
    profile = instructor["course"].parent / "course-env.sh"
    lines = [f"export {k}={v!r}" for k, v in instructor["environment"].items() if k not in ("HOME", "USER", "LOGNAME")]
    profile.write_text("\n".join(lines + [f"cd {instructor['course']}", ""]))
    account = pwd.getpwnam(instructor["user"])
    os.chown(profile, account.pw_uid, account.pw_gid)
    os.chmod(profile, 0o600)
    return profile
