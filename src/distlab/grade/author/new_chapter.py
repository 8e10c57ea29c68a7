"""``python -m distlab.grade new-chapter SLUG "Title"``: a new chapter that releases and passes
its own tests before anyone edits it.

It writes, for ``SLUG = NN-name`` (``--package`` overrides the package's name):

* ``book/SLUG/index.md``: the chapter's page, with a code cell that runs the reference on 2
  ranks, and its entry in ``_toc.yml`` after the last chapter;
* ``src/distlab/<name>/``: the chapter's reference package, a docstring and one function,
  ``reference.sum_of_squares``, which the page calls and the exercise is graded against. A
  package written before its chapter is kept: the command adds only the files it lacks
  (``__init__.py``, ``reference.py``), overwrites none, and names the ones it kept;
* ``solutions/SLUG/SLUG.ipynb``: the exercise, with the nbgrader metadata every cell needs,
  one coding task (``task1-answer``, ``task1-tests``: visible tests on 2 ranks, hidden tests on
  4, seeded from ``checks.grading_seed()``), concept questions (``concepts-text``,
  ``concepts-answer``, ``concept-a-tests``, ...: a numeric one and a multiple-choice one, or
  one kind only with ``--questions number`` or ``--questions choice``, the right option on the
  letter right least often across the chapters), and the chapter's package forbidden in the
  metadata and the setup cell;
* ``tests/chapters/test_chapterNN.py``: the chapter's own tests;
* the chapter's entry in :mod:`distlab.chapters`, its title as given (case kept), ``about``
  the description given with ``--about``, ``uses`` naming the sample's reference;

and then rewrites, from the registry, the three places that list every chapter (the chapter
map of :mod:`distlab`, the README's table, the reading path of ``book/intro.md``), as
``python -m distlab.grade chapter-rows --write`` does (:mod:`distlab.grade.author.chapter_rows`):
outside the chapter's own folders, the only files an author keeps are the registry and
``_toc.yml``.

It refuses, before writing anything, a chapter it cannot place (its page, exercise or tests
there already, or a package with a ``reference.py`` of its own, which the sample would
overwrite). Then it says what is left:
release, run the chapter's gates, replace the sample. The book's instructor's guide, "Adding a
chapter", lists every convention the tests enforce.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from string import Template

from distlab.grade import exercise
from distlab.grade.author import authoring, book_checks, chapter_rows
from distlab.grade.author.new_chapter_text import (
    CHOICE_PROMPT,
    CHOICE_RIGHT,
    CHOICE_SOLUTION,
    CHOICE_TESTS,
    CHOICE_TEXT,
    CHOICE_WRONG,
    CONCEPTS_HEAD,
    INTRO,
    NUMBER_PROMPT,
    NUMBER_SOLUTION,
    NUMBER_TESTS,
    NUMBER_TEXT,
    OUTRO,
    PACKAGE_INIT,
    PAGE,
    REFERENCE,
    SETUP,
    TASK1_ANSWER,
    TASK1_TESTS,
    TASK1_TEXT,
    TESTS,
)

QUESTIONS = {"both": ("number", "choice"), "number": ("number",), "choice": ("choice",)}
"""``--questions``: the kinds of concept question the sample has, in order (a), (b)."""
SLUG = re.compile(r"^\d\d-[a-z0-9]+(?:-[a-z0-9]+)*$")
MARKER = "    # new-chapter adds its entry above this line\n"
"""The line of src/distlab/chapters.py above which a new entry goes."""


def package_for(slug: str) -> str:
    """The default package of a chapter: for ``08-context-parallel``, ``context_parallel`` in src/distlab."""
    return "distlab." + slug[3:].replace("-", "_")


def make(repo: str | os.PathLike, slug: str, title: str, about: str, package: str | None = None,
         questions: str = "both") -> tuple[list[Path], list[Path]]:
    """Write the chapter's files into the repository ``repo``; return them, and the files of an
    existing package it kept as they were. Refuses (ValueError) a malformed slug or package, an
    empty description or one using a glossary term unlinked, a chapter whose number or folders
    exist already, a package that is not a folder or has a ``reference.py`` already, or a
    chapter the three lists of chapters cannot take."""
    import yaml

    repo = Path(repo)
    package = package or package_for(slug)
    short = package.removeprefix("distlab.")
    if not SLUG.match(slug):
        raise ValueError(f"{slug!r}: a slug is NN-name, two digits then lowercase words joined by '-'")
    about = " ".join(about.split())
    if not about or "\"" in about:
        raise ValueError("--about: one sentence on what the chapter is about (no double quotes), e.g. "
                         "'splitting a long sequence across ranks, and ring attention.'")
    about = about if about.endswith(".") else about + "."
    unlinked_in_about(repo, about)
    if not (package.startswith("distlab.") and short.isidentifier() and short.islower()):
        raise ValueError(f"{package!r}: a chapter's package is distlab.<lowercase name>")
    registry = (repo / "src" / "distlab" / "chapters.py").read_text()
    if f'Chapter("{slug[:3]}' in registry:
        raise ValueError(f"chapter {slug[:2]} exists already (src/distlab/chapters.py)")
    last = max(int(n) for n in re.findall(r'Chapter\("(\d\d)-', registry))
    if int(slug[:2]) < last or MARKER not in registry:
        raise ValueError(f"{slug}: a new chapter comes after chapter {last}, the last in src/distlab/chapters.py")
    places = {"page": repo / "book" / slug / "index.md", "solution": repo / "solutions" / slug / f"{slug}.ipynb",
              "tests": repo / "tests" / "chapters" / f"test_chapter{slug[:2]}.py"}
    taken = [str(p.relative_to(repo)) for p in places.values() if p.exists()]
    if taken or (repo / "book" / slug).exists() or (repo / "solutions" / slug).exists():
        raise ValueError(f"{slug}: already there: {taken or [slug]}")
    places["package"] = repo / "src" / "distlab" / short
    kept = existing_package(places["package"], repo)
    base = yaml.safe_load((repo / "_config.yml").read_text())["html"]["baseurl"]
    plain = re.sub(r"\{term\}`([^`<]*?)\s*(?:<[^>]*>)?`", r"\1", about)   # the docstring has no MyST roles
    values = {"about": plain, "slug": slug, "title": title, "number": str(int(slug[:2])), "nn": slug[:2],
              "package": package,
              "short": short, "chapter_url": f"{base}book/{slug}/index.html"}
    fill = lambda text: Template(text).substitute(values)   # noqa: E731 - one line, used below
    graded = (f"{package}.reference:sum_of_squares",)
    chapter_rows.generated(repo)   # before anything is written: refuses lists it cannot find

    written = []
    for path, text in ((places["page"], PAGE), (places["package"] / "__init__.py", PACKAGE_INIT),
                       (places["package"] / "reference.py", REFERENCE), (places["tests"], TESTS)):
        if path in kept:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(text))
        written.append(path)
    places["solution"].parent.mkdir(parents=True)
    kinds = QUESTIONS[questions]
    right = authoring.least_used_letter(repo) if "choice" in kinds else None   # keeps the letters spread
    places["solution"].write_text(json.dumps(notebook(values, fill, kinds, right), indent=1, ensure_ascii=False) + "\n")
    written.append(places["solution"])

    uses = f"`reference` (`{graded[0].partition(':')[2]}`)"
    entry = (f'    Chapter("{slug}", {json.dumps(title)}, "{package}",\n'
             f'            ("{graded[0]}",), "book/{slug}/index",\n'
             f'            about={json.dumps(about, ensure_ascii=False)},\n'
             f'            uses="{uses}"),\n')
    (repo / "src" / "distlab" / "chapters.py").write_text(registry.replace(MARKER, entry + MARKER, 1))
    written.append(repo / "src" / "distlab" / "chapters.py")
    add_to_toc(repo / "_toc.yml", slug)
    written.append(repo / "_toc.yml")
    written += [repo / place for place in chapter_rows.write(repo, chapter_rows.load(repo))]
    return written, kept


def unlinked_in_about(repo: Path, about: str) -> None:
    """Refuse an ``--about`` that uses a glossary term without linking it. The sentence goes
    into the book's introduction, where every term a page uses is a link to the glossary
    (``test_every_page_links_the_glossary_terms_it_uses``): caught here, the author fixes one
    argument instead of reading a failing book test after the files are written."""
    entries = book_checks.glossary_entries(repo)
    spelling = {name.lower(): name for entry in entries for name in entry}
    unlinked = [name if spelling[name] == name.capitalize() else spelling[name]   # "rank", but "ZeRO"
                for name in book_checks.unlinked_terms(about, entries)]
    if unlinked:
        links = ", ".join(f"{{term}}`{name}`" for name in unlinked)
        raise ValueError(f"--about uses glossary terms without linking them: {', '.join(map(repr, unlinked))}; "
                         f"write {links} (the book links every term it uses to the glossary)")


def existing_package(folder: Path, repo: Path) -> list[Path]:
    """The files of a package written before its chapter (none when there is no such folder),
    all of which the command keeps as they are. It adds ``__init__.py`` where that is missing and
    the sample's ``reference.py``, so it refuses a package that has a ``reference.py`` already:
    rename that module, or write the chapter without the command's sample."""
    if not folder.exists():
        return []
    where = folder.relative_to(repo)
    if not folder.is_dir():
        raise ValueError(f"{where} exists and is not a folder: a chapter's package is a folder")
    if (folder / "reference.py").exists():
        raise ValueError(f"{where / 'reference.py'} exists already: the sample's reference would overwrite it "
                         "(rename that module, or choose another package with --package)")
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def add_to_toc(toc: Path, slug: str) -> None:
    """Insert ``book/<slug>/index`` as the last entry of the "Chapters" part (text, so comments stay)."""
    lines = toc.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == "- caption: Chapters")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^  \S", lines[i])), len(lines))
    while end > start and not lines[end - 1].strip():
        end -= 1
    lines.insert(end, f"      - file: book/{slug}/index\n")
    toc.write_text("".join(lines))


