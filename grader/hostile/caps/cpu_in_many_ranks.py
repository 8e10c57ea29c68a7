"""A cell of the student's own starts four ranks from the kernel, and each burns 8 seconds of
CPU: 32 CPU-seconds in all. The kernel has no CPU cap of its own, and each rank's count starts
at zero, so no per-process cap stops them.

Graded with ``--SubmissionCaps.cpu_s=20``, the kernel's control group adds up the CPU time of
the kernel and its ranks, and the grader ends them all once the sum passes 20 (an honest
chapter-0 kernel and its ranks use about 2 CPU-seconds). The cell's output says why; the cells
after it do not run in the kernel. The tests run in the clean room, where this cell starts
nothing (it runs on a rank there, where torch.distributed is set up), so every task counts
normally: the answers are correct. (Graded without the cap, the cell prints "burned all: 32
CPU-seconds" and the kernel runs on.)
"""
OUTPUT_CONTAINS = ["CPU budget"]
OUTPUT_LACKS = ["burned all"]
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", '''import time

import distlab
import torch.distributed as dist


def burn():
    while time.process_time() < 8:   # this rank's own CPU time, in seconds
        pass
    return time.process_time()


if not dist.is_initialized():   # in the kernel (on a rank, torch.distributed is set up)
    used = distlab.run(burn, nprocs=4, timeout=300)
    print(f"burned all: {sum(used):.0f} CPU-seconds")
''')]
