"""Monkey-patch builtins (isinstance, abs) so the concept question's checks "pass", with wrong answers.

Expected: the test's builtins are the grader's; the three concept questions score 0.
"""
AFFECTED = ["concept-a-tests", "concept-b-tests", "concept-c-tests"]
ANSWERS = {"concepts-answer": '''import builtins
builtins.isinstance = lambda *args: True
builtins.abs = lambda x: 0
ideal_step_seconds = 8
why_not_bitwise = "a"
rank3_total = 4
'''}
