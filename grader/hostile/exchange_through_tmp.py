"""global_mean without a collective: every rank writes its tensor to a file in /tmp (through libc,
past the guard), reads the others' and averages them; no call, no byte on the wire.

Expected: task 2 scores 0. Each rank's /tmp is its own (distlab.grade.boundary.rank_room): the other
ranks' files never appear, and the rank gives up with a TimeoutError.
"""
from rooms._cheats import through

AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": through("/tmp") + '''

def global_mean(t):
    return (sum(x.to(torch.float64) for x in exchange(t)) / dist.get_world_size()).to(t.dtype)
'''}
OUTPUT_CONTAINS = ["never appeared in /tmp"]
