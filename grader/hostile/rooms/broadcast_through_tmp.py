"""Chapter 3, task 1: broadcast_parameters without a broadcast: rank 0's parameters reach the
others through files in /tmp (its ddp_step is the solution's).

Expected: task 1 scores 0: each rank's /tmp is its own (distlab.grade.boundary.rank_room).
"""
import build
from _cheats import through

SLUG = "03-ddp"
AFFECTED = ["task1-tests"]
_solution = build.solution_answers(SLUG)["task1-answer"]
ANSWERS = {"task1-answer": through("/tmp") + '''

def broadcast_parameters(model):
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensor.copy_(exchange(tensor)[0])


''' + _solution[_solution.index("def ddp_step"):]}
OUTPUT_CONTAINS = ["never appeared in /tmp"]
