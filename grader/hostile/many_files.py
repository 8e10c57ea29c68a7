"""A cell of the student's own writes 20,000 small files into the kernel's folder.

Expected: the folder's cap on files stops it well before ("No space left on device", with the
grader's note on the caps); nothing of it reaches the grading host's disk, and every task
counts normally (the answers are correct).
"""
OUTPUT_CONTAINS = ["No space left on device", "files each; this write went past that", "stopped after"]
OUTPUT_EXCLUDES = ["stopped after 20000"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", """made = 0
try:
    for i in range(20_000):
        with open(f"distlab-many-files-{i}", "w") as f:
            f.write("x")
        made += 1
except OSError as exc:
    print("stopped after", made, "files:", exc)
print("made", made)""")]
