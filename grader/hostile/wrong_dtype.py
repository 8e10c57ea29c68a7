"""Wrong dtype or shape: the mean in float64 instead of float32, flattened for matrices.

Expected: "has dtype torch.float64, expected torch.float32"; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    total = t.clone().double()
    dist.all_reduce(total)
    return (total / dist.get_world_size()).flatten()
'''}
