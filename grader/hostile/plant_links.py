"""Leave symbolic links in the folder the notebook is graded in, for the grader to follow
after the kernel ends: the notebook itself becomes a link to a file beside the gradebook (so
nbgrader, writing the graded notebook, would create or overwrite that file), and a second
link points at the gradebook (so the feedback, which copies the folder, would hand it back).
Raw libc calls: past any Python guard.

Expected: once the student's processes have ended, the grader removes every link from the
folder before it writes there again; nothing is written through them, the gradebook keeps
its permissions and never reaches the feedback. The answers are the solution's, so every
task counts normally.
"""
OUTPUT_CONTAINS = ["planted links: ['00-first-steps.ipynb', 'gradebook-copy.db']"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", r'''import ctypes, glob

_libc = ctypes.CDLL(None, use_errno=True)
_planted = []
for _name in glob.glob("*.ipynb"):
    _libc.unlink(_name.encode())
    if _libc.symlink(b"../../../planted-by-link.txt", _name.encode()) == 0:
        _planted.append(_name)
if _libc.symlink(b"../../../gradebook.db", b"gradebook-copy.db") == 0:
    _planted.append("gradebook-copy.db")
print("planted links:", sorted(_planted))
''')]
