"""One GPU to many: a complete data-parallel training script, to copy and adapt.

The same file runs on one process, on the ranks of one machine and on many nodes::

    python templates/train.py --epochs 2                               # one process
    torchrun --nproc-per-node 4 templates/train.py --epochs 2          # four ranks here
    distlab-slurm script --nodes 2 -- templates/train.py --epochs 2 > train.sbatch
    sbatch train.sbatch                                                # two nodes of a cluster

What each part does and why is in the book's appendix "The complete training script". In
order: join the job (:func:`setup`), build the data loaders with a sampler per rank
(:func:`make_loaders`), wrap the model (:func:`wrap`), train and validate with
``set_epoch`` every epoch (:func:`train`), save and resume checkpoints, full or sharded
(:func:`save_checkpoint`, :func:`load_checkpoint`), and leave the process group.
Everything distributed is plain PyTorch; from the course's package come only the small
language model and the data set (byte windows of a public-domain text).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from distlab import models
from distlab.data import corpus


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=64,
                        help="sequences per optimizer step, over all ranks together (must divide by the ranks)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="stop an epoch early (0: the whole data set)")
    parser.add_argument("--validation-steps", type=int, default=0, help="validate on fewer batches (0: all)")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp",
                        help="ddp: a full copy per rank; fsdp: parameters, gradients and Adam state sharded")
    parser.add_argument("--checkpoint", choices=["full", "sharded"], default="full",
                        help="full: one file written by rank 0; sharded: every rank writes its part (DCP)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    parser.add_argument("--data", type=Path, default=None,
                        help="a data set saved on a login node (distlab.data.corpus.prepare_on_login_node); "
                             "default: the course's own corpus")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


# -- 1. Join the job ----------------------------------------------------------------------------

def setup() -> torch.device:
    """Join the process group; choose the device and the backend from what this node has.

    torchrun (or Slurm through it) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT. Started as a plain ``python train.py``, the script is a job of one rank.
    """
    if "RANK" not in os.environ:                               # one process, no launcher
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)             # one GPU per rank, by local rank
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        # Ranks of one node share its cores: without this, each would start a thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        dist.init_process_group("gloo")
    return device


def log(*parts) -> None:
    """Print once per job, not once per rank."""
    if dist.get_rank() == 0:
        print(*parts, flush=True)


# -- 2. Data: every rank reads only its share -------------------------------------------------

def make_loaders(args, world: int, rank: int) -> tuple[DataLoader, DataLoader]:
    """Training and validation loaders, each rank seeing a disjoint slice of every global batch.

    ``DistributedSampler`` shuffles all indices with the same seed on every rank (plus the
    epoch, see ``set_epoch``) and gives rank ``r`` the indices ``r, r + N, r + 2N, ...``, so the
    first ``B/N`` of each rank make up the first global batch of ``B``: the same batch one
    process would draw. ``drop_last`` keeps every rank at the same number of steps: a rank
    with one step more would wait forever in its extra all-reduce.
    """
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not divide by {world} ranks")
    data = corpus.load_on_compute_node(args.data) if args.data else corpus.corpus_dataset()
    split = data.train_test_split(test_size=0.05, seed=args.seed)   # the same split on every rank

    def loader(part, shuffle: bool) -> DataLoader:
        sampler = DistributedSampler(part, num_replicas=world, rank=rank, shuffle=shuffle, seed=args.seed,
                                     drop_last=True)
        return DataLoader(part, batch_size=args.global_batch // world, sampler=sampler, drop_last=True,
                          collate_fn=lambda rows: corpus.lm_batch(torch.stack([r["tokens"] for r in rows])))

    return loader(split["train"], shuffle=True), loader(split["test"], shuffle=False)


# -- 3. The model, wrapped for data parallelism -----------------------------------------------

def wrap(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    """DDP keeps a full copy per rank and averages gradients; FSDP2 shards everything (chapter 4)."""
    model = model.to(device)
    # FSDP2 warns that the logits are a view, in case the caller modifies them in place; the loss never does.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if strategy == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    for block in model.blocks:                                 # one all-gather per block, then the rest
        fully_shard(block)
    return fully_shard(model)


# -- 4. Checkpoints: written last, found by a marker ------------------------------------------

def save_checkpoint(model, optimizer, epoch: int, args) -> None:
    """Save after ``epoch``; ``latest.json``, written last by rank 0, names the complete checkpoint.

    A job killed while saving leaves the previous marker, so a restart resumes from the last
    checkpoint that was written whole.
    """
    folder = args.checkpoint_dir / f"epoch-{epoch}"
    if args.checkpoint == "full":
        # Every rank takes part in gathering (the shards of FSDP), only rank 0 keeps the result, on CPU.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(model, optimizer, options=options)
        if dist.get_rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model_state, "optimizer": optim_state}, folder / "full.pt")
    else:
        # Every rank writes its own shards, in parallel; DCP writes a replicated tensor once.
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)
    dist.barrier()                                             # every part is on disk before the marker
    if dist.get_rank() == 0:
        marker = args.checkpoint_dir / "latest.json"
        marker.with_suffix(".tmp").write_text(json.dumps({"epoch": epoch, "format": args.checkpoint,
                                                          "folder": folder.name}))
        marker.with_suffix(".tmp").rename(marker)


def load_checkpoint(model, optimizer, args) -> int:
    """Load the latest complete checkpoint into ``model`` and ``optimizer``; return the next epoch."""
    marker = args.checkpoint_dir / "latest.json"
    if not marker.exists():
        log(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")
        return 0
    latest = json.loads(marker.read_text())
    folder = args.checkpoint_dir / latest["folder"]
    if latest["format"] == "full":
        # Rank 0 reads the file; set_state_dict sends every rank its part (or its copy).
        state = torch.load(folder / "full.pt", map_location="cpu") if dist.get_rank() == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_state_dict(model, optimizer, model_state_dict=state.get("model", {}),
                       optim_state_dict=state.get("optimizer", {}), options=options)
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=folder)                  # every rank reads its own shards
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    log(f"resumed from {folder} ({latest['format']} checkpoint of epoch {latest['epoch']})")
    return latest["epoch"] + 1


# -- 5. Train and validate ---------------------------------------------------------------------

def mean_over_ranks(total: float, count: int, device) -> float:
    """The mean of a quantity summed on every rank: one all-reduce of (sum, count)."""
    t = torch.tensor([total, count], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def train(args) -> None:
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        train_loader, val_loader = make_loaders(args, world, rank)
        model = wrap(models.build("gpt", seed=args.seed), args.strategy, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        log(f"{world} rank(s) on {device.type} ({dist.get_backend()}), {args.strategy}, global batch "
            f"{args.global_batch} = {world} x {args.global_batch // world}, {len(train_loader)} steps per epoch")
        start = load_checkpoint(model, optimizer, args) if args.resume else 0
        for epoch in range(start, args.epochs):
            train_loader.sampler.set_epoch(epoch)              # a new shuffle each epoch, the same on every rank
            model.train()
            began, seen, total, tokens = time.perf_counter(), 0, 0.0, 0
            for step, (inputs, targets) in enumerate(train_loader):
                if args.steps_per_epoch and step == args.steps_per_epoch:
                    break
                loss = models.loss_fn(model, (inputs.to(device), targets.to(device)))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()                                # DDP/FSDP average the gradients here
                optimizer.step()
                total, seen, tokens = total + loss.item(), seen + 1, tokens + inputs.numel() * world
            seconds = time.perf_counter() - began
            train_loss = mean_over_ranks(total, seen, device)
            model.eval()
            with torch.no_grad():
                val = [models.loss_fn(model, (x.to(device), y.to(device))).item()
                       for step, (x, y) in zip(range(args.validation_steps or len(val_loader)), val_loader)]
            val_loss = mean_over_ranks(sum(val), len(val), device)
            log(f"epoch {epoch}: train loss {train_loss:.4f}, validation loss {val_loss:.4f}, "
                f"{tokens / seconds:,.0f} tokens/s")
            save_checkpoint(model, optimizer, epoch, args)
    finally:
        dist.destroy_process_group()                           # leave cleanly, also after an error


if __name__ == "__main__":
    train(parse_args())
