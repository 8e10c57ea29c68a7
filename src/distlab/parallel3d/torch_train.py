"""3D parallelism with torch's own tools: DTensor tensor parallelism, then FSDP2, in torchtitan's order.

The same layout as :mod:`.train`, built from torch's pieces: DTensor tensor parallelism
(:func:`distlab.tensor_parallel.dtensor.parallelize`, chapter 5's plan: ``ColwiseParallel`` /
``RowwiseParallel`` per block, q, k and v as three layers) on the ``tp`` sub-mesh, then FSDP2
(``fully_shard``, ZeRO-3) over the ``dp`` sub-mesh: torchtitan's "FSDP + TP".

Torch's path has no pipeline here (``pp > 1`` raises ``NotImplementedError``;
:mod:`distlab.pipeline_parallel.torch_pipelining` shows ``torch.distributed.pipelining`` alone).
ZeRO over a dp *subgroup* is torch's FSDP2 path: :mod:`distlab.zero` shards over all ranks,
not over a group. Kept out: sequence parallelism (:mod:`distlab.tensor_parallel` has it;
the bytes are the same), interleaved stages, mixed precision.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab import models
from distlab.parallel3d.mesh import Grid, device_mesh
from distlab.parallel3d.train import OPTIMIZERS, global_mean, slowest
from distlab.tools import comm, memory


def torch_parallelize(model: models.TinyGPT, mesh) -> nn.Module:
    """TinyGPT under torch's tools: DTensor TP on ``mesh["tp"]``, then FSDP2 on ``mesh["dp"]``.

    The order is torchtitan's ``parallelize``, and it is not a matter of taste:

    1. **TP first**: :func:`distlab.tensor_parallel.dtensor.parallelize` (vocab-parallel
       embedding and output layer, column-wise q, k, v and fc1, row-wise proj and fc2) turns
       each weight into a DTensor sharded over the tp sub-mesh. It must see plain modules:
       its plan names them (``blocks.0.attn.q``), and FSDP's wrapping would hide them.
    2. (Activation checkpointing, where a model uses it, wraps each block next: the block's
       forward is recomputed in backward *with* its TP collectives, and FSDP, applied after,
       gathers the weights that recomputation needs.)
    3. **FSDP last**: ``fully_shard`` each block, then the root, over the dp sub-mesh. Every
       parameter, already a tp shard, is sharded again ``dp`` ways (a 2D placement), and its
       gradients are reduce-scattered over the dp ranks only. Blocks first, root last: the
       root's unit then holds only what no block holds (embeddings, final norm, head).
    """
    from torch.distributed.fsdp import fully_shard

    from distlab.tensor_parallel import dtensor

    tp, dp = mesh["tp"].size(), mesh["dp"].size()
    if tp > 1:
        model = dtensor.parallelize(model, mesh["tp"])
    if dp > 1:
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


def torch_loss(model: nn.Module, batch, tp: int) -> torch.Tensor:
    """Forward and backward with torch's tools; vocab-sharded logits go through ``loss_parallel``."""
    from distlab.tensor_parallel import dtensor

    if tp == 1:
        loss = models.loss_fn(model, batch)
        loss.backward()
        return loss
    loss = dtensor.loss(model, batch)
    dtensor.backward(loss)
    return loss


@contextmanager
def _quiet():
    """Silence advice of FSDP2 and DTensor that does not apply here (view outputs, hooks, strided gathers)."""
    import warnings

    from distlab.tensor_parallel.dtensor import quiet_redistribute

    with warnings.catch_warnings(), quiet_redistribute():
        warnings.filterwarnings("ignore", message=".*(FSDP2-wrapped module|Full backward hook).*")
        yield


@_quiet()
def train_torch(grid: Grid, steps: int = 3, lr: float = 0.1, batch_size: int = 8, optimizer: str = "sgd",
                seed: int = 0, config: dict | None = None, keep_gradients: bool = False) -> dict:
    """:func:`distlab.parallel3d.train.train` with DTensor TP + FSDP2 (:func:`torch_parallelize`); same data, same result keys.

    Differences: ``sent`` has only ``"dp"``, FSDP2's all-gathers and reduce-scatters (DTensor's
    collectives bypass the Python functions :mod:`distlab.tools.comm` records); ``calls`` is
    ``CommDebugMode``'s count of every collective, TP's included. ``gradients`` and
    ``expected`` are full tensors named as in TinyGPT (:func:`distlab.tensor_parallel.dtensor.reference_gradients`).
    """
    from torch.distributed.tensor.debug import CommDebugMode

    from distlab.tensor_parallel import dtensor

    if grid.pp > 1:
        raise NotImplementedError("pp > 1 with torch's tools: torch.distributed.pipelining would plug in here")
    config = dict(config or {})
    mesh = device_mesh(grid)
    tp, dp, dp_rank = grid.tp, grid.dp, mesh["dp"].get_local_rank()
    model = torch_parallelize(models.build("gpt", seed=seed, **config), mesh)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    out = {"coords": {axis: mesh[axis].get_local_rank() for axis in grid.order}, "losses": [], "seconds": []}
    for step in range(steps):
        batch = models.shard(models.example_batch("gpt", batch_size, seed=step, **config), dp_rank, dp)
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with CommDebugMode() as debug, comm.record() as log:
            loss = torch_loss(model, batch, tp)
        if step == 0 and keep_gradients:
            out["gradients"] = dtensor.reference_gradients(model)
        opt.step()
        out["seconds"].append(slowest(time.perf_counter() - start))
        out["losses"].append(global_mean(_local_value(loss), mesh["dp"].get_group()))
    out["sent"] = {"dp": log.bytes_sent()}
    out["calls"] = {str(op): n for op, n in debug.get_comm_counts().items()}
    out["bytes"] = memory.model_state_bytes(model, opt)
    if keep_gradients:
        reference = models.build("gpt", seed=seed, **config)
        out["expected"] = models.reference_gradients(reference, models.example_batch("gpt", batch_size, seed=0, **config))
    return out


def _local_value(loss: torch.Tensor) -> float:
    return (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item()
