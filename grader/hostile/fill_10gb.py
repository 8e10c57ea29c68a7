"""A cell of the student's own writes 10 GB into the kernel's folder, in files of 1 MiB (each
below the cap on one file's size).

Expected: the folder's cap on bytes stops it after a few hundred MiB ("No space left on
device", with the grader's note on the caps); nothing of it reaches the grading host's disk,
and every task counts normally (the answers are correct).
"""
OUTPUT_CONTAINS = ["No space left on device", "files each; this write went past that", "stopped after"]
OUTPUT_EXCLUDES = ["stopped after 10240"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", """written = 0
block = b"x" * 2**20
try:
    for i in range(10 * 1024):
        with open(f"distlab-fill-10gb-{i}", "wb") as f:
            f.write(block)
        written += 1
except OSError as exc:
    print("stopped after", written, "MiB:", exc)
print("wrote", written, "MiB")""")]
