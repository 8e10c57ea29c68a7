"""The student edition: the course repository as students may see it, built fresh, never edited.

This repository is the *instructor edition*: ``solutions/`` (nbgrader's source notebooks,
with every solution and hidden test), ``grader/``, ``tests/`` (which hold the answers they
check) and their history. Publishing it, even after a commit that deletes those folders,
publishes them: a clone fetches every commit, and ``git log -p`` shows what the deleting
commit took out. History cannot be trimmed after the fact, so a student edition is *built*:
the tree of one instructor commit without :data:`INSTRUCTOR_ONLY`, committed with no parent
into a new repository that holds no other object (the instructor's objects are borrowed while
it is written, and only those its commit reaches are copied). Its history is that one commit;
there is nothing older to find.

Written again into the same place, the next edition becomes a child of the one there: the
history is then editions only, each as clean as the first, and publishing it is a plain
``git push`` that students' clones (nbgitpuller merges what it fetches) can follow. A new
parentless commit each time would need a force push and break every student's next pull.

:func:`findings` is the check, run by :func:`write` on what it wrote and by the tests: it reads
every object reachable from any ref (what a clone can get) and names each solution cell, hidden
test, grader file or gradebook it finds.

    python -m distlab.grade student-edition DEST      # then: git -C DEST push <public> main
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

INSTRUCTOR_ONLY = ("solutions", "grader", "tests", ".ci", "benchmarks/autograde.py",
                   "scripts/link_notebooks_to_book.py", "src/distlab/grade/author")
"""Paths the student edition leaves out (a folder with everything below it): the nbgrader source
notebooks (solutions, hidden tests), the grader's configuration and hostile submissions, the
tests (they hold the answers), and the instructor's tools that work only with those (CI runs
the tests; the grading benchmark grades ``solutions/``; the link rewriter edits ``solutions/``;
the authors' tools of ``grade/author/``: ``new-chapter`` writes into ``solutions/`` and
``tests/``, and its templates hold a sample task's solution and hidden tests; the page checks
of ``make page`` measure pages against ``solutions/``; the lists of chapters are rewritten by
their authors, not by students). A module added to ``grade/author/`` later is left out too,
unless :data:`STUDENT_EDITION_KEEPS` names it. The book, the released ``notebooks/``, the rest
of the package and ``hub/`` (its pages include the hub's files) stay."""

STUDENT_EDITION_KEEPS = ("src/distlab/grade/author/__init__.py", "src/distlab/grade/author/edition.py",
                         "src/distlab/grade/author/authoring_commands.py")
"""Files of an :data:`INSTRUCTOR_ONLY` folder that the edition keeps, each named: this module
(the published repository's workflow runs :func:`findings` on every push), the declarations of
the authors' commands that ``python -m distlab.grade`` imports (arguments only; each command's
module stays out), and the package's docstring."""


def instructor_only(path: str) -> bool:
    """Whether the student edition leaves out ``path`` (relative to the repository's top)."""
    return path not in STUDENT_EDITION_KEEPS and any(path == p or path.startswith(p + "/") for p in INSTRUCTOR_ONLY)


LEFT_OUT = ", ".join(INSTRUCTOR_ONLY) + " (but for " + ", ".join(STUDENT_EDITION_KEEPS) + ")"
"""What the edition leaves out, as its commit message and the command say it."""

BRANCH = "main"  # _config.yml's repository.branch: the launch links pull it
MARKER = re.compile(r'^\s*"?(#+\s*BEGIN (?:SOLUTION|HIDDEN TESTS))\b', re.MULTILINE)  # "?: a notebook's raw JSON
IDENTITY = {"GIT_AUTHOR_NAME": "distlab student edition", "GIT_AUTHOR_EMAIL": "student-edition@example.invalid"}


class EditionError(RuntimeError):
    """The edition was not written, or holds something instructor-only; the message says what."""


def _git(where: Path, *args: str, stdin: str | None = None, env: dict | None = None) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=300)
    if done.returncode:
        raise EditionError(f"git {' '.join(args[:2])} in {where}: {done.stderr.strip()}")
    return done.stdout.strip()


