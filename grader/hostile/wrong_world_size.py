"""Hard-code the world size: divide by 4 whatever the number of ranks (right at 4, wrong at 2).

Expected: the test at 2 ranks catches it; task 2 scores 0.
"""
AFFECTED = ["task2-tests"]
ANSWERS = {"task2-answer": '''def global_mean(t):
    total = t.clone()
    dist.all_reduce(total)
    return total / 4
'''}
