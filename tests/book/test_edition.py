"""The student edition (distlab.grade.author.edition): what the course publishes holds nothing instructor-only.

The edition is written from this repository and read back as a student's clone could read it:
every object reachable from any ref (``git rev-list --all --objects``), not only the files of
its last commit. The check it runs on itself (``edition.findings``) must find the solutions,
hidden tests and grader files where they are (this repository, and a history that deleted
them), and a second, plain check here reads every notebook of the edition without it.

Checked to fail on purpose: ``solutions`` taken out of ``INSTRUCTOR_ONLY``; the edition cloned
with its history (``git clone`` then a new commit on top) instead of a parentless commit; the
borrowed objects left to an alternates file instead of copied; the known-text search turned off;
a second edition written as a new parentless commit (students' copies then fail to pull it).
Git only, no ranks: the file runs in seconds.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nbgitpuller.pull import GitPuller

from distlab.grade.author import edition

REPO = Path(__file__).resolve().parents[2]
IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def files(where: Path, commit: str) -> dict[str, str]:
    """``{path: blob id}`` of every file of ``commit``."""
    entries = git(where, "ls-tree", "-r", "-z", commit).split("\0")
    return {e.split("\t", 1)[1]: e.split()[2] for e in entries if e}


def reachable_notebooks(where: Path) -> list[tuple[str, dict]]:
    """Every notebook a clone of ``where`` can get, in any commit: (path, parsed notebook)."""
    found = []
    for line in git(where, "rev-list", "--all", "--objects").splitlines():
        oid, _, path = line.partition(" ")
        if path.endswith(".ipynb"):
            found.append((path, json.loads(git(where, "cat-file", "blob", oid))))
    return found


@pytest.fixture(scope="module")
def source() -> str:
    """The instructor commit the edition is written from (HEAD now; others may commit meanwhile)."""
    return git(REPO, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def student(tmp_path_factory, source) -> Path:
    dest = tmp_path_factory.mktemp("edition") / "distlab"
    edition.write(dest, REPO, source)
    return dest


def test_the_edition_is_one_parentless_commit_that_stores_nothing_else(student):
    commits = git(student, "rev-list", "--all").split()
    assert len(commits) == 1, commits
    assert not re.search(r"^parent ", git(student, "cat-file", "-p", commits[0]), re.MULTILINE)
    assert git(student, "rev-parse", f"refs/heads/{edition.BRANCH}") == commits[0]
    assert git(student, "for-each-ref", "--format=%(refname)").split() == [f"refs/heads/{edition.BRANCH}"]
    # Every object stored is one the commit reaches (a copied folder holds no more than a
    # clone gets), and they are its own: no alternates file borrowing the instructor's.
    stored = {line.split()[0] for line in git(student, "cat-file", "--batch-all-objects", "--batch-check").splitlines()}
    reachable = {line.split()[0] for line in git(student, "rev-list", "--all", "--objects").splitlines()}
    assert stored == reachable
    assert not (student / ".git" / "objects" / "info" / "alternates").exists()
    git(student, "fsck", "--full", "--strict", "--no-dangling")


def test_the_edition_is_the_instructor_tree_without_the_instructor_only_paths(student, source):
    theirs, ours = files(REPO, source), files(student, "HEAD")
    dropped = {p for p in theirs if edition.instructor_only(p)}
    assert {p.split("/")[0] for p in dropped} >= {"solutions", "grader", "tests"}
    assert ours == {p: oid for p, oid in theirs.items() if p not in dropped}
    # The working tree is checked out: the book builds from it as it is.
    on_disk = {str(p.relative_to(student)) for p in student.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert on_disk == set(ours)


def test_no_solution_cell_hidden_test_or_grader_file_anywhere_in_the_editions_history(student, source):
    known = edition.solution_texts(REPO, source)
    assert len(known) >= 2 * len([p for p in files(REPO, source) if p.startswith("solutions/")])
    assert edition.findings(student, known) == []
    # And read plainly, without edition.findings: the released notebooks are there, each
    # answer cell a stub, no cell holds a solution or a hidden test.
    notebooks = reachable_notebooks(student)
    assert {p for p, _ in notebooks} >= {p for p in files(REPO, source) if p.startswith("notebooks/")}
    for path, notebook in notebooks:
        for cell in notebook["cells"]:
            text = "".join(cell["source"])
            assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text, path
            if cell["metadata"].get("nbgrader", {}).get("solution") and cell["cell_type"] == "code":
                assert "raise NotImplementedError" in text, (path, cell["metadata"]["nbgrader"]["grade_id"])
    paths = set(files(student, "HEAD"))
    assert not [p for p in paths if edition.instructor_only(p) or "gradebook" in p]


def test_the_check_finds_them_in_the_instructor_repository(source):
    found = "\n".join(edition.findings(REPO, edition.solution_texts(REPO, source)))
    slugs = [p.split("/")[1] for p in files(REPO, source) if re.fullmatch(r"solutions/[^/]+/[^/]+\.ipynb", p)]
    assert slugs
    for slug in slugs:
        assert re.search(rf"solutions/{slug}/{slug}\.ipynb cell \d+: '### BEGIN SOLUTION'", found), slug
        assert re.search(rf"solutions/{slug}/{slug}\.ipynb cell \d+: '### BEGIN HIDDEN TESTS'", found), slug
    assert "grader/nbgrader_config.py: instructor-only file" in found
    assert re.search(r"^tests/(\w+/)?test_\w+\.py: instructor-only file", found, re.MULTILINE)


def test_the_check_reads_the_whole_history_and_knows_a_solution_without_its_markers(tmp_path, source):
    """A repository whose last commit deleted a solved notebook (markers taken out), a gradebook
    and a file of hidden tests: all three are still in its history, and found there."""
    solved = json.loads(git(REPO, "show", f"{source}:solutions/03-ddp/03-ddp.ipynb"))
    for cell in solved["cells"]:
        lines = "".join(cell["source"]).splitlines(keepends=True)
        cell["source"] = [line for line in lines if "BEGIN SOLUTION" not in line and "END SOLUTION" not in line]
        cell["metadata"].pop("nbgrader", None)
        if "HIDDEN TESTS" in "".join(lines):
            cell["source"] = []
    repo = tmp_path / "leaky"
    git(tmp_path, "init", "--quiet", str(repo))
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "solved.ipynb").write_text(json.dumps(solved))
    with sqlite3.connect(repo / "course.db") as db:
        db.execute("create table grade (student text, score real)")
    (repo / "notes.py").write_text("x = 1\n    ### BEGIN HIDDEN TESTS\nassert x == 1\n")
    (repo / "README.md").write_text("a course\n")
    git(repo, "add", ".")
    git(repo, *IDENTITY, "commit", "--quiet", "-m", "everything")
    git(repo, *IDENTITY, "rm", "--quiet", "notebooks/solved.ipynb", "course.db", "notes.py")
    git(repo, *IDENTITY, "commit", "--quiet", "-m", "students must not see these")
    assert set(files(repo, "HEAD")) == {"README.md"}

    found = "\n".join(edition.findings(repo, edition.solution_texts(REPO, source)))
    assert re.search(r"^notebooks/solved\.ipynb cell \d+: a solution or hidden test's text$", found, re.MULTILINE)
    assert "course.db: a SQLite database (a gradebook?)" in found
    assert "notes.py: '### BEGIN HIDDEN TESTS'" in found
    # Such a folder is never taken for an earlier edition to add to.
    with pytest.raises(edition.EditionError, match="not a student edition"):
        edition.write(repo, REPO, source)
    assert len(git(repo, "rev-list", "--all").split()) == 2


def test_writing_into_an_earlier_edition_adds_a_child_that_students_copies_pull(tmp_path):
    instructor = tmp_path / "instructor"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(instructor)], check=True, timeout=120)
    public = tmp_path / "public"
    first = edition.write(public, instructor)
    assert edition.write(public, instructor) == first          # nothing changed, nothing committed
    # A student's copy, as a launch link makes it, with work of their own in it.
    student = tmp_path / "student"
    list(GitPuller(f"file://{public}", str(student), branch=edition.BRANCH).pull())
    (student / "notebooks" / "mine.txt").write_text("my notes\n")
    with (instructor / "README.md").open("a") as readme:
        readme.write("\nOne more line.\n")
    git(instructor, *IDENTITY, "commit", "--quiet", "-am", "a change to publish")
    second = edition.write(public, instructor)
    # The next launch pulls the new edition into it (nbgitpuller merges; an unrelated history
    # would make that merge fail) and keeps the student's work.
    list(GitPuller(f"file://{public}", str(student), branch=edition.BRANCH).pull())
    assert (student / "README.md").read_text().endswith("One more line.\n")
    assert (student / "notebooks" / "mine.txt").read_text() == "my notes\n"
    assert git(public, "rev-list", "--all").split() == [second, first]
    assert git(public, "rev-parse", f"{second}^") == first
    assert git(public, "rev-list", "--max-parents=0", "--all") == first
    assert (public / "README.md").read_text().endswith("One more line.\n")
    assert edition.findings(public, edition.solution_texts(instructor)) == []
    # The instructor's repository is never a destination: it is refused, and left as it was.
    head = git(instructor, "rev-parse", "HEAD")
    with pytest.raises(edition.EditionError, match="not a student edition"):
        edition.write(instructor, instructor)
    assert git(instructor, "rev-parse", "HEAD") == head


def test_a_module_added_to_grade_author_later_stays_out_and_the_named_ones_stay_in(tmp_path):
    """grade/author/ is left out as a folder: an author's tool added there later, which nobody
    thought to name (here one holding a task's answer), is not published; the files the edition
    keeps by name (its own check, which the published workflow runs) are."""
    instructor = tmp_path / "instructor"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(instructor)], check=True, timeout=120)
    added = "src/distlab/grade/author/marking_notes.py"
    (instructor / added).write_text('"""Notes for the markers."""\n\nTASK_1_ANSWER = "dist.all_reduce(t)"\n')
    git(instructor, "add", added)
    git(instructor, *IDENTITY, "commit", "--quiet", "-m", "an author's tool nobody named")
    assert edition.instructor_only(added)
    public = tmp_path / "public"
    edition.write(public, instructor)
    published = set(files(public, "HEAD"))
    assert added not in published and not (public / added).exists()
    assert set(edition.STUDENT_EDITION_KEEPS) <= published
    assert not [p for p in published if p.startswith("src/distlab/grade/author/")
                and p not in edition.STUDENT_EDITION_KEEPS]
    assert "src/distlab/grade/author/marking_notes.py: instructor-only file" in "\n".join(
        edition.findings(instructor))


def test_the_command_writes_it_and_says_how_to_publish(tmp_path):
    dest = tmp_path / "public"
    done = subprocess.run([sys.executable, "-m", "distlab.grade", "student-edition", str(dest)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"git -C {dest} push" in done.stdout
    assert len(git(dest, "rev-list", "--all").split()) == 1
    assert not (dest / "solutions").exists() and (dest / "notebooks").is_dir()
    refused = subprocess.run([sys.executable, "-m", "distlab.grade", "student-edition", str(REPO)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "not a student edition" in refused.stdout


def test_the_edition_has_everything_the_book_and_its_launch_links_need(student, source):
    """What `make book` reads (the toc's pages, the config's paths, the pages' includes, the
    Makefile's prerequisites) and what a launch link opens are all in the edition."""
    present = set(files(student, "HEAD"))
    toc = yaml.safe_load((student / "_toc.yml").read_text())
    pages, globs = [toc["root"]], []

    def walk(entries):
        for entry in entries or []:
            pages.extend([entry["file"]] if "file" in entry else [])
            globs.extend([entry["glob"]] if "glob" in entry else [])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))
    walk(toc["parts"])
    missing = [p for p in pages if not {f"{p}.md", f"{p}.ipynb"} & present]
    assert not missing
    assert globs == ["notebooks/*/*"]
    launched = sorted(p for p in present if re.fullmatch(r"notebooks/([^/]+)/\1\.ipynb", p))
    assert launched and launched == sorted(p for p in files(REPO, source) if re.fullmatch(r"notebooks/([^/]+)/\1\.ipynb", p))

    config = yaml.safe_load((student / "_config.yml").read_text())
    assert config["repository"]["branch"] == edition.BRANCH
    sphinx = config["sphinx"]["config"]
    needed = [*config["bibtex_bibfiles"], config["html"]["favicon"], *sphinx["html_extra_path"],
              *sphinx["html_static_path"], sphinx["distlab_source_dir"], *config["sphinx"]["local_extensions"].values()]
    for page in student.glob("book/**/*.md"):
        for target in re.findall(r"```\{(?:literalinclude|include)\} (\S+)", page.read_text()):
            needed.append(str((page.parent / target).resolve().relative_to(student)))
    stamp = re.search(r"^\$\(STAMP\): (.+)$", (student / "Makefile").read_text(), re.MULTILINE).group(1).split()
    needed += stamp + [".github/workflows/book.yml"]
    assert not [n for n in needed if not (student / n).exists()], needed


@pytest.mark.parametrize("edition_of", ["student", "instructor"])
def test_the_pages_workflow_publishes_the_student_edition_only(student, edition_of, tmp_path):
    """.github/workflows/book.yml builds and deploys only where its first job says "student"."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "book.yml").read_text())
    jobs = workflow["jobs"]
    assert jobs["build"]["needs"] == "edition" and jobs["build"]["if"] == "needs.edition.outputs.student == 'true'"
    assert jobs["deploy"]["needs"] == "build"
    script = next(step["run"] for step in jobs["edition"]["steps"] if step.get("id") == "which")
    output = tmp_path / "github_output"
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=student if edition_of == "student" else REPO,
                   env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(output)}, check=True, timeout=30)
    assert output.read_text() == f"student={'true' if edition_of == 'student' else 'false'}\n"
