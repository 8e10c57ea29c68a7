"""One rank raises inside the collective exercise.

Expected: RankError naming rank 1; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    if dist.get_rank() == 1:
        raise ValueError("rank 1 gives up")
    total = t.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()
'''}
