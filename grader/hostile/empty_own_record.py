"""Move too many bytes, then empty the rank's own record: global_mean gathers every rank's whole
tensor (on 4 ranks, twice the bytes an all-reduce needs) and clears the log that
distlab.tools.comm keeps on the rank, so the ranks' record shows no call and no byte.

Expected: task 2 scores 0. The test runs the ranks on the grader's relay (distlab.relay): the
all-gather goes through the router, in the clean room, which counts (N-1) * 1 MiB for each
rank of the hidden 1 MiB case, over the 1.5 MiB an all-reduce needs; the rank cannot reach
that record.
"""
AFFECTED = ["task2-tests"]
OUTPUT_CONTAINS = ["through the grader's network (counted there, outside the ranks)"]
ANSWERS = {"task2-answer": '''from distlab.tools import comm

def global_mean(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    for log in comm._recorders:      # what this rank wrote down about itself: gone
        log.clear()
    return torch.stack(parts).mean(0)
'''}
