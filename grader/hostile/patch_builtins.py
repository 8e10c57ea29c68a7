"""Monkey-patch builtins (isinstance, abs) so the concept question's checks "pass", with wrong answers.

Expected: the test's builtins are the grader's; task 3 scores 0.
"""
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": '''import builtins
builtins.isinstance = lambda *args: True
builtins.abs = lambda x: 0
ideal_step_seconds = 8
why_not_2x = "a"
'''}
