"""Replace distlab.run in the kernel by a fake that returns the expected ranks, with a wrong answer.

Expected: the grader's distlab.run is its own; task 1 scores 0.
"""
AFFECTED = ["task1-tests"]
ANSWERS = {"task1-answer": '''import distlab, distlab.runtime.run

def _fake_run(fn, *args, nprocs=2, **kwargs):
    return list(range(nprocs))

distlab.run = distlab.runtime.run.run = _fake_run

def my_rank():
    return 0
'''}
