"""Read the hidden tests from disk (the notebook next to the kernel, which holds the restored
test cells; the solutions folder; the gradebook; git) and copy the answers from them.

Expected: every one of those paths is refused while grading, so the answers stay wrong;
the three concept questions score 0. (Had the read worked, the answers would be right: the test would see it.)
"""
OUTPUT_CONTAINS = ["refused:"]
AFFECTED = ["concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {"concepts-answer": r'''import glob, os, re, sqlite3
import distlab

_found = None
_root = os.path.dirname(os.path.dirname(os.path.dirname(distlab.__file__)))
_paths = glob.glob("*.ipynb") + [os.path.join(_root, "solutions", "00-first-steps", "00-first-steps.ipynb")]
_paths += glob.glob(os.path.join(_root, "grader", "work", "**", "*.ipynb"), recursive=True)
for _path in _paths:
    try:
        _m = re.search(r'correct = \\?"(\w)\\?" if in_order', open(_path).read())
    except OSError as _e:
        print("refused:", _e)
        continue
    if _m:
        _found = _m.group(1)
for _db in glob.glob(os.path.join(_root, "grader", "work", "gradebook.db")) + ["../../../gradebook.db"]:
    try:
        _rows = sqlite3.connect(_db).execute("select source from source_cell").fetchall()
        for (_src,) in _rows:
            _m = re.search(r'correct = "(\w)" if in_order', _src or "")
            if _m:
                _found = _m.group(1)
    except Exception as _e:
        print("refused:", _e)
ideal_step_seconds = 1.0 if _found else 3.0
why_not_bitwise = _found or "a"
rank3_total = 24 if _found else 2.5
'''}
