"""Writing and publishing the course: the commands a chapter's author runs, and the student edition.

* :mod:`distlab.grade.author.new_chapter` (with :mod:`distlab.grade.author.new_chapter_text`):
  ``new-chapter`` scaffolds a chapter that releases and passes its tests before anyone edits it;
* :mod:`distlab.grade.author.chapter_rows`: the three lists of chapters, written from the registry;
* :mod:`distlab.grade.author.page_check` (``make page``): one page executed and checked as the book
  build checks it, with :mod:`distlab.grade.author.book_checks` (glossary links, dotted names,
  no graded answer printed) and :mod:`distlab.grade.author.near_copy` (copies up to renaming);
* :mod:`distlab.grade.author.authoring`: what an author otherwise counts by hand (the spread of
  right letters, unlinked glossary terms); :mod:`distlab.grade.author.authoring_commands` wires
  these commands into ``python -m distlab.grade``;
* :mod:`distlab.grade.author.edition`: the student edition, the repository without solutions,
  grader and tests, nor their history.

What it guarantees: none of it grades or runs a student's code; it needs no gradebook and no
sandbox, and the rooms that grade import nothing from it.
"""
