"""A cell of the student's own writes 100 MB to the notebook in one message (one write, one
flush): jupyter_client read it whole into the nbgrader process, outside the submission's
control group, before the cell's output cap cut it.

Expected: the grader refuses the message unread (its sockets take at most
distlab.grade.boundary.kernel_messages.MAX_MESSAGE_BYTES per message) and says so in the cell; the
nbgrader process stays small; every task counts normally.
"""
OUTPUT_CONTAINS = ["more than the grader reads in one message"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", 'import sys\nsys.stdout.write("m" * (100 * 2**20))\nsys.stdout.flush()')]
