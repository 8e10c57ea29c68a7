"""Silence IPython's error display so a failing test cell shows no error, with wrong answers.

nbgrader scores a cell by whether its output holds an error: in the kernel this would pass.
Expected: the tests run outside the kernel; task 3 scores 0.
"""
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": '''try:
    ip = get_ipython()
    ip.showtraceback = lambda *args, **kwargs: None
    ip._showtraceback = lambda *args, **kwargs: None
except NameError:
    pass
ideal_step_seconds = 8
why_not_2x = "d"
'''}
