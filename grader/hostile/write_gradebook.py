"""Try to overwrite the gradebook, delete the other students' submissions and drop a file
into the grader's working folder, from the kernel and from the ranks.

Expected: every attempt is refused ("not allowed in this exercise"); the gradebook is intact,
other students' grades are unchanged, and this submission (otherwise correct) counts normally.
"""
OUTPUT_CONTAINS = ["refused:"]
OUTPUT_EXCLUDES = ["NOT refused: {work}"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", r'''import glob, os, shutil, sqlite3
import distlab

_root = os.path.dirname(os.path.dirname(os.path.dirname(distlab.__file__)))
_work = os.environ.get("DISTLAB_GRADE_WORK") or os.path.join(_root, "grader", "work")
_targets = [os.path.join(_work, "gradebook.db"), "../../../gradebook.db"]
for _db in _targets:
    for _attempt in (lambda: open(_db, "wb").write(b"garbage"),
                     lambda: sqlite3.connect(_db).execute("delete from grade"),
                     lambda: os.remove(_db)):
        try:
            _attempt()
            print("NOT refused:", os.path.realpath(_db))
        except Exception as _e:
            print("refused:", type(_e).__name__)
for _attempt in (lambda: shutil.rmtree(os.path.join(_work, "submitted")),
                 lambda: open(os.path.join(_work, "planted.txt"), "w").write("hi"),
                 lambda: shutil.rmtree("../..")):
    try:
        _attempt()
        print("NOT refused")
    except Exception as _e:
        print("refused:", type(_e).__name__)
''')]
