"""The instructor's commands: ``python -m distlab.grade <command> ...`` (or ``make grade-...``).

    release  [SLUG ...]                 solutions/<slug>/ -> notebooks/<slug>/ (the student version)
    collect  SLUG --from DIR            DIR/<student_id>.zip or DIR/<student_id>/<slug>.ipynb -> submitted/

On the course hub, through nbgrader's exchange (hub/README.md):

    publish  SLUG [--due DATE]          release the student version to the exchange
    due      SLUG DATE                  set (or move) the due date; later submissions are late
    collect  SLUG                       the latest submission of each student -> submitted/
    return   SLUG                       feedback (made by ``feedback``) back to the exchange

and in both cases:

    autograde SLUG [--student ID ...]   run and score every submission (clean-room tests)
    feedback SLUG [--student ID ...]    HTML feedback per student, hidden tests removed
    export   [--to FILE]                every score as CSV (default grader/work/grades.csv)
    class    SLUG --from DIR            collect, autograde, feedback and export in one go

and to write the course:

    new-chapter SLUG "Title" --about TEXT [--questions both|number|choice]
                                        a new chapter: page, package, exercise, tests, registry entry
    authoring [PAGE ...]                the right letters' spread; glossary terms pages use unlinked
    chapter-rows [--write]              the chapter map, README table and reading path, from the registry
    page PATH ... | --chapter SLUG      execute one page as the book does and check it (make page)

and to publish (the site, the launch links, a public repository; distlab.grade.author.edition):

    student-edition DEST [--commit REF] a new repository: this one without solutions, grader, tests

Options of the form ``--Class.trait=value`` go to nbgrader as they are, e.g.
``--CleanRoomTests.rank_memory_mb=4096`` or ``--Execute.timeout=30``.

Each command is nbgrader's own (``generate_assignment``, ``zip_collect``, ``autograde``,
``generate_feedback``, ``export``) run with ``grader/nbgrader_config.py``; this wrapper prints
what it is doing and how long it took, and says plainly when something failed. A failure on
one submission (say, a notebook that is not valid JSON) is reported and the others go on.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time

from distlab.grade import config
from distlab.grade.author import authoring_commands
from distlab.grade.boundary import bubblewrap, student_output
from distlab.grade.course import cluster, grades_csv
from distlab.grade.pipeline import nbgrader_app
from distlab.grade.pipeline.release import release
from distlab.grade.pipeline.run_nbgrader import EXTRA, OUTPUT, nbgrader, say

EXCEPTION_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception)\b.*: ")
"""The last line of a Python traceback, e.g. ``psycopg.OperationalError: connection failed``."""


NOT_GRADED = re.compile(r"\[AutogradeApp \| ERROR\] There was an error processing assignment '[^']+' "
                        r"for student '([^']+)'")
"""nbgrader's own line for a submission it could not grade, as the whole of a line: a student's
printing reaches the log only behind :data:`distlab.grade.boundary.student_output.MARK`, and nbgrader's
multi-line records are indented after their first line (:mod:`distlab.grade.pipeline.nbgrader_app`)."""


def ungraded(lines: list[str]) -> dict[str, str]:
    """``{student: reason}`` for each submission nbgrader could not grade at all (a file that
    is not a notebook, say), the reason being the last exception line it logged before."""
    found, reason = {}, "see the log above"
    for line in lines:
        if line.startswith(student_output.MARK):   # a student's printing says nothing about grading
            continue
        text = line.strip().removeprefix(nbgrader_app.CONTINUED.strip()).strip()
        if EXCEPTION_LINE.match(text):
            reason = text
        failed = NOT_GRADED.fullmatch(line)
        if failed:
            found[failed.group(1)] = reason
            reason = "see the log above"
    return found


def collect(slug: str, source: str) -> int:
    """Copy the class's files into nbgrader's zip-collect layout, then run ``zip_collect``.
    Links in ``source`` are refused, never followed (students may have made its folders)."""
    from distlab.grade.course import exchange

    archive = os.path.join(config.work_dir(), "downloaded", slug, "archive")
    if os.path.isdir(archive):
        shutil.rmtree(archive)
    os.makedirs(archive, mode=0o700)
    copied, refused = exchange.copy_class_folder(source, archive)
    for line in refused:
        say(f"collect: {line}")
    say(f"collect: {copied} submission(s) from {source} -> {archive}")
    if not copied:
        say(f"collect {slug}: nothing could be collected from {source}")
        return 1
    start = time.monotonic()
    code = nbgrader("zip_collect", slug, "--force")
    say(f"collect {slug}: {'done' if code == 0 else 'FAILED (see above)'} in {time.monotonic() - start:.1f} s")
    return code


def publish(slug: str, due: str | None) -> int:
    """Generate the student version into the work folder (which also enters it in the gradebook)
    and release it to the exchange, with a due date if given."""
    from distlab.grade.course import exchange

    if problem := exchange.course_folder_problem():
        say(f"publish {slug}: not published: {problem}")
        return 1
    staged = os.path.join(config.work_dir(), "release")
    if release([slug], to=staged):
        return 1
    if due and set_due_date(slug, due):
        return 1
    return nbgrader("release_assignment", slug, "--force", f"--CourseDirectory.release_directory={staged}")


def set_due_date(slug: str, due: str) -> int:
    return nbgrader("db", "assignment", "add", slug, f"--duedate={due}")


def collect_from_exchange(slug: str) -> int:
    """``nbgrader collect``, from a private copy of the exchange's inbound folder that holds only
    what :mod:`distlab.grade.course.exchange` checked: each submission made by the student it names,
    plain files only, its time from the file system. Whatever one student left in the exchange,
    the others are collected; the command fails only when nothing could be."""
    from distlab.grade.course import exchange

    staged = os.path.join(config.private_work_dir(), "staged-exchange")
    shutil.rmtree(staged, ignore_errors=True)
    inbound = os.path.join(staged, config.COURSE_ID, "inbound")
    try:
        for line in exchange.stage_submissions(slug, inbound):
            say(f"collect: {line}")
        if not os.listdir(inbound):
            say(f"collect {slug}: nothing could be collected (no submission in the exchange passed the checks)")
            return 1
        # The owners were checked on the exchange; the copies are the grader's own.
        return nbgrader("collect", slug, "--update", f"--Exchange.root={staged}", "--ExchangeCollect.check_owner=False")
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def return_feedback(slug: str) -> int:
    return nbgrader("release_feedback", slug)


def for_each_student(command: str, slug: str, students: list[str]) -> list[tuple[str | None, int, list[str]]]:
    """``nbgrader COMMAND SLUG --force`` for the whole class (student ``None``), or once for each
    of ``students`` (nbgrader's ``--student`` takes one id per run). Returns
    ``(student, exit code, what it printed)`` per run."""
    runs = []
    for student in students or [None]:
        code = nbgrader(command, slug, "--force", *([f"--student={student}"] if student else []))
        runs.append((student, code, list(OUTPUT)))
    return runs


def last_error(lines: list[str]) -> str:
    """The last exception line of a log (``psycopg.OperationalError: ...``), for a one-line reason."""
    errors = [line.strip() for line in lines if EXCEPTION_LINE.match(line.strip())]
    return errors[-1] if errors else "see the log above"


def released(slug: str, command: str) -> bool:
    """Does this working folder's gradebook know ``slug``? If not, say what to do, in one line.

    nbgrader learns an assignment when it is released; in a new working folder (another
    ``DISTLAB_GRADE_WORK``) autograding before that ends in nbgrader's traceback "No
    assignment with ID ... exists in the database".
    """
    from nbgrader.api import Gradebook, MissingEntry

    url = config.db_url()
    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        known = False
    else:
        with Gradebook(url) as gradebook:
            try:
                gradebook.find_assignment(slug)
                known = True
            except MissingEntry:
                known = False
    if not known:
        say(f"{command} {slug}: the gradebook {config.shown_url(url)} does not know {slug} yet: release it "
            f"first (python -m distlab.grade release {slug}), which enters it in that gradebook")
    return known


def database_answers(command: str) -> bool:
    """Can we reach the gradebook? A database server that is down (or a wrong URL) is one line
    naming it, before nbgrader starts, instead of a traceback per student."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    url = config.db_url()
    if url.startswith("sqlite:"):
        return True
    engine = create_engine(url, connect_args={"connect_timeout": 10} if "postgresql" in url else {})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return True
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        say(f"{command}: the gradebook database {config.shown_url(url)} does not answer ({reason}); "
            "start it, or set DISTLAB_GRADE_DB_URL to one that runs")
        return False
    finally:
        engine.dispose()


def autograde(slug: str, students: list[str]) -> int:
    start = time.monotonic()
    runs = for_each_student("autograde", slug, students)
    code = max(run_code for _, run_code, _ in runs)
    failed = {}
    for student, run_code, printed in runs:
        failed.update(ungraded(printed))
        if student and run_code != 0 and student not in failed:  # nbgrader itself stopped
            failed[student] = last_error(printed)
    for student, reason in failed.items():
        say(f"autograde {slug}: {student} NOT GRADED (scores 0): {reason}")
    if (failed or code) and not database_answers("autograde"):  # the server went away while grading
        say(f"autograde {slug}: run it again once the database answers; students graded before it "
            "stopped keep their scores")
        code = code or 1
    say(f"autograde {slug}: {'done' if code == 0 else 'done, with failures (see above)'} "
        f"in {time.monotonic() - start:.1f} s")
    return code


def feedback(slug: str, students: list[str]) -> int:
    start = time.monotonic()
    code = max(run_code for _, run_code, _ in for_each_student("generate_feedback", slug, students))
    where = os.path.join(config.work_dir(), "feedback")
    say(f"feedback for {slug} is in {where} ({time.monotonic() - start:.1f} s)" if code == 0 else
        f"feedback for {slug} failed (see above; what was made is in {where}, {time.monotonic() - start:.1f} s)")
    return code


def export(to: str | None) -> int:
    to = os.path.abspath(to or os.path.join(config.work_dir(), "grades.csv"))
    start = time.monotonic()
    code = nbgrader("export", f"--to={to}")
    if code == 0:
        grades_csv.times_with_their_zone(to)
        say(f"grades written to {to} ({time.monotonic() - start:.1f} s; times in UTC)")
    return code


def main(argv: list[str] | None = None) -> int:
    nbgrader_app.skip_the_iri_grammar()   # this process reads the gradebook with nbgrader's API too
    parser = argparse.ArgumentParser(prog="python -m distlab.grade", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("release", help="generate notebooks/ from solutions/")
    p.add_argument("slugs", nargs="*")
    p.add_argument("--to", help="release into this folder instead of notebooks/ (to preview)")
    p = sub.add_parser("collect", help="collect submissions: from the exchange, or --from a folder of zips")
    p.add_argument("slug")
    p.add_argument("--from", dest="source", help="folder of <student_id>.zip files (default: the exchange)")
    p = sub.add_parser("publish", help="release an assignment to the exchange")
    p.add_argument("slug")
    p.add_argument("--due", help='due date, e.g. "2026-12-01 17:00:00 Europe/Berlin"')
    p = sub.add_parser("due", help="set the due date of an assignment")
    p.add_argument("slug")
    p.add_argument("date", help='e.g. "2026-12-01 17:00:00 Europe/Berlin"')
    p = sub.add_parser("return", help="release generated feedback to the exchange")
    p.add_argument("slug")
    for name in ("autograde", "feedback"):
        p = sub.add_parser(name)
        p.add_argument("slug")
        p.add_argument("--student", action="append", help="only this student (repeat for several)")
    cluster.add_arguments(sub.choices["autograde"])
    p = sub.add_parser("export", help="export all grades as CSV")
    p.add_argument("--to")
    authoring_commands.add_parsers(sub)
    p = sub.add_parser("class", help="collect, autograde, feedback, export")
    p.add_argument("slug")
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--to")
    p = sub.add_parser("student-edition", help="write the student edition (a new repository) to publish")
    p.add_argument("dest", help="a new folder, or an earlier edition to add this one to")
    p.add_argument("--commit", default="HEAD")
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if not (a.startswith("--") and "." in a.split("=", 1)[0])]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    EXTRA[:] = extra  # e.g. --CleanRoomTests.rank_memory_mb=4096 --Execute.timeout=30

    if args.command == "student-edition":  # needs no gradebook
        from distlab.grade.author import edition
        return edition.command(args.dest, args.commit, config.repo_root(), say)
    if args.command in authoring_commands.NAMES:  # write the course; need no gradebook
        return authoring_commands.run(args, config.repo_root(), say)
    if not database_answers(args.command):
        return 1
    if args.command == "release":
        return release(args.slugs, args.to)
    if args.command == "collect":
        return collect(args.slug, args.source) if args.source else collect_from_exchange(args.slug)
    if args.command == "publish":
        return publish(args.slug, args.due)
    if args.command == "due":
        return set_due_date(args.slug, args.date)
    if args.command == "return":
        return return_feedback(args.slug)
    if args.command == "autograde" and args.slurm and not cluster.gradebook_is_shared(args.slug, say):
        return 2
    if args.command in ("autograde", "feedback", "class") and not released(args.slug, args.command):
        return 1
    if args.command == "autograde" and args.slurm:  # each job checks its own node's sandbox
        return cluster.autograde_on_cluster(args.slug, args.student or [], cluster.options(args), EXTRA, say)
    if args.command in ("autograde", "class") and not bubblewrap.starts_here(args.command, say):
        return 1
    if args.command == "autograde":
        return autograde(args.slug, args.student or [])
    if args.command == "feedback":
        return feedback(args.slug, args.student or [])
    if args.command == "export":
        return export(args.to)
    codes = []
    for step, run in enumerate((lambda: collect(args.slug, args.source), lambda: autograde(args.slug, []),
                                lambda: feedback(args.slug, []), lambda: export(args.to)), 1):
        say(f"class {args.slug}: step {step}/4")
        codes.append(run())
    return int(any(codes))


if __name__ == "__main__":
    sys.exit(main())
