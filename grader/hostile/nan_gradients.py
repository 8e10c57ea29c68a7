"""Return NaN for matrices (so gradients of a weight matrix are NaN), right for vectors.

Expected: the visible test (vectors) passes, the hidden gradient test fails; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    total = t.clone()
    dist.all_reduce(total)
    if total.dim() > 1:
        return total * float("nan")
    return total / dist.get_world_size()
'''}
