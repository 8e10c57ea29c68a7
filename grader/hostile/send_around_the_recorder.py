"""Send around the byte recorder: global_mean gathers every rank's whole tensor (twice the
bytes of an all-reduce on 4 ranks) through the unwrapped all_gather that distlab.tools.comm
keeps for its own use, so the ranks' record shows no call and no byte; the values are right.

Expected: task 2 scores 0. The grader counts the bytes on the clean room's private loopback
outside the ranks (distlab.grade.boundary.wire): the hidden 1 MiB case puts about 12 MB there, where
an all-reduce needs 6.3 MB, and the record says 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''from distlab.tools import comm

def global_mean(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    comm.original("all_gather")(parts, t)          # not recorded: no call, no byte
    return torch.stack(parts).mean(0)
'''}
