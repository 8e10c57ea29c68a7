"""Task 2's function allocates 10 GB on every rank (40 GB at 4 ranks, on a 24 GiB machine).

Expected: the rank's memory cap makes the allocation fail inside the rank (a RuntimeError),
the machine stays up, task 2 scores 0.
"""
OUTPUT_CONTAINS = ["can't allocate memory"]
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    hog = torch.ones(10 * 2**30 // 4)
    total = t.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size() + hog[0] * 0
'''}