def _tree_without(git, tree: str, folder: str = "") -> str:
    """A tree like ``tree`` (the repository's ``folder``, "" for its top) without the paths
    :func:`instructor_only` names, written with mktree."""
    entries = []
    for entry in git("ls-tree", "-z", tree).split("\0"):
        if not entry:
            continue
        info, name = entry.split("\t", 1)
        mode, kind, oid = info.split()
        path = folder + name
        if kind == "tree" and any(p.startswith(path + "/") for p in (*INSTRUCTOR_ONLY, *STUDENT_EDITION_KEEPS)):
            oid = _tree_without(git, oid, path + "/")    # a path below it is left out, or kept
        elif instructor_only(path):
            continue
        entries.append(f"{mode} {kind} {oid}\t{name}")
    return git("mktree", "-z", stdin="".join(e + "\0" for e in entries))


def write(dest: Path, repo: Path, commit: str = "HEAD", bare: bool = False) -> str:
    """Write the student edition of ``repo``'s ``commit`` into ``dest``; return its commit id.

    ``dest`` absent or empty: a new repository whose one commit has no parent (``bare`` for one
    served by ``git daemon``). ``dest`` an earlier edition: the new one becomes its child
    (nothing is committed when nothing changed). Refuses a ``dest`` that is not clean itself.
    """
    dest, repo = Path(dest).resolve(), Path(repo).resolve()
    source = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    known = solution_texts(repo, source)
    parent = None
    if dest.exists() and any(dest.iterdir()):
        found = findings(dest, known)
        if found:
            raise EditionError(f"{dest} is not a student edition, it holds: " + "; ".join(found[:5]))
        parent = _git(dest, "rev-parse", "--verify", f"refs/heads/{BRANCH}^{{commit}}")
    else:
        subprocess.run(["git", "init", "--quiet", *(["--bare"] if bare else []), str(dest)], check=True, timeout=60)
        _git(dest, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    # Borrow the instructor's objects while building; repack copies only what the commit reaches.
    env = {**os.environ, "GIT_ALTERNATE_OBJECT_DIRECTORIES": _git(repo, "rev-parse", "--path-format=absolute",
                                                                   "--git-path", "objects")}
    tree = _tree_without(lambda *a, stdin=None: _git(dest, *a, stdin=stdin, env=env), f"{source}^{{tree}}")
    if parent and tree == _git(dest, "rev-parse", f"{parent}^{{tree}}"):
        return parent
    if subprocess.run(["git", "-C", str(dest), "var", "GIT_AUTHOR_IDENT"], capture_output=True).returncode:
        env.update(IDENTITY, GIT_COMMITTER_NAME=IDENTITY["GIT_AUTHOR_NAME"],
                   GIT_COMMITTER_EMAIL=IDENTITY["GIT_AUTHOR_EMAIL"])
    message = (f"The course, student edition of {source[:12]}: without "
               + LEFT_OUT + " (python -m distlab.grade student-edition)")
    new = _git(dest, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message, env=env)
    _git(dest, "update-ref", f"refs/heads/{BRANCH}", new)
    _git(dest, "repack", "-a", "-d", "-q", env=env)
    _git(dest, "prune", "--expire=now")
    if not bare:
        _git(dest, "read-tree", "--reset", "-u", "HEAD")
    found = findings(dest, known)
    if found:
        raise EditionError(f"the edition in {dest} holds instructor-only content: " + "; ".join(found))
    return new


def command(dest: str, commit: str, repo: str, say) -> int:
    """``python -m distlab.grade student-edition DEST``: write it, say what and how to publish it."""
    start = time.monotonic()
    try:
        new = write(Path(dest), Path(repo), commit)
    except EditionError as exc:
        say(f"student-edition: {exc}")
        return 1
    changed = _git(Path(repo), "status", "--porcelain", "--untracked-files=no")
    say(f"student edition {new[:12]} of {commit} written to {dest} ({time.monotonic() - start:.1f} s), without "
        + LEFT_OUT + (" (uncommitted changes are not in it)" if changed else ""))
    say(f"publish it: git -C {dest} push <your public repository> {BRANCH}")
    return 0


def solution_texts(repo: Path, commit: str = "HEAD") -> list[str]:
    """The text of every solution and hidden test in ``repo``'s ``solutions/`` at ``commit``
    (lines stripped, comments and blank lines dropped): what :func:`findings` looks for in
    notebooks whose markers were taken out."""
    texts = []
    listing = _git(repo, "ls-tree", "-r", "-z", commit, "--", "solutions").split("\0")
    for data in _blobs(repo, [e.split()[2] for e in listing if e.endswith(".ipynb")]).values():
        for cell in _cells(data) or []:
            block = None
            for line in _source(cell).splitlines():
                if re.search(r"BEGIN (SOLUTION|HIDDEN TESTS)", line):
                    block = []
                elif re.search(r"END (SOLUTION|HIDDEN TESTS)", line) and block is not None:
                    texts.append("\n".join(block))
                    block = None
                elif block is not None and line.strip() and not line.strip().startswith("#"):
                    block.append(line.strip())
    return [t for t in texts if t]


def findings(repository: Path, known: list[str] = ()) -> list[str]:
    """What a clone of ``repository`` could get that students must not see, one line each.

    Every commit reachable from a ref: any :data:`INSTRUCTOR_ONLY` path or file named gradebook*.
    Every object they reach: a SQLite file (a gradebook), a nbgrader solution marker or hidden-test
    marker at the start of a line, and in a notebook a cell holding one of the ``known`` texts.
    """
    found: dict[str, str] = {}
    # Every path any reachable commit holds: each was added by some commit (against each parent
    # of a merge, -m), or is in a root commit.
    commit = ""
    for token in _git(repository, "log", "--all", "-m", "--root", "--no-renames", "--name-only", "-z",
                      "--format=%x01%H").split("\0"):
        token = token.lstrip("\n")
        if token.startswith("\x01"):
            commit = token[1:]
        elif token and (instructor_only(token) or "gradebook" in token.rsplit("/", 1)[-1]):
            found.setdefault(token, f"{token}: instructor-only file (commit {commit[:12]})")
    wanted = [f"\n{t}\n" for t in known]
    named = dict(line.split(" ", 1) for line in _git(repository, "rev-list", "--all", "--objects").splitlines()
                 if " " in line)
    for oid, data in _blobs(repository, list(named)).items():
        where = named[oid]
        if data.startswith(b"SQLite format 3\0"):
            found.setdefault(where, f"{where}: a SQLite database (a gradebook?)")
            continue
        cells = _cells(data) if data.lstrip()[:1] == b"{" else None
        if cells is None:  # any other file: a marker at the start of a line
            marker = MARKER.search(data.decode(errors="replace")) if b"BEGIN" in data else None
            if marker:
                found.setdefault(where, f"{where}: '{marker.group(1)}'")
            continue
        for i, cell in enumerate(cells):
            text = _source(cell)
            marker = MARKER.search(text)
            lines = "".join(f"\n{s.strip()}" for s in text.splitlines() if s.strip() and not s.strip().startswith("#"))
            lines += "\n"
            if marker or any(t in lines for t in wanted):
                what = f"'{marker.group(1)}'" if marker else "a solution or hidden test's text"
                found.setdefault(f"{where}#{i}", f"{where} cell {i}: {what}")
    return sorted(found.values())


def _blobs(repository: Path, oids: list[str]) -> dict[str, bytes]:
    """The contents of the blobs among ``oids`` (other objects are skipped), by object id."""
    batch = subprocess.run(["git", "-C", str(repository), "cat-file", "--batch"], input="\n".join(oids).encode() + b"\n",
                           capture_output=True, check=True, timeout=300).stdout
    out, at = {}, 0
    while at < len(batch):
        header_end = batch.index(b"\n", at)
        oid, kind, size = batch[at:header_end].decode().split()
        start = header_end + 1
        if kind == "blob":
            out[oid] = batch[start:start + int(size)]
        at = start + int(size) + 1
    return out


def _cells(data: bytes) -> list[dict] | None:
    """A notebook's cells, or None when ``data`` is not a notebook."""
    try:
        notebook = json.loads(data)
    except ValueError:
        return None
    return notebook["cells"] if isinstance(notebook, dict) and isinstance(notebook.get("cells"), list) else None


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)
