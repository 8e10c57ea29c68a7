"""Return the mean flattened (right for vectors, wrong shape for matrices).

Expected: the visible test passes, the hidden one reports the shape; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    total = t.clone()
    dist.all_reduce(total)
    return (total / dist.get_world_size()).flatten()
'''}
