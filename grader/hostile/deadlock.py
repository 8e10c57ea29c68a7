"""A deadlocked collective: only rank 0 joins the all-reduce.

Expected: rank 0 waits until the run's timeout; task 2 scores 0 and nothing is left running.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    total = t.clone()
    if dist.get_rank() == 0:
        dist.all_reduce(total)
    return total / dist.get_world_size()
'''}
