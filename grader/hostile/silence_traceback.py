"""Silence IPython's error display so a failing test cell shows no error, with wrong answers.

nbgrader scores a cell by whether its output holds an error: in the kernel this would pass.
Expected: the tests run outside the kernel; the three concept questions score 0.
"""
AFFECTED = ["concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {"concepts-answer": '''try:
    ip = get_ipython()
    ip.showtraceback = lambda *args, **kwargs: None
    ip._showtraceback = lambda *args, **kwargs: None
except NameError:
    pass
ideal_step_seconds = 8
why_not_bitwise = "d"
rank3_total = 2.5
'''}
