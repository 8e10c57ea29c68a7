"""The commands that write the course rather than grade it: ``new-chapter``, ``chapter-rows``,
``page`` and ``authoring`` (``python -m distlab.grade <command>``).

They need no gradebook and no sandbox, and each lives in its own module, imported only when
its command runs: :mod:`distlab.grade.author.new_chapter` scaffolds a chapter,
:mod:`distlab.grade.author.chapter_rows` writes the three lists of chapters from the registry,
:mod:`distlab.grade.author.page_check` executes and checks pages as the book build does, and
:mod:`distlab.grade.author.authoring` prints what an author otherwise works out by hand. This module
only declares their arguments and hands each parsed command to its module.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAMES = ("new-chapter", "chapter-rows", "page", "authoring")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare the four commands on the CLI's subparsers."""
    p = sub.add_parser("new-chapter", help="a new chapter: page, package, exercise, tests, registry entry")
    p.add_argument("slug", help="NN-name, e.g. 08-context-parallel")
    p.add_argument("title")
    p.add_argument("--about", required=True, help="one sentence: what the chapter is about (the reading path's)")
    p.add_argument("--package", help="its reference package (default: distlab.<name>)")
    p.add_argument("--questions", choices=("both", "number", "choice"), default="both",
                   help="the kinds of concept question of the sample (default: one of each)")
    p = sub.add_parser("chapter-rows", help="check (or --write) the three lists of chapters against the registry")
    p.add_argument("--write", action="store_true", help="rewrite the places that differ")
    p = sub.add_parser("page", help="execute pages as the book build does and run the page checks")
    p.add_argument("paths", nargs="*", help="pages, e.g. book/03-ddp/buckets.md")
    p.add_argument("--chapter", help="every page of this chapter (a slug of src/distlab/chapters.py)")
    p = sub.add_parser("authoring", help="the spread of right letters, and the glossary terms pages leave unlinked")
    p.add_argument("paths", nargs="*", help="pages (default: every page of book/)")


def run(args: argparse.Namespace, repo: str, say) -> int:
    """Run the authoring command ``args.command`` (one of :data:`NAMES`) on the repository ``repo``."""
    if args.command == "chapter-rows":
        from distlab.grade.author import chapter_rows
        return chapter_rows.command(repo, args.write, say)
    if args.command == "page":
        from distlab.grade.author import page_check
        return page_check.command(args.paths, args.chapter, Path(repo), say)
    if args.command == "authoring":
        from distlab.grade.author import authoring
        return authoring.command(Path(repo), args.paths, say)
    from distlab.grade.author import new_chapter
    return new_chapter.command(args.slug, args.title, args.about, args.package, say, args.questions)
