"""A tiny training script, written the way people write the ones they run on many nodes.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; the script only joins the process
group, trains a small model with DDP on its shard of the data, and rank 0 prints one line
``RESULT <json>`` with what every rank saw. tests/runtime/test_slurm.py submits it through the job
script that ``python -m distlab.runtime.launchers.slurm script`` writes.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)
    mine = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = ((ddp(x[mine]) - y[mine]) ** 2).mean()
        loss.backward()
        optimizer.step()

    checksum = sum(p.detach().sum().item() for p in model.parameters())
    seen = [None] * world
    dist.all_gather_object(seen, {"rank": rank, "world": world, "node": os.environ.get("SLURMD_NODENAME"),
                                  "local_rank": int(os.environ["LOCAL_RANK"]),
                                  "checksum": round(checksum, 5),
                                  "offline": os.environ.get("HF_DATASETS_OFFLINE")})
    if rank == 0:
        print("RESULT " + json.dumps(seen), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
