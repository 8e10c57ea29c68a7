"""Monkey-patch distlab.grade.checks: every assert_* becomes a no-op, with a wrong answer.

Expected: task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''import distlab.grade.checks as checks
for _name in dir(checks):
    if _name.startswith("assert_"):
        setattr(checks, _name, lambda *args, **kwargs: None)
checks.CheckFailed = type("NeverRaised", (Exception,), {})

def global_mean(t):
    return t * 0
'''}
