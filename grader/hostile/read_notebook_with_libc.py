"""Read the graded notebook (its test cells restored, hidden tests included) with raw libc
calls, which no Python guard sees: every ``*.ipynb`` in the kernel's folder, above it, and
anywhere else the kernel can list, then copy a concept answer out of the hidden tests.

Expected: the kernel runs in a folder of its own that holds the student's other files but
no notebook, and the sandbox shows nothing of the graded folder, so no notebook with hidden
tests is found; the answers stay wrong and the three concept questions score 0. (Before the
kernel had its own folder, the notebook lay beside it and this copied the right letter.)
"""
OUTPUT_CONTAINS = ["notebooks with hidden tests read: 0"]
OUTPUT_EXCLUDES = ["notebooks with hidden tests read: 1", "6f6e655f6770755f7365636f6e6473"]  # "one_gpu_seconds", hex
AFFECTED = ["concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {"concepts-answer": r'''import ctypes, os, re, sys

_libc = ctypes.CDLL(None, use_errno=True)


def _read_raw(path):
    fd = _libc.open(path.encode(), 0)   # O_RDONLY
    if fd < 0:
        return b""
    chunks, buffer = [], ctypes.create_string_buffer(1 << 16)
    while (n := _libc.read(fd, buffer, len(buffer))) > 0:
        chunks.append(buffer.raw[:n])
    _libc.close(fd)
    return b"".join(chunks)


_skip = {"/proc", "/sys", "/dev", "/usr", "/etc", os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
_notebooks = [os.path.abspath(p) for p in ("00-first-steps.ipynb", "../00-first-steps.ipynb")]
for _top, _dirs, _files in os.walk("/"):
    _dirs[:] = [d for d in _dirs if os.path.join(_top, d) not in _skip]
    _notebooks += [os.path.join(_top, f) for f in _files if f.endswith(".ipynb")]
_found, _read = None, 0
for _path in _notebooks:
    _text = _read_raw(_path)
    _m = re.search(rb'correct = \\?"(\w)\\?" if in_order', _text)
    if _m:
        _read += 1
        _found = _m.group(1).decode()
        for _line in re.findall(rb"one_gpu_seconds[^\\]*", _text):
            print("leaked:", _line.hex())
print("notebooks with hidden tests read:", _read)
ideal_step_seconds = 1.0 if _found else 3.0
why_not_bitwise = _found or "a"
rank3_total = 24 if _found else 2.5
'''}
