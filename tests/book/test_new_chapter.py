"""``python -m distlab.grade new-chapter``, tried as a new contributor would, in a copy of the repository.

The command runs in a scratch clone of this working tree (never the tree itself), then, as the
guide's "Adding a chapter" says: release, and ``make test-chapter``. Outside its own folders the
new chapter must change, by hand, only the registry and ``_toc.yml`` (the three lists of
chapters are rewritten from the registry, and nothing else in them changes), be lint-clean,
and pass its chapter's gates (its page executed and checked, its own tests, its grading, the
package's checks, the registry's checks) before anyone edits it, with only a multiple-choice
concept question. The fast tests check the sample's question kinds and the refusals.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from process_support import run_in_own_group

from distlab import chapters
from distlab.grade import exercise
from distlab.grade.author import authoring, book_checks, chapter_rows, new_chapter, new_chapter_text

REPO = Path(__file__).resolve().parents[2]
TITLE = "A sample chapter"

NAMED = {"test_the_three_lists_of_chapters_are_what_the_registry_gives",
         "test_each_list_has_a_row_per_chapter_with_its_number_title_package_and_page"}
"""The checks of the three places that list every chapter: the command writes them from the registry."""
ABOUT = "a worked sample of a chapter, before its author replaces it with the chapter's own."
"""What the chapter is about, given with --about: the reading path's description."""


