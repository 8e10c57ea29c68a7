"""The exact bytes of the book's small 3D runs, predicted before running them.

:func:`predict_run` says what :func:`distlab.parallel3d.train.train` (and
:func:`distlab.parallel3d.torch_train.train_torch`) will count on each rank: parameters,
gradients and optimizer state held, and bytes sent per step on each axis. Exact, because the
runs are small and fp32, and everything is counted by the same rules (:mod:`distlab.tools.comm_bytes`).
"""

from __future__ import annotations

from distlab.parallel3d.mesh import Grid
from distlab.parallel3d.planner import Model
from distlab.tools.comm_bytes import all_reduce_bytes

OPTIMIZER_BYTES = {"sgd": 0, "adamw": 8}
"""Optimizer state per parameter in fp32: plain SGD keeps none, AdamW two moments (plus a
4-byte step counter per parameter tensor)."""


def predict_run(model: Model, grid: Grid, batch_size: int, optimizer: str = "sgd", engine: str = "distlab",
                stage: int = 0, micro_batches: int = 2) -> dict:
    """The bytes :func:`distlab.parallel3d.train` counts on a rank of pipeline ``stage``: exact, fp32.

    ``batch_size`` is the global batch (sequences of ``model.seq`` tokens), cut into
    ``micro_batches`` per pipeline when ``pp > 1``; ``engine="torch"`` predicts
    :func:`distlab.parallel3d.torch_train.train_torch` (FSDP2 = ZeRO-3 over dp, no pipeline). Returns
    ``{"bytes": {parameters, gradients, optimizer, total}, "sent": {"tp", "pp", "dp"}}``.

    * distlab: parameters and gradients ``4 P_rank``. Sent over tp, per micro-batch of
      ``(b, s, h)`` activations: four all-reduces per block; one more forward for the
      vocab-parallel embedding (first stage) and one backward for the output layer (last
      stage); then, on the last stage, the vocab-parallel cross-entropy's three all-reduces
      of ``(b, s)``. Over pp, one ``(b, s, h)`` activation per micro-batch to the next stage and
      one gradient to the previous. Over dp, one all-reduce of ``4 P_rank``. Every
      collective's bytes are rounded down, as :mod:`distlab.tools.comm` does.
    * torch: every model state divided by dp (FSDP2 shards parameters along their first
      dimension; exact when dp divides each of them), and FSDP2 sends ZeRO-3's two
      all-gathers and one reduce-scatter except the second all-gather of the root module
      (embeddings, final norm, output layer), which it keeps from forward to backward. DTensor's
      TP collectives are not visible to :mod:`distlab.tools.comm`: ``sent["tp"]`` is ``None``. With
      TP, q, k and v are three layers there: two more tensors (AdamW step counters) per fused one.
    """
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_BYTES)}, got {optimizer!r}")
    if engine not in ("distlab", "torch"):
        raise ValueError(f"engine must be 'distlab' or 'torch', got {engine!r}")
    if engine == "torch" and grid.pp > 1:
        raise NotImplementedError("torch's engine runs no pipeline (see distlab.parallel3d)")
    dp, pp, tp = grid.dp, grid.pp, grid.tp
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside 0..{pp - 1}")
    if batch_size % dp:
        raise ValueError(f"a batch of {batch_size} does not split over dp={dp}")
    m = micro_batches if pp > 1 else 1
    if (batch_size // dp) % m:
        raise ValueError(f"a dp shard of {batch_size // dp} does not split into {m} micro-batches")
    b, s, h = batch_size // dp // m, model.seq, model.hidden
    first, last = stage == 0, stage == pp - 1
    params = model.params_on_rank(tp, pp, stage)
    tensors = model.tensors_on_rank(pp, stage)
    if engine == "torch" and tp > 1:           # distlab.tensor_parallel.dtensor splits qkv into q, k and v layers
        tensors += 2 * (1 + int(model.biases)) * model.layers
    shard = dp if engine == "torch" else 1
    held = {"parameters": 4 * params // shard, "gradients": 4 * params // shard,
            "optimizer": OPTIMIZER_BYTES[optimizer] * params // shard + (4 * tensors if optimizer == "adamw" else 0)}
    held["total"] = sum(held.values())

    activation = 4 * b * s * h
    sent = {"tp": 0, "pp": 0, "dp": 0}
    if tp > 1:
        per_micro = (4 * model.layers // pp + first + last) * all_reduce_bytes(activation, tp)
        if last:
            per_micro += 3 * all_reduce_bytes(4 * b * s, tp)        # the vocab-parallel cross-entropy
        sent["tp"] = m * per_micro
    if pp > 1:
        sent["pp"] = m * activation * ((not last) + (not first))
    if dp > 1:
        sent["dp"] = all_reduce_bytes(4 * params, dp)
    if engine == "torch":
        tok, pos = model.embedding()
        head, norm = model.output()
        root = (tok + head) // tp + pos + norm
        sent = {"tp": None, "pp": 0, "dp": (dp - 1) * 4 * (3 * params - root) // dp if dp > 1 else 0}
    return {"bytes": held, "sent": sent}
