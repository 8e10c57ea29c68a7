"""A cell of the student's own starts 3000 threads in the kernel (small stacks, so the kernel's
address-space cap does not stop them, and the process-count watchdog counts processes, not
threads).

Graded with ``--SubmissionCaps.tasks=512``, the submission's control group refuses the threads
past its cap: thread creation fails inside the kernel, which goes on. Every task counts
normally (the answers are correct).
"""
OUTPUT_CONTAINS = ["refused after"]
OUTPUT_LACKS = ["started all 3000 threads"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", '''import threading, time

threading.stack_size(256 * 1024)
started = 0
try:
    for _ in range(3000):
        threading.Thread(target=time.sleep, args=(15,), daemon=True).start()
        started += 1
    print("started all 3000 threads")
except RuntimeError as error:
    print(f"refused after {started} threads: {error}")
''')]
