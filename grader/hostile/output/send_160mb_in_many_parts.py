"""A cell of the student's own sends one message of 160 MiB in 40 parts of 4 MiB, on the
kernel's own IOPub socket: each part is under the grader's per-part cap (ZeroMQ's
ZMQ_MAXMSGSIZE), and ZeroMQ keeps every part of a message in the reader's process until the
last one is in, so the nbgrader process held it whole.

Expected: the proxy between the kernel and the grader (distlab.grade.boundary.kernel_proxy) counts the
parts together and drops the message as it arrives; the cell says so in the feedback; the
nbgrader process stays small; every task counts normally.
"""
OUTPUT_CONTAINS = ["more than the grader reads in one message"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", 'k = get_ipython().kernel\n'
                                   'sent = k.session.send(k.iopub_socket, "stream", {"name": "stdout", "text": "parts"},\n'
                                   '                      parent=k.get_parent("shell"), buffers=[b"m" * (4 * 2**20)] * 40)')]