def copy_of_the_working_tree(target: Path) -> Path:
    """Every file git tracks or would track (ignored ones, .venv and _build, left out). A listed
    file missing from the working tree (a deletion not committed yet) is left out and named: a
    silent skip once left only a confusing symptom, when a release still deleted ``notebooks/``
    for a moment (distlab.grade.pipeline.release now replaces its files in place)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    absent = []
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
        elif not source.is_dir():
            absent.append(name)
    if absent:
        print(f"copy of the working tree: {len(absent)} listed file(s) absent, left out: {absent[:10]}")
    return target


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def diff(old: bytes, new: bytes) -> tuple[list[str], list[str], int]:
    """The lines a change added and removed, and the index in ``new`` of the first line it added."""
    a, b = old.decode().splitlines(), new.decode().splitlines()
    added, removed, first = [], [], None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        removed += a[i1:i2] if tag in ("replace", "delete") else []
        added += b[j1:j2] if tag in ("replace", "insert") else []
        first = j1 if first is None and tag != "equal" else first
    return added, removed, first


def assert_only_the_registry_and_the_toc_were_kept_by_hand(repo: Path, before: dict, after: dict, number: int,
                                                         slug: str, package: str):
    """Outside the chapter's own folders the command changed the registry and _toc.yml, each by
    the new chapter's lines alone, and the three lists of chapters, which are now exactly what
    ``chapter-rows`` writes from the new registry (no hand-kept row anywhere)."""
    changes = {name: diff(before[name], after[name]) for name in before if after.get(name) != before[name]}
    assert set(changes) == {"src/distlab/chapters.py", "_toc.yml", *chapter_rows.PLACES}, sorted(changes)
    assert not any("TODO" in line for added, _, _ in changes.values() for line in added)
    added, removed, _ = changes["src/distlab/chapters.py"]
    assert not removed and f'"{slug}", "{TITLE}", "{package}"' in added[0], added
    assert f"about={json.dumps(ABOUT)}," in "\n".join(added), added
    assert changes["_toc.yml"][:2] == ([f"      - file: book/{slug}/index"], []), changes["_toc.yml"]
    assert chapter_rows.stale(repo, chapter_rows.load(repo)) == [], "the lists are not what the registry gives"

    added, removed, _ = changes[chapter_rows.README]
    assert not removed and added == [f"| {number} {TITLE} | `{package}` | `reference` (`sum_of_squares`) |"], added
    added, removed, _ = changes[chapter_rows.INTRO]
    assert not removed and " ".join(" ".join(added).split()) == f"{number}. **[{TITLE}]({slug}/index.md)**: {ABOUT}"
    added, _, _ = changes[chapter_rows.MAP]
    row = next(line for line in added if line.startswith(f"{number} "))
    assert re.match(rf"{number} +{TITLE} +:mod:`{package}` +``reference`` \(``sum_of_squares``\)$", row), row


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_new_chapter_releases_and_passes_make_test_chapter_before_anyone_edits_it(tmp_path):
    """With only a multiple-choice question (``--questions choice``), in a scratch clone."""
    number = chapters.CHAPTERS[-1].number + 1
    slug = f"{number:02d}-sample-chapter"
    package = new_chapter.package_for(slug)
    repo = copy_of_the_working_tree(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)   # test_package_copy reads what git lists
    short_tmp = Path(tempfile.mkdtemp(prefix="nc-", dir="/tmp"))   # rank sockets live below it: keep it short
    report = tmp_path / "gates.xml"
    env = dict(os.environ, PYTHONPATH=str(repo / "src"), DISTLAB_GRADE_WORK=str(tmp_path / "work"),
               TMPDIR=str(short_tmp), PYTEST_ADDOPTS=f"-p no:cacheprovider --junitxml={report}")
    env.pop("DISTLAB_TEST_CHAPTER", None)
    timings = {}

    def step(name, argv, timeout):
        start = time.monotonic()
        proc = run_in_own_group(argv, timeout, cwd=repo, env=env)
        timings[name] = time.monotonic() - start
        return proc

    try:
        before = files_of(repo)
        argv = [sys.executable, "-m", "distlab.grade", "new-chapter", slug, TITLE, "--about", ABOUT, "--questions", "choice"]
        made = step("new-chapter", argv, 120)
        assert made.returncode == 0, made.stdout + made.stderr
        assert "make test-chapter CHAPTER=" + slug in made.stdout
        after = files_of(repo)
        added = set(after) - set(before)
        assert_only_the_registry_and_the_toc_were_kept_by_hand(repo, before, after, number, slug, package)
        assert added == {f"book/{slug}/index.md", f"solutions/{slug}/{slug}.ipynb", f"tests/chapters/test_chapter{number:02d}.py",
                         "src/distlab/sample_chapter/__init__.py", "src/distlab/sample_chapter/reference.py"}, added
        assert not (REPO / "solutions" / slug).exists(), "the command wrote into the working tree, not the copy"
        again = step("new-chapter again", argv, 120)
        assert again.returncode == 2 and "exists already" in again.stdout, again.stdout

        notebook = json.loads((repo / "solutions" / slug / f"{slug}.ipynb").read_text())
        cells = {cell["id"]: "".join(cell["source"]) for cell in notebook["cells"]}
        assert list(cells) == ["intro", "setup", "task1-text", "task1-answer", "task1-tests", "concepts-text",
                               "concepts-answer", "concept-a-tests", "outro"]
        assert "check_choice(" in cells["concept-a-tests"] and "check_number(" not in cells["concept-a-tests"]
        assert all(cell["metadata"]["nbgrader"]["grade_id"] == cell["id"] for cell in notebook["cells"])
        for piece in (exercise.rules_text([package]), exercise.grading_text(), exercise.tolerances_text("results")):
            assert piece in cells["intro"], "the notebook's text should come from distlab.grade.exercise"
        assert "exercise.on_ranks(" in cells["setup"] and "def _each_case" not in cells["setup"]
        assert ABOUT.rstrip(".") in (repo / "src" / "distlab" / "sample_chapter" / "__init__.py").read_text()

        lint = step("ruff", [str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", *sorted(added)], 120)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        released = step("release", [sys.executable, "-m", "distlab.grade", "release", slug], 600)
        assert released.returncode == 0, released.stdout + released.stderr
        assert (repo / "notebooks" / slug / f"{slug}.ipynb").is_file()

        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        gates = step("make test-chapter", ["make", "--no-print-directory", "test-chapter", f"CHAPTER={slug}",
                                           f"VENV={Path(sys.executable).parent.parent}"], 1500)
        assert gates.returncode == 0, (gates.stdout + gates.stderr)[-8000:]
        assert f"page book/{slug}/index.md: executed in" in gates.stdout, gates.stdout[-4000:]
        assert "[55.0, 55.0]" in json.dumps(page_outputs(repo, slug)), "the page's cell did not run the reference"
        outcomes = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            failure = case.find("failure") if case.find("failure") is not None else case.find("error")
            outcomes[case.get("name")] = None if failure is None else failure.get("message", "")
        assert not [name for name, message in outcomes.items() if message is not None], gates.stdout[-6000:]
        ran = set(outcomes)
        assert NAMED <= ran, sorted(ran)
        assert {"test_a_sum_over_one_rank_only_loses_its_task", f"test_concept_answers_are_computed_and_wrong_ones_get_a_hint[{slug}]",
                "test_solutions_score_full_marks_and_blank_releases_zero",
                "test_each_task_is_graded_on_2_and_4_ranks_with_the_grading_seed",
                "test_no_graded_solution_is_a_near_copy_of_the_package_students_import",
                "test_every_module_has_a_docstring_that_teaches"} <= ran, sorted(ran)
        assert not any("test_a_broken_earlier_task" in name for name in ran), "another chapter's grading ran"
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
        print("new-chapter test, seconds per step:", {k: round(v, 1) for k, v in timings.items()})


def page_outputs(repo: Path, slug: str) -> list:
    """The outputs make page left in the clone's execution cache for the chapter's page."""
    from distlab.grade.author import page_check

    notebook, how, error = page_check.execute(repo / "book" / slug / "index.md", repo)
    assert how.startswith("outputs from the cache") and error is None, how
    return [cell.get("outputs", []) for cell in notebook.cells if cell.cell_type == "code"]


def test_new_chapter_refuses_a_malformed_slug_or_package_and_a_chapter_that_exists(tmp_path):
    """Checked before anything is written (here against this repository, which stays as it is)."""
    refusals = {("8-x", None): "a slug is NN-name", ("08-Context", None): "a slug is NN-name",
                ("08-x", "torch.x"): "distlab.<lowercase name>", ("08-x", "distlab." + "Bad"): "distlab.<lowercase name>",
                (chapters.CHAPTERS[-1].slug[:3] + "again", None): "exists already",
                ("00-zero", None): "exists already"}
    if chapters.CHAPTERS[-1].number > 1:
        refusals[(f"{chapters.CHAPTERS[-1].number - 1:02d}-x", None)] = "exists already"
    for (slug, package), reason in refusals.items():
        with pytest.raises(ValueError, match=re.escape(reason)):
            new_chapter.make(REPO, slug, TITLE, ABOUT, package)
    assert new_chapter.package_for("08-context-parallel") == "distlab." + "context_parallel"


def test_new_chapter_refuses_before_writing_anything_a_chapter_it_cannot_place(tmp_path):
    """Where one of the three lists of chapters has lost its bounds, or no description is given."""
    places = ["src/distlab/chapters.py", "_toc.yml", "_config.yml", book_checks.GLOSSARY, *chapter_rows.PLACES]
    without_bounds = {
        chapter_rows.MAP: lambda text: text.replace("===", "---"),
        chapter_rows.README: lambda text: text.replace(chapter_rows.END, ""),
        chapter_rows.INTRO: lambda text: chapter_rows.BEGIN.sub("", text)}
    slug = f"{chapters.CHAPTERS[-1].number + 1:02d}-sample-chapter"
    for broken, edit in without_bounds.items():
        repo = tmp_path / broken.replace("/", "_")
        for name in places:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
        (repo / broken).write_text(edit((repo / broken).read_text()))
        before = files_of(repo)
        with pytest.raises(ValueError, match=re.escape(broken) + ": no"):
            new_chapter.make(repo, slug, TITLE, ABOUT)
        assert files_of(repo) == before, f"{broken}: the command wrote something before it refused"
    with pytest.raises(ValueError, match="--about"):
        new_chapter.make(tmp_path / chapter_rows.README.replace("/", "_"), slug, TITLE, "  ")


def scratch_repo(tmp_path: Path) -> Path:
    """What ``new_chapter.make`` reads and writes, copied: the registry, the toc, the config, the
    three lists of chapters, and the solutions (the spread of right letters is read from them)."""
    repo = tmp_path / "repo"
    for name in ["src/distlab/chapters.py", "_toc.yml", "_config.yml", book_checks.GLOSSARY, *chapter_rows.PLACES]:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, repo / name)
    shutil.copytree(REPO / "solutions", repo / "solutions")
    return repo


def test_new_chapter_refuses_an_about_that_uses_a_glossary_term_unlinked(tmp_path):
    """Chapter 8's --about put "ring attention" unlinked into the book's introduction, and
    test_book failed only after every file was written. The command now refuses first, names
    the term and the link to write; the same sentence with the link goes through."""
    repo = scratch_repo(tmp_path)
    slug = f"{chapters.CHAPTERS[-1].number + 1:02d}-sample-chapter"
    before = files_of(repo)
    with pytest.raises(ValueError, match=r"--about uses glossary terms without linking them: 'ring attention'.*"
                                         r"\{term\}`ring attention`"):
        new_chapter.make(repo, slug, TITLE, "splitting a long sequence across ranks with ring attention")
    assert files_of(repo) == before, "the command wrote something before it refused"
    written, _ = new_chapter.make(repo, slug, TITLE, "splitting a long sequence across {term}`ranks <rank>` "
                                                     "with {term}`ring attention`")
    assert any(path.name == "chapters.py" for path in written)


@pytest.mark.parametrize("questions", sorted(new_chapter.QUESTIONS))
def test_the_sample_has_the_question_kinds_asked_for_and_they_grade(tmp_path, questions):
    """``--questions both|number|choice``: each kind's question passes with the solution's answer,
    and every wrong answer fails with a hint naming the chapter's page; the multiple-choice one
    has its right option on the letter right least often, and that option is not the longest."""
    from distlab.grade.checks import CheckFailed

    repo = scratch_repo(tmp_path)
    least = authoring.least_used_letter(REPO)
    slug = f"{chapters.CHAPTERS[-1].number + 1:02d}-sample-chapter"
    new_chapter.make(repo, slug, TITLE, ABOUT, questions=questions)
    notebook = json.loads((repo / "solutions" / slug / f"{slug}.ipynb").read_text())
    cells = {cell["id"]: "".join(cell["source"]) for cell in notebook["cells"]}
    kinds = new_chapter.QUESTIONS[questions]
    labels = "abcd"[:len(kinds)]
    assert [g for g in cells if g.startswith("concept-")] == [f"concept-{label}-tests" for label in labels]
    answers: dict = {}
    exec(cells["concepts-answer"].replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""), answers)  # noqa: S102
    for label, kind in zip(labels, kinds):
        test = cells[f"concept-{label}-tests"]
        name = "why_add_first" if kind == "choice" else "squares_added"
        assert f"**({label})**" in cells["concepts-text"] and f"`{name}`" in cells["concepts-text"]
        exec(test, dict(answers))  # noqa: S102 - the scaffold's own hidden test, on the solution's answer
        wrong = [x for x in "abcd" if x != answers[name]] if kind == "choice" else [answers[name] + 1]
        for bad in wrong:
            with pytest.raises(CheckFailed, match=r"index\.md"):
                exec(test, {**answers, name: bad})  # noqa: S102
    if "choice" in kinds:
        assert answers["why_add_first"] == least
        options = dict(re.findall(r'^\* `"([a-d])"` — (.*)$', cells["concepts-text"], re.M))
        assert options[least] == new_chapter_text.CHOICE_RIGHT and len(options) == 4
        assert len(options[least]) < max(len(text) for text in options.values()), "the right option is the longest"
    assert (f"{len(kinds)} points" if len(kinds) > 1 else "(1 point)") in cells["concepts-text"]


def test_a_package_written_before_its_chapter_is_kept_and_only_what_it_lacks_is_added(tmp_path, monkeypatch):
    """Chapter 8's package landed before its chapter: the command keeps every file of it as it was,
    adds the sample's ``reference.py`` beside them, says which files it kept, and still writes the
    rest of the chapter. A package that has a ``reference.py`` of its own is refused before
    anything is written (the sample would overwrite it)."""
    from distlab.grade import config

    repo = scratch_repo(tmp_path)
    slug = f"{chapters.CHAPTERS[-1].number + 1:02d}-sample-chapter"
    folder = repo / "src" / "distlab" / "sample_chapter"
    folder.mkdir(parents=True)
    own = {folder / "__init__.py": '"""A package its author wrote first, with a docstring of its own."""\n',
           folder / "ring.py": '"""Ring attention, written before the chapter."""\n\nSTEPS = 3\n'}
    for path, text in own.items():
        path.write_text(text)
    monkeypatch.setattr(config, "repo_root", lambda: str(repo))
    said = []
    assert new_chapter.command(slug, TITLE, ABOUT, None, said.append) == 0, said
    assert {path: path.read_text() for path in own} == own, "a file of the existing package was overwritten"
    assert "def sum_of_squares" in (folder / "reference.py").read_text()
    for name in ("__init__.py", "ring.py"):
        assert f"new-chapter: kept src/distlab/sample_chapter/{name} (the package existed: nothing in it was overwritten)" in said
    assert "new-chapter: wrote src/distlab/sample_chapter/reference.py" in said
    assert not any(line == "new-chapter: wrote src/distlab/sample_chapter/__init__.py" for line in said)
    for made in (f"book/{slug}/index.md", f"solutions/{slug}/{slug}.ipynb", f"tests/chapters/test_chapter{slug[:2]}.py"):
        assert (repo / made).is_file(), made
    assert f'Chapter("{slug}"' in (repo / "src" / "distlab" / "chapters.py").read_text()

    again = scratch_repo(tmp_path / "again")
    folder = again / "src" / "distlab" / "sample_chapter"
    folder.mkdir(parents=True)
    (folder / "reference.py").write_text('"""The author\'s own reference."""\n')
    before = files_of(again)
    with pytest.raises(ValueError, match=r"reference\.py exists already"):
        new_chapter.make(again, slug, TITLE, ABOUT)
    assert files_of(again) == before, "the command wrote something before it refused"
