"""``python -m distlab.grade new-chapter``, tried as a new contributor would, in a copy of the repository.

The command runs in a temporary copy of this working tree (never the tree itself), then, as
the guide's "Adding a chapter" says: release, and the chapter's gates. The new chapter must
touch only its own places plus the registry entry, the toc and one row in each of the three
places that name every chapter in prose (the chapter map of distlab/__init__.py, the README's
table, the reading path of book/intro.md), be lint-clean, run its page's code, and pass its own
tests (grading included) and every per-chapter gate of the other test files, those three
places' checks included, before anyone edits it.
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
from distlab.grade import chapter_rows, exercise, new_chapter

REPO = Path(__file__).resolve().parent.parent
TITLE = "A sample chapter"

GATES = [  # per-chapter checks of the other test files, for the new chapter alone (DISTLAB_TEST_CHAPTER)
    "tests/test_grading.py::test_notebooks_folder_is_a_fresh_release_of_solutions",
    "tests/test_grading.py::test_release_contains_no_solution_code_and_no_hidden_tests",
    "tests/test_grading.py::test_no_hidden_test_line_is_also_a_line_of_the_solution",
    "tests/test_grading.py::test_the_setup_cell_forbids_exactly_what_the_notebook_metadata_lists",
    "tests/test_grading.py::test_concept_answers_are_computed_and_wrong_ones_get_a_hint",
    "tests/test_grading.py::test_every_concept_hint_names_a_page_that_corrects_it",
    "tests/test_grading.py::test_no_concept_question_repeats_another_chapters",
    "tests/test_grading.py::test_multiple_choice_answers_are_spread_and_not_given_away_by_length",
    "tests/test_book.py::test_every_page_in_the_toc_exists_and_executable_pages_have_jupytext_metadata",
    "tests/test_book.py::test_every_page_links_the_glossary_terms_it_uses",
    "tests/test_book.py::test_term_links_are_spelled_as_the_glossary_spells_the_term",
    "tests/test_book.py::test_every_exercise_notebook_links_back_to_the_pages_it_rests_on",
    "tests/test_package.py::test_every_module_has_a_docstring_that_teaches",
    "tests/test_package.py::test_no_import_cycle_between_modules",
    "tests/test_package.py::test_the_warm_ranks_preload_every_module_of_the_reference_packages",
    "tests/test_chapters.py",
]
NAMED = {"test_the_three_lists_of_chapters_are_what_the_registry_gives",
         "test_each_list_has_a_row_per_chapter_with_its_number_title_package_and_page"}
"""The checks of the three places that list every chapter: the command writes them from the registry."""
ABOUT = "a worked sample of a chapter, before its author replaces it with the chapter's own."
"""What the chapter is about, given with --about: the reading path's description."""


