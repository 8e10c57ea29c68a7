"""The kernel and the ranks print terminal escape sequences (clear the screen, set the
window's title, colours, a cursor moved back over a line) to their real standard output and
error, and in a cell's output.

Expected: none reaches the instructor's terminal or the log as an escape (they are shown
escaped, ``\\x1b``); every task counts normally.
"""
AFFECTED = []
ESCAPES = "\\x1b[2J\\x1b[H\\x1b]0;you have been graded\\x07\\x1b[31mred\\x1b[0m\\rback over\\x08\\x08 \\x9b1m"
EXTRA_CELLS = [("concepts-answer", f'''import os, sys
sys.__stdout__.write("{ESCAPES}\\n"); sys.__stdout__.flush()
sys.__stderr__.write("{ESCAPES}\\n"); sys.__stderr__.flush()
os.write(1, "{ESCAPES}\\n".encode()); os.write(2, "{ESCAPES}\\n".encode())
print("{ESCAPES}")
''')]
ANSWERS = {"task1-answer": f'''def my_rank():
    import os
    os.write(1, "{ESCAPES}\\n".encode())
    os.write(2, "{ESCAPES}\\n".encode())
    return dist.get_rank()
'''}
