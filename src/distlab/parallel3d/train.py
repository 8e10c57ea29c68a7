"""The training step of 3D parallelism: tensor parallelism inside groups, pipelines across them, data parallelism around both.

On a :class:`distlab.parallel3d.mesh.Grid` of ``dp x pp x tp`` ranks, one step nests three earlier chapters:

1. Each **tp group** holds one copy of its layers with every matrix split ``tp`` ways
   (:func:`distlab.tensor_parallel.model.parallelize_gpt`, given the group's process group), and
   all its ranks run forward and backward on the *same* data: the activations' all-reduces
   stay inside the group (:func:`build_model`, :func:`loss_fn`).
2. Each **pp group** runs one pipeline: its ranks hold consecutive stages of the model
   (:func:`distlab.pipeline_parallel.stages.split_gpt`) and pass micro-batches' activations forward and
   their gradients back, point to point (:func:`forward_backward`, which hands the stage
   to :func:`distlab.pipeline_parallel.training.run_step` with the pp group). The tp ranks of a stage each
   talk to the rank of the next stage with the same tp coordinate.
3. The ``dp`` copies of all that train on different shards of the batch (:func:`my_batch`:
   the shard is chosen by the dp coordinate alone). After backward, each rank averages its
   gradients with the ranks that hold *the same slice of the same weights*: its **dp
   group** (:func:`average_gradients`, one all-reduce of one flat buffer, ``ReduceOp.AVG``).

Why the result is exactly the single-process step: on each rank, tensor parallelism gives
the exact slice of the gradient of its dp shard's mean loss (chapter 5), and a pipeline the
exact gradient of its stage's parameters (chapter 6); averaging the gradients of equal
shards gives the gradient of the whole batch's mean loss (chapter 3). So every layout
follows the single-process loss curve, up to float32 rounding (:func:`train` on the ranks,
:func:`distlab.parallel3d.runs.run_layouts` from a notebook, :func:`reference_losses`).

Bytes each rank sends per step, with ``b`` sequences per dp shard, ``s`` tokens each, width
``h``, ``L`` blocks, ``P_local`` parameters on the rank and ``AR(S) = 2 (n-1)/n * S``
(:mod:`distlab.tools.comm_bytes`'s convention; :func:`distlab.parallel3d.predict.predict_run` computes them):

* **tp**: per block two all-reduces forward and two backward of the ``(b, s, h)``
  activations; one more forward for the vocab-parallel embedding and one backward for the
  output layer; three of ``(b, s)`` for the vocab-parallel cross-entropy:
  ``(4L + 2) * AR(4bsh) + 3 * AR(4bs)`` over the tp group.
* **dp**: ``AR(4 * P_local)`` over the dp group. With tensor parallelism ``P_local`` is about
  ``P / tp``: each dp group averages a smaller slice (with pipelines, of its stage only).
* **pp**: per micro-batch of ``b/m`` sequences, ``4 (b/m) s h`` bytes to the next stage
  (unless last) and as many back to the previous one (unless first). Inside a pipeline the
  last stage computes the same vocab-parallel loss, per micro-batch: the logits are never
  gathered, with or without pipelining.

The same layout with torch's own tools is :mod:`.torch_train`; :mod:`.runs` trains several
layouts in one launch, from a notebook.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab import models
from distlab.parallel3d.mesh import Grid, ProcessGrid
from distlab.pipeline_parallel.schedules import make_schedule
from distlab.pipeline_parallel.stages import split_gpt
from distlab.pipeline_parallel.training import run_step
from distlab.tensor_parallel.layers import shard_like, vocab_parallel_cross_entropy
from distlab.tensor_parallel.model import ParallelGPT, parallelize_gpt
from distlab.tensor_parallel.model import loss as tensor_parallel_loss
from distlab.tools import comm, memory

OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


# -- the pieces of a step (from-scratch version) ---------------------------------------------------

def build_model(reference: models.TinyGPT, pg: ProcessGrid) -> nn.Module:
    """What this rank trains: ``reference`` sliced ``tp`` ways (unless ``tp == 1``), then cut to my pipeline stage.

    With ``pp > 1`` the result is a :class:`distlab.pipeline_parallel.stages.Stage`: only my stage's modules,
    under the reference's parameter names. With ``tp > 1`` its output layer, on the last
    stage, keeps the logits split along the vocabulary, for :func:`stage_loss_fn`.
    """
    model = reference
    if pg.size("tp") > 1:
        model = parallelize_gpt(reference, group=pg.group("tp"))
    if pg.size("pp") == 1:
        return model
    return split_gpt(model, pg.size("pp"))[pg.rank_in("pp")]


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """Mean next-token loss of ``batch``: vocab-parallel for a tensor-parallel model."""
    if isinstance(model, ParallelGPT):
        return tensor_parallel_loss(model, batch)
    return models.loss_fn(model, batch)


def stage_loss_fn(pg: ProcessGrid):
    """The pipeline's last-stage loss of one micro-batch: vocab-parallel over my tp group when ``tp > 1``."""
    if pg.size("tp") == 1:
        return None                                        # the executor's plain cross-entropy
    group = pg.group("tp")
    return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, group).mean()


def my_batch(batch, pg: ProcessGrid):
    """My dp group's shard of the global ``batch``: chosen by my dp coordinate alone."""
    return models.shard(batch, pg.rank_in("dp"), pg.size("dp"))