def _cell(kind: str, grade_id: str, source: str, solution=False, points=None) -> dict:
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    cell = {"cell_type": kind, "id": grade_id, "metadata": {"nbgrader": meta}, "source": source.strip("\n")}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def choice_options(right: str) -> tuple[str, str]:
    """The sample's options with the right one on letter ``right`` (the wrong ones in their
    order on the others), and the ``revisit`` dict of ``check_choice``, as Python source."""
    wrong = list(CHOICE_WRONG.items())
    letters = {right: CHOICE_RIGHT} | dict(zip([x for x in authoring.LETTERS if x != right], [w for w, _ in wrong]))
    options = "\n".join(f'* `"{letter}"` — {letters[letter]}' for letter in authoring.LETTERS)
    hints = dict(zip([x for x in authoring.LETTERS if x != right], [h for _, h in wrong]))
    revisit = "{\n" + "\n".join(f'    "{letter}": {json.dumps(hint, ensure_ascii=False)},' for letter, hint in hints.items())
    return options, revisit + "}"


def notebook(values: dict, fill, kinds=("number", "choice"), right: str | None = None) -> dict:
    """The solution notebook (nbformat 4.5) of the new chapter, with one concept question of each
    kind in ``kinds`` (``"number"``, ``"choice"``), labelled (a), (b)."""
    forbidden = [values["package"]]
    intro = "\n\n".join([fill(INTRO), exercise.rules_text(forbidden), exercise.grading_text(),
                         exercise.tolerances_text("results")])
    heading = "Concept question (1 point)" if len(kinds) == 1 else f"Concept questions ({len(kinds)} points)"
    texts, prompts, solutions, tests = [Template(CONCEPTS_HEAD).substitute(values, heading=heading)], [], [], []
    for label, kind in zip("abcd", kinds):
        if kind == "number":
            more = {"label": label}
            parts = (NUMBER_TEXT, NUMBER_PROMPT, NUMBER_SOLUTION, NUMBER_TESTS)
        else:
            options, revisit = choice_options(right)
            more = {"label": label, "right": right, "options": options, "revisit": revisit}
            parts = (CHOICE_TEXT, CHOICE_PROMPT, CHOICE_SOLUTION, CHOICE_TESTS)
        text, prompt, solution, test = (Template(part).substitute(values, **more) for part in parts)
        texts.append(text)
        prompts.append(prompt)
        solutions.append(solution)
        tests.append(_cell("code", f"concept-{label}-tests", test, points=1))
    answer = "\n".join([*prompts, "### BEGIN SOLUTION", *solutions, "### END SOLUTION"])
    cells = [_cell("markdown", "intro", intro), _cell("code", "setup", fill(SETUP)),
             _cell("markdown", "task1-text", fill(TASK1_TEXT)),
             _cell("code", "task1-answer", fill(TASK1_ANSWER), solution=True),
             _cell("code", "task1-tests", fill(TASK1_TESTS), points=2),
             _cell("markdown", "concepts-text", "".join(texts)),
             _cell("code", "concepts-answer", answer, solution=True), *tests,
             _cell("markdown", "outro", fill(OUTRO))]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"distlab": {"forbidden": forbidden},
                         "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}}}


def command(slug: str, title: str, about: str, package: str | None, say, questions: str = "both") -> int:
    """``new-chapter``: make the chapter in this repository, say what it wrote and what is left."""
    from distlab.grade import config

    repo = config.repo_root()
    try:
        written, kept = make(repo, slug, title, about, package, questions)
    except ValueError as error:
        say(f"new-chapter: {error}")
        return 2
    for path in written:
        say(f"new-chapter: wrote {os.path.relpath(path, repo)}")
    for path in kept:
        say(f"new-chapter: kept {os.path.relpath(path, repo)} (the package existed: nothing in it was overwritten)")
    say(next_steps(slug, package or package_for(slug)))
    return 0


def next_steps(slug: str, package: str) -> str:
    return f"""what is left (the instructor's guide, "Adding a chapter", has the whole checklist):
  1. python -m distlab.grade release {slug}      # writes notebooks/{slug}/ (commit it with solutions/)
  2. make test-chapter CHAPTER={slug}             # the chapter's gates, grading included
  3. replace the sample task, question and reference with the chapter's own, keeping the
     cell ids, and update the registry entry (graded references, about, uses of {package})
  4. after changing the entry: python -m distlab.grade chapter-rows --write   # the three lists of chapters"""

