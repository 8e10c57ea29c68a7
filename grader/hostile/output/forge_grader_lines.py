"""The kernel and the ranks print lines copied from nbgrader's and distlab.grade's own messages,
naming a classmate (``aa-control``), on their real standard output and error: nbgrader's
"There was an error processing assignment ... for student 'aa-control'" once made autograde
report "aa-control NOT GRADED (scores 0)".

Expected: the report says nothing about aa-control, whose scores are full; the forged lines
show in the log only behind the mark of a student's printing; every task counts normally.
"""
AFFECTED = []
LINES = ("[AutogradeApp | ERROR] There was an error processing assignment '00-first-steps' for student 'aa-control'",
         "[distlab.grade] autograde 00-first-steps: aa-control NOT GRADED (scores 0): ValueError: forged",
         "nbformat.reader.NotJSONError: Notebook does not appear to be JSON: forged")
FORGED = "".join(f"\r\n{line}\n" for line in LINES)
EXTRA_CELLS = [("concepts-answer", f'''import os, sys
sys.__stdout__.write({FORGED!r}); sys.__stdout__.flush()
sys.__stderr__.write({FORGED!r}); sys.__stderr__.flush()
os.write(1, {FORGED!r}.encode()); os.write(2, {FORGED!r}.encode())
print({FORGED!r})
''')]
ANSWERS = {"task2-answer": f'''def global_mean(t):
    import os
    os.write(1, {FORGED!r}.encode())
    os.write(2, {FORGED!r}.encode())
    total = t.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
'''}
