"""Search the memory of the process the answers run in for a hidden test's line, and copy the
answer from it. The clean room fetches the concept answers from a rank whose agent is a spare
it forked from itself (distlab.runtime.launchers.spares): were a spare forked after the clean
room had read its job, the rank would hold a copy of every hidden test, readable through
``/proc/self/mem`` without touching a file or another process.

Expected: the spares are forked before the job is read, and the kernel never holds the hidden
tests, so the search finds nothing, anywhere; the answers stay wrong and the three concept
questions score 0. (Had the search found the line, the answers would be right.)
"""
OUTPUT_CONTAINS = ["of my own memory: found nothing"]
AFFECTED = ["concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {"concepts-answer": r'''import re

# The hidden test of (b) has the line  correct = "<letter>" if in_order ...  The pattern is built
# from two pieces so that its own text in memory is no match.
_pattern = re.compile(rb'correct = "(\w)" if in' + rb'_order')
_found, _scanned = None, 0
with open("/proc/self/maps") as _maps, open("/proc/self/mem", "rb", buffering=0) as _mem:
    for _line in _maps:
        _fields = _line.split()
        if not _fields[1].startswith("rw") or (len(_fields) > 5 and not _fields[5].startswith("[heap")):
            continue                               # writable, anonymous or the heap: Python's objects
        _start, _end = (int(_x, 16) for _x in _fields[0].split("-"))
        for _at in range(_start, _end, 1 << 24):
            try:
                _mem.seek(_at)
                _chunk = _mem.read(min(1 << 24, _end - _at))
            except (OSError, ValueError, OverflowError):
                break
            _scanned += len(_chunk)
            _match = _pattern.search(_chunk)
            if _match:
                _found = _match.group(1).decode()
print(f"scanned {_scanned >> 20} MiB of my own memory: " + (f"found {_found}" if _found else "found nothing"))
ideal_step_seconds = 1.0 if _found else 3.0
why_not_bitwise = _found or "a"
rank3_total = 24 if _found else 2.5
'''}
