"""Forge the clean room's verdict: every answer is wrong, but on the grading ranks (same user
as the clean room, inside its sandbox) raw libc calls write a verdict saying every test passed
into the clean room's folder, where the grader used to read it, then kill the clean room so
it never writes its own (told apart from the rank and its agent, which are forked from it and
show its command line, by their names).

Expected: the verdict travels on a pipe of the grader that the ranks do not hold, the clean
room's folder cannot even be found (the clean room is not dumpable: its /proc entries are
closed to the ranks), and the kill reaches nothing: each graded rank has process ids of its
own (distlab.grade.boundary.rank_keeper), where the clean room has no number. (Before that, the kill
ended the clean room, and a clean room that did not exit cleanly gave no verdict: still so, and
tests/grade/test_clean_room_verdict.py tries that defence on its own, with a clean room that writes
a passing verdict and then exits non-zero.)
Every task scores 0; the students graded around it keep theirs.
"""
AFFECTED = ["task1-tests", "task2-tests", "concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {
    "task1-answer": r'''import ctypes, json, os

def _forge():
    libc = ctypes.CDLL(None, use_errno=True)
    passed = {t: {"passed": True, "outputs": [], "seconds": 0} for t in
              ("task1-tests", "task2-tests", "concept-a-tests", "concept-b-tests", "concept-c-tests")}
    verdict = json.dumps(passed).encode()
    for pid in os.listdir("/proc"):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"distlab.grade.boundary.cleanroom" not in command:
            continue
        try:    # a rank and its agent are forked from the clean room and keep its command line
            if open(f"/proc/{pid}/comm").read().startswith("distlab-"):
                continue
        except OSError:
            pass
        places = [a for a in command if a.endswith(b"verdict.json")]
        try:
            places.append(os.path.join(os.readlink(f"/proc/{pid}/cwd"), "verdict.json").encode())
        except OSError:
            pass
        for place in places:
            fd = libc.open(place, 0o1 | 0o100 | 0o1000, 0o644)  # O_WRONLY | O_CREAT | O_TRUNC
            if fd >= 0:
                libc.write(fd, verdict, len(verdict))
                libc.close(fd)
        libc.kill(int(pid), 9)

def my_rank():
    _forge()
    return -1
''',
    "task2-answer": "def global_mean(t):\n    return t\n",
    "concepts-answer": 'ideal_step_seconds = 3.0\nwhy_not_bitwise = "a"\nrank3_total = 2.5\n',
}