def forward_backward(model: nn.Module, batch, pg: ProcessGrid, micro_batches: int = 2,
                     schedule: str = "1f1b") -> float | None:
    """Forward and backward of my dp shard; returns its mean loss (``None`` on a stage that has none).

    Without pipelining: the loss, then backward. With it: my stage runs its part of
    ``schedule`` over ``micro_batches`` micro-batches in my pp group; only the last stage
    sees the loss.
    """
    if pg.size("pp") == 1:
        loss = loss_fn(model, batch)
        loss.backward()
        return loss.item()
    stages = pg.size("pp")
    result = run_step({pg.rank_in("pp"): model}, make_schedule(schedule, stages, micro_batches),
                      batch, micro_batches, trace=False, group=pg.group("pp"), loss_fn=stage_loss_fn(pg))
    return result.loss


def average_gradients(model: nn.Module, group) -> None:
    """Average every gradient over ``group`` (my dp group): one all-reduce of one flat buffer.

    The ranks of a dp group hold the same slice of the same parameters in the same order,
    so their flat buffers line up element by element. Nothing to do in a group of one.
    """
    if dist.get_world_size(group) == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)
    for g, averaged in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(averaged.view_as(g))


# -- a training run on the ranks ------------------------------------------------------------------

def _full_batch_loss(loss: float | None, pg: ProcessGrid) -> float:
    """The whole batch's loss on every rank: from the last stage, averaged over dp (bookkeeping, not algorithm)."""
    t = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64)
    dist.all_reduce(t, group=pg.group("pp"))                       # only the last stage adds a loss
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=pg.group("dp"))
    return t.item()


def global_mean(value: float, group) -> float:
    """The mean of ``value`` over ``group``, on every rank of it (bookkeeping, float64)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
    return t.item()


def slowest(seconds: float) -> float:
    """The largest ``seconds`` over all ranks: a step takes as long as its slowest rank."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def train(grid: Grid, steps: int = 3, lr: float = 0.1, batch_size: int = 8, optimizer: str = "sgd",
          seed: int = 0, config: dict | None = None, keep_gradients: bool = False, micro_batches: int = 2,
          schedule: str = "1f1b") -> dict:
    """Train TinyGPT on ``grid`` for ``steps`` steps (on every rank); return what happened on this rank.

    Step ``i`` uses the global batch ``models.example_batch("gpt", batch_size, seed=i)``, of which
    each dp group takes its shard; pipelines cut their shard into ``micro_batches`` and run
    ``schedule`` (a name in :data:`distlab.pipeline_parallel.schedules.SCHEDULES`). Returns a dict with:

    * ``coords``: my grid coordinates;
    * ``losses``: the full-batch loss before each step (the mean of the dp shards' losses);
    * ``seconds``: each step's time on the slowest rank;
    * ``bytes``: parameters, gradients and optimizer state held after the last step (:mod:`distlab.tools.memory`);
    * ``sent``: bytes sent in the last step, ``{"tp": ..., "dp": ..., "pp": ...}`` (:mod:`distlab.tools.comm`);
      forward/backward collectives are the tp group's, p2p ops the pp group's, the gradient
      average the dp group's;
    * ``calls``: the same calls counted by op, per axis;
    * with ``keep_gradients``, ``gradients`` (my averaged gradient slices after the first step,
      of my stage's parameters) and ``expected`` (the same slices of the single-process
      full-batch gradient).
    """
    config = dict(config or {})
    pg = ProcessGrid(grid)
    reference = models.build("gpt", seed=seed, **config)
    model = build_model(models.build("gpt", seed=seed, **config), pg)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    out = {"coords": pg.coords, "losses": [], "seconds": []}
    for step in range(steps):
        batch = models.example_batch("gpt", batch_size, seed=step, **config)
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with comm.record() as compute:
            loss = forward_backward(model, my_batch(batch, pg), pg, micro_batches, schedule)
        with comm.record() as sync:
            average_gradients(model, pg.group("dp"))
        if step == 0 and keep_gradients:
            out["gradients"] = models.gradients(model)
        opt.step()
        out["seconds"].append(slowest(time.perf_counter() - start))
        out["losses"].append(_full_batch_loss(loss, pg))
    p2p = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}
    by_axis = {"tp": [c for c in compute if c.op not in p2p], "pp": [c for c in compute if c.op in p2p],
               "dp": list(sync)}
    out["sent"] = {axis: sum(c.sent for c in calls) for axis, calls in by_axis.items()}
    out["calls"] = {axis: dict(comm.CommLog(calls).counts()) for axis, calls in by_axis.items()}
    out["bytes"] = memory.model_state_bytes(model, opt)
    if keep_gradients:
        full = models.reference_gradients(reference, models.example_batch("gpt", batch_size, seed=0, **config))
        sliced = shard_like(model, full) if pg.size("tp") > 1 else full
        out["expected"] = {name: sliced[name] for name, _ in model.named_parameters()}
    return out


def reference_losses(steps: int = 3, lr: float = 0.1, batch_size: int = 8, optimizer: str = "sgd",
                     seed: int = 0, config: dict | None = None) -> list[float]:
    """The single-process loss curve every layout must follow: full batches, same data, same optimizer."""
    config = dict(config or {})
    model = models.build("gpt", seed=seed, **config)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = models.loss_fn(model, models.example_batch("gpt", batch_size, seed=step, **config))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
