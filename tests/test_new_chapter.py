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
from distlab.grade import exercise, new_chapter, new_chapter_rows

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
NAMED = {"test_the_chapter_map_and_the_readme_name_every_chapter", "test_the_reading_path_of_the_intro_links_every_chapter"}
"""The checks of the three places that name every chapter in prose: the command writes the new chapter's rows."""
ABOUT = "adding up a value that every rank holds a part of, with one all-reduce."
"""The first line of the new package's docstring, after "Chapter N (Title):": the reading path's description."""


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


def assert_only_the_chapters_rows_were_added(before: dict, after: dict, number: int, slug: str, package: str):
    """Each file the command changed gains the new chapter's lines and nothing else (the reading
    path's items below the new one move down by one), placed after the last chapter's."""
    changes = {name: diff(before[name], after[name]) for name in before if after.get(name) != before[name]}
    assert set(changes) == {"src/distlab/chapters.py", "_toc.yml", new_chapter_rows.MAP, new_chapter_rows.README,
                            new_chapter_rows.INTRO}, sorted(changes)
    assert not any("TODO" in line for added, _, _ in changes.values() for line in added)
    added, removed, _ = changes["src/distlab/chapters.py"]
    assert not removed and len(added) == 2 and f'"{slug}", "{TITLE}", "{package}"' in added[0], added
    assert changes["_toc.yml"][:2] == ([f"      - file: book/{slug}/index"], []), changes["_toc.yml"]

    added, removed, at = changes[new_chapter_rows.MAP]
    lines = after[new_chapter_rows.MAP].decode().splitlines()
    assert not removed and re.match(rf"{number} {{2,}}a sample chapter {{2,}}:mod:`{package}` {{2,}}``reference.sum_of_squares``$",
                                    added[0]), added
    assert all(line.startswith(" ") for line in added[1:]) and new_chapter_rows.BORDER.match(lines[at + len(added)]), added
    assert lines[at - 1].startswith(f"{number - 1} ") or lines[at - 1].startswith(" "), lines[at - 1]
    above = next(line for line in reversed(lines[:at]) if re.match(r"\d+ ", line))
    assert added[0].index(":mod:") == above.index(":mod:"), "the row is not aligned with the chapter map's columns"

    added, removed, at = changes[new_chapter_rows.README]
    lines = after[new_chapter_rows.README].decode().splitlines()
    assert not removed and added == [f"| {number} a sample chapter | `{package}` | `reference` (`sum_of_squares`) |"], added
    assert lines[at - 1].startswith(f"| {number - 1} "), lines[at - 1]

    added, removed, at = changes[new_chapter_rows.INTRO]
    previous = re.findall(r"^(\d+)\. .*\]\(" + re.escape(chapters.CHAPTERS[-1].page.removeprefix("book/")) + r"\.md\)",
                          before[new_chapter_rows.INTRO].decode(), re.M)
    assert len(previous) == 1, "the reading path's item for the last chapter"
    item, moved = added[:len(added) - len(removed)], added[len(added) - len(removed):]
    expected = f"{int(previous[0]) + 1}. **[{TITLE}]({slug}/index.md)**: {ABOUT}"
    assert " ".join(item).split() == expected.split(), item
    assert moved == [re.sub(r"^(\d+)\.", lambda m: f"{int(m.group(1)) + 1}.", line) for line in removed], (removed, moved)


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
        made = step("new-chapter", [sys.executable, "-m", "distlab.grade", "new-chapter", slug, TITLE], 120)
        assert made.returncode == 0, made.stdout + made.stderr
        assert "make test-chapter CHAPTER=" + slug in made.stdout
        after = files_of(repo)
        added = set(after) - set(before)
        assert_only_the_chapters_rows_were_added(before, after, number, slug, package)
        assert added == {f"book/{slug}/index.md", f"solutions/{slug}/{slug}.ipynb", f"tests/test_chapter{number:02d}.py",
                         "src/distlab/sample_chapter/__init__.py", "src/distlab/sample_chapter/reference.py"}, added
        assert not (REPO / "solutions" / slug).exists(), "the command wrote into the working tree, not the copy"
        assert f'"{slug}", "{TITLE}", "{package}"' in (repo / "src" / "distlab" / "chapters.py").read_text()
        again = step("new-chapter again", [sys.executable, "-m", "distlab.grade", "new-chapter", slug, TITLE], 120)
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
            new_chapter.make(REPO, slug, TITLE, package)
    assert new_chapter.package_for("08-context-parallel") == "distlab." + "context_parallel"


def test_new_chapter_refuses_before_writing_anything_a_chapter_it_cannot_place(tmp_path):
    """Where one of the three places has no row for the last chapter to put the new one after."""
    last = chapters.CHAPTERS[-1]
    places = ["src/distlab/chapters.py", "_toc.yml", "_config.yml", new_chapter_rows.MAP, new_chapter_rows.README,
              new_chapter_rows.INTRO]
    without_the_last_row = {
        new_chapter_rows.MAP: lambda text: re.sub(rf"(?m)^{last.number} {{2,}}.*\n", "", text),
        new_chapter_rows.README: lambda text: re.sub(rf"(?m)^\| {last.number} .*\n", "", text),
        new_chapter_rows.INTRO: lambda text: text.replace(f"]({last.page.removeprefix('book/')}.md)", "](elsewhere.md)")}
    for broken, edit in without_the_last_row.items():
        repo = tmp_path / broken.replace("/", "_")
        for name in places:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
        (repo / broken).write_text(edit((repo / broken).read_text()))
        before = files_of(repo)
        slug = f"{last.number + 1:02d}-sample-chapter"
        with pytest.raises(ValueError, match=re.escape(broken) + ".*cannot place chapter"):
            new_chapter.make(repo, slug, TITLE)
        assert files_of(repo) == before, f"{broken}: the command wrote something before it refused"
