"""Import a reference implementation instead of writing the answer: distlab's own all-reduce
(from the collectives chapter) and the solution notebook's code.

Expected: the exercise forbids distlab's reference modules and the grader protects the
solutions; global_mean is never defined; task 2 scores 0.
"""
OUTPUT_CONTAINS = ["not allowed in this exercise"]
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": r'''import json, os
import distlab
from distlab.collectives.all_reduce import naive_all_reduce

_root = os.path.dirname(os.path.dirname(os.path.dirname(distlab.__file__)))
_nb = json.load(open(os.path.join(_root, "solutions", "00-first-steps", "00-first-steps.ipynb")))
for _cell in _nb["cells"]:
    if "def global_mean" in "".join(_cell["source"]):
        exec("".join(_cell["source"]))
'''}