def copy_of_the_working_tree(target: Path) -> Path:
    """Every file git tracks or would track (ignored ones, .venv and _build, left out). A listed
    file missing from the working tree (a deletion not committed yet) is left out and named: a
    silent skip once left only a confusing symptom, when a release still deleted ``notebooks/``
    for a moment (distlab.grade.release now replaces its files in place)."""
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
@pytest.mark.timeout(1500)
def test_a_new_chapter_releases_and_passes_its_gates_before_anyone_edits_it(tmp_path):
    number = chapters.CHAPTERS[-1].number + 1
    slug = f"{number:02d}-sample-chapter"
    package = new_chapter.package_for(slug)
    repo = copy_of_the_working_tree(tmp_path / "repo")
    short_tmp = Path(tempfile.mkdtemp(prefix="nc-", dir="/tmp"))   # rank sockets live below it: keep it short
    env = dict(os.environ, PYTHONPATH=str(repo / "src"), DISTLAB_GRADE_WORK=str(tmp_path / "work"),
               DISTLAB_TEST_CHAPTER=slug, TMPDIR=str(short_tmp))
    timings = {}

    def step(name, argv, timeout):
        start = time.monotonic()
        proc = run_in_own_group(argv, timeout, cwd=repo, env=env)
        timings[name] = time.monotonic() - start
        return proc

    try:
        before = files_of(repo)
        made = step("new-chapter", [sys.executable, "-m", "distlab.grade", "new-chapter", slug, TITLE,
                                    "--about", ABOUT], 120)
        assert made.returncode == 0, made.stdout + made.stderr
        assert "make test-chapter CHAPTER=" + slug in made.stdout
        after = files_of(repo)
        added = set(after) - set(before)
        assert_only_the_registry_and_the_toc_were_kept_by_hand(repo, before, after, number, slug, package)
        assert added == {f"book/{slug}/index.md", f"solutions/{slug}/{slug}.ipynb", f"tests/test_chapter{number:02d}.py",
                         "src/distlab/sample_chapter/__init__.py", "src/distlab/sample_chapter/reference.py"}, added
        assert not (REPO / "solutions" / slug).exists(), "the command wrote into the working tree, not the copy"
        assert f'"{slug}", "{TITLE}", "{package}"' in (repo / "src" / "distlab" / "chapters.py").read_text()
        again = step("new-chapter again", [sys.executable, "-m", "distlab.grade", "new-chapter", slug, TITLE,
                                           "--about", ABOUT], 120)
        assert again.returncode == 2 and "exists already" in again.stdout, again.stdout

        notebook = json.loads((repo / "solutions" / slug / f"{slug}.ipynb").read_text())
        cells = {cell["id"]: "".join(cell["source"]) for cell in notebook["cells"]}
        assert list(cells) == ["intro", "setup", "task1-text", "task1-answer", "task1-tests", "concepts-text",
                               "concepts-answer", "concept-a-tests", "outro"]
        assert all(cell["metadata"]["nbgrader"]["grade_id"] == cell["id"] for cell in notebook["cells"])
        for piece in (exercise.rules_text([package]), exercise.grading_text(), exercise.tolerances_text("results")):
            assert piece in cells["intro"], "the notebook's text should come from distlab.grade.exercise"
        assert "exercise.on_ranks(" in cells["setup"] and "def _each_case" not in cells["setup"]

        lint = step("ruff", [str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", *sorted(added)], 120)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        page = (repo / "book" / slug / "index.md").read_text()
        code = "\n".join(re.findall(r"```\{code-cell\} ipython3\n(.*?)```", page, re.S))
        shown = step("page code", [sys.executable, "-c", code.replace("\ndistlab.run(", "\nprint(distlab.run(") + ")"], 300)
        assert shown.returncode == 0 and "[55.0, 55.0]" in shown.stdout, shown.stdout + shown.stderr

        released = step("release", [sys.executable, "-m", "distlab.grade", "release", slug], 600)
        assert released.returncode == 0, released.stdout + released.stderr
        assert (repo / "notebooks" / slug / f"{slug}.ipynb").is_file()

        report = tmp_path / "gates.xml"
        gates = step("gates", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                               f"tests/test_chapter{number:02d}.py", *GATES], 1200)
        outcomes = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            failure = case.find("failure") if case.find("failure") is not None else case.find("error")
            outcomes[case.get("name")] = None if failure is None else failure.get("message", "")
        failed = {re.sub(r"\[.*", "", name): message for name, message in outcomes.items() if message is not None}
        assert not failed, gates.stdout[-6000:]
        ran = set(outcomes)
        assert NAMED <= ran, sorted(ran)
        assert {"test_a_sum_over_one_rank_only_loses_its_task", f"test_concept_answers_are_computed_and_wrong_ones_get_a_hint[{slug}]",
                "test_each_task_is_graded_on_2_and_4_ranks_with_the_grading_seed"} <= ran, sorted(ran)
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
        print("new-chapter test, seconds per step:", {k: round(v, 1) for k, v in timings.items()})


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
    places = ["src/distlab/chapters.py", "_toc.yml", "_config.yml", *chapter_rows.PLACES]
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
