"""Leave symbolic links where the kernel works, for the grader to follow after the kernel
ends: one named like the notebook, pointing at a file beside the gradebook (were it the
graded notebook, nbgrader would create or overwrite that file when it writes the graded
notebook), and one pointing at the gradebook (were it in the graded folder, the feedback,
which copies that folder, would hand it back). Raw libc calls: past any Python guard.

Expected: the kernel works in a folder of its own, which the grader deletes without
following links; nothing of it reaches the graded folder, nothing is written through the
links, the gradebook keeps its permissions and never reaches the feedback. The answers are
the solution's, so every task counts normally.
"""
OUTPUT_CONTAINS = ["planted links: ['00-first-steps.ipynb', 'gradebook-copy.db']"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", r'''import ctypes, glob

_libc = ctypes.CDLL(None, use_errno=True)
_planted = []
for _name in glob.glob("*.ipynb") or ["00-first-steps.ipynb"]:
    _libc.unlink(_name.encode())
    if _libc.symlink(b"../../../planted-by-link.txt", _name.encode()) == 0:
        _planted.append(_name)
if _libc.symlink(b"../../../gradebook.db", b"gradebook-copy.db") == 0:
    _planted.append("gradebook-copy.db")
print("planted links:", sorted(_planted))
''')]
