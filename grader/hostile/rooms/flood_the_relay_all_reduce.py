"""Chapter 2, task 3 as a flood of the grader's network: rank 0 stops reading the relay (it pauses
its link's reader thread, as any code in the rank may) and every other rank sends it 64 MiB at a
time, 4 GiB each, which nobody receives (with ``isend``: a blocking send waits for its
receiver, so only sends that do not wait can pile up). Without a cap the router, in the grader's clean room,
would hold all of it.

Expected: task 3 scores 0. The router holds at most 256 MiB per rank
(distlab.relay.holdings): past it the run stops, and every rank's link breaks with the verdict
naming the rank that sent too much and the one that did not receive.
"""

SLUG = "02-collectives"
AFFECTED = ["task3-tests"]
ANSWERS = {"task3-answer": '''
import sys, time
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    if dist.get_rank() == 0:
        sys.modules["distlab.relay.link"].link().pause_reader()
        time.sleep(600)
    flood = torch.zeros(16 * 2**20)        # 64 MiB
    sends = [dist.isend(flood, 0) for _ in range(64)]
    for send in sends:
        send.wait()
    return tensor
'''}
OUTPUT_CONTAINS = ["MiB that rank 0 has not received yet"]
