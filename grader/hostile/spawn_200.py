"""Task 1's function starts 200 long-lived processes in new sessions on every rank.

Expected: starting processes is refused on a graded rank ("not allowed in this exercise"),
task 1 scores 0, and no process carrying the marker exists after grading.
"""
OUTPUT_CONTAINS = ["not allowed in this exercise"]
AFFECTED = ["task1-tests"]
MARKER = "distlab-hostile-spawn200"
ANSWERS = {"task1-answer": '''import subprocess, sys

def my_rank():
    for _ in range(200):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "distlab-hostile-spawn200"],
                         start_new_session=True)
    return dist.get_rank()
'''}
