"""Pricing a layout: memory, communication and time of ``(dp, pp, tp)`` before running anything.

Given a model, a cluster and a batch, this module prices every layout ``dp * pp * tp = N``
(and, for long sequences, ``dp * cp * pp * tp = N`` with context parallelism: :mod:`.context`)
on paper (:func:`estimate`), with the formulas of the papers that introduced each idea;
:mod:`.recommend` walks the usual decision procedure over them. Pure Python: no torch, so it
runs in any notebook cell and in a widget.

The formulas, per GPU and per training step (``P`` parameters, ``L`` layers of width ``h``
with ``a`` heads, sequences of ``s`` tokens, micro-batches of ``b`` sequences, ``m``
micro-batches per step per pipeline, vocabulary ``V``):

* **Model states** (Rajbhandari et al., 2020, "ZeRO", §3 and §5; :mod:`distlab.zero.theory`):
  ``P_rank * (parameters + gradients + optimizer bytes)``, 4 + 4 + 8 in fp32 and 2 + 2 + 12
  in mixed precision with Adam, each kind divided by ``dp`` once the ZeRO stage shards it.
  ``P_rank`` is what TP and PP leave on a rank: a GPT block holds ``(4 + 2r) h^2`` weights
  that TP splits and ``6 h`` (LayerNorms, two biases) it replicates (Shoeybi et al., 2019,
  "Megatron-LM", §3); PP gives each stage ``L / pp`` blocks, the embedding to the first
  stage and the output layer to the last (:meth:`Model.params_on_rank`).
* **Activations** (Korthikanti et al., 2023, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2), bytes per layer per micro-batch in 16-bit:
  ``s b h (34 + 5 a s / h)`` without TP; ``s b h (10 + 24/t + 5 a s / (h t))`` with TP;
  ``s b h / t (34 + 5 a s / h)`` with TP and sequence parallelism; ``34 s b h / t`` with
  selective recomputation (and SP; ``s b h (10 + 24/t)`` without); ``2 s b h`` with full
  recomputation (the layer's input only; ``/ t`` with SP, where that input is a sequence
  shard, our addition to the table). A
  1F1B pipeline stage ``i`` holds ``min(m, pp - i)`` micro-batches in flight (Narayanan et al.,
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  §2.2), so the first stage holds ``L`` layers' worth whatever ``pp``. The embedding and the
  output layer add a few percent, left out; fp32 is counted as twice the 16-bit figure (rough).
* **TP communication**: per layer and micro-batch, two all-reduces of the ``(s, b, h)``
  activations forward and two backward (Megatron-LM §3; two more with full recomputation,
  whose forward runs again); an all-reduce of ``S`` bytes sends ``2 (t-1)/t S`` per rank. Sequence
  parallelism swaps each all-reduce for an all-gather and a reduce-scatter: the same bytes.
* **PP communication**: per micro-batch, a stage sends its output activation ``s b h`` to
  the next stage and its input gradient to the previous one (Narayanan et al., 2021, §2.2).
* **DP communication** (ZeRO paper §7): stages 0-2 send ``2 (d-1)/d`` times the stage's
  gradients (an all-reduce, or a reduce-scatter of the gradients plus an all-gather of the
  parameters); stage 3 ``3 (d-1)/d`` (two all-gathers, one reduce-scatter).
* **Time**: communication ``bytes / bandwidth`` of the link the axis uses: intra-node if
  every group of that axis sits inside one node (:func:`link`), else inter-node, per GPU.
  Compute ``6 P T / N`` FLOPs for ``T`` tokens per step (Kaplan et al., 2020, "Scaling
  Laws", §2.1; ``8 P T`` with full recomputation), at ``peak * mfu`` FLOP/s. The pipeline's
  idle share is the bubble ``(p-1) / (m+p-1)`` (Huang et al., 2019, "GPipe"; Narayanan et
  al., 2021, §2.2), so compute takes ``(m+p-1)/m`` times longer. TP and PP communication is
  on the critical path; DP's overlaps with backward (2/3 of the compute; all of it for ZeRO-3,
  which prefetches), and only its excess counts (:func:`estimate`).

These are the estimates of the Ultra-Scale Playbook (Tazi et al., Hugging Face, 2025), whose
"finding the best training configuration" section is the procedure of :mod:`.recommend`.
They ignore overlap inside TP, kernel efficiency that changes with the matrix sizes, and
network contention; they rank layouts well and predict time within tens of percent.

For the book's small runs, :mod:`.predict` gives the *exact* bytes that :mod:`.train` counts
on each rank, so predictions can be drawn next to measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab.parallel3d import context
from distlab.parallel3d.mesh import AXES, Grid
from distlab.tools.comm_bytes import all_reduce_bytes
from distlab.zero.theory import ACTIVATION_BYTES, PRECISIONS, STAGE_NAMES, model_state_theory

GiB = 2**30

RECOMPUTE = ("none", "selective", "full")


# -- what is trained, on what ---------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """A GPT-style decoder: ``layers`` blocks of attention and an MLP of width ``mlp_ratio * hidden``.

    Models with grouped-query attention and gated (SwiGLU) MLPs, such as Llama, fit this shape
    with the ``mlp_ratio`` that gives their parameter count: a block holds ``(4 + 2 * mlp_ratio)
    * hidden**2`` weights here, and ``(2 + 2 * kv_heads / heads + 3 * ffn / hidden) * hidden**2``
    there (Llama 3 8B: 13, so ``mlp_ratio = 4.5``; 70B: 12.75, so ``4.375``).

    ``seq`` is the training sequence length (and the length of a learned position table).
    ``kv_heads``: key/value heads (grouped-query attention; ``None``: as many as ``heads``), used
    only for the bytes of context parallelism (:mod:`.context`).
    ``tied``: the output layer reuses the token embedding. ``biases``: linear layers have biases.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    mlp_ratio: float = 4
    tied: bool = False
    biases: bool = True
    learned_positions: bool = True
    kv_heads: int | None = None

    @classmethod
    def from_config(cls, cfg, seq: int | None = None) -> "Model":
        """From a :class:`distlab.models.GPTConfig` (TinyGPT: untied head with a bias, learned positions)."""
        return cls(layers=cfg.layers, hidden=cfg.dim, heads=cfg.heads, vocab=cfg.vocab_size,
                   seq=seq or cfg.context, mlp_ratio=cfg.mlp_ratio)

    # Parameters of each piece, split into what tensor parallelism shards and what it replicates.
    def block(self) -> tuple[int, int]:
        """``(sharded, replicated)`` parameters of one block: qkv, fc1 split by rows; proj, fc2 by columns."""
        h, r, b = self.hidden, self.mlp_ratio, int(self.biases)
        sharded = round((4 + 2 * r) * h * h + (3 + r) * h * b)  # weights + qkv and fc1 biases
        replicated = 4 * h + 2 * h * b                         # two LayerNorms + proj and fc2 biases
        return sharded, replicated

    def embedding(self) -> tuple[int, int]:
        """Token embedding (vocab-parallel) and position embedding (replicated)."""
        return self.vocab * self.hidden, self.seq * self.hidden * int(self.learned_positions)

    def output(self, pp: int = 1) -> tuple[int, int]:
        """Final LayerNorm (replicated) and output layer (vocab-parallel). Tied: free unless it sits on another stage."""
        if self.tied:
            head = self.vocab * self.hidden if pp > 1 else 0   # Megatron keeps a copy on the last stage
        else:
            head = self.vocab * self.hidden + self.vocab * int(self.biases)
        return head, 2 * self.hidden

    @property
    def params(self) -> int:
        """All parameters (once)."""
        per_block = sum(self.block())
        return self.layers * per_block + sum(self.embedding()) + sum(self.output())

    @property
    def tensors(self) -> int:
        """Number of parameter tensors (Adam keeps a step counter per tensor)."""
        return self.tensors_on_rank()

    def tensors_on_rank(self, pp: int = 1, stage: int = 0) -> int:
        """Parameter tensors of pipeline ``stage``: its blocks', plus the embeddings' or the final norm's and head's."""
        b = int(self.biases)
        count = (8 + 4 * b) * self.layers // pp                # per block: 2 norms x 2, 4 weights, 4 biases
        if stage == 0:
            count += 1 + int(self.learned_positions)
        if stage == pp - 1:
            head = 1 if self.tied and pp > 1 else 0 if self.tied else 1 + b
            count += 2 + head
        return count

    def params_on_rank(self, tp: int = 1, pp: int = 1, stage: int = 0) -> int:
        """Parameters held by a rank of pipeline ``stage`` with ``tp``-way tensor parallelism."""
        _check_divides(tp, self.heads, "tp", "the number of heads")
        _check_divides(pp, self.layers, "pp", "the number of layers")
        sharded, replicated = self.block()
        sharded, replicated = sharded * self.layers // pp, replicated * self.layers // pp
        if stage == 0:
            tok, pos = self.embedding()
            sharded, replicated = sharded + tok, replicated + pos
        if stage == pp - 1:
            head, norm = self.output(pp)
            sharded, replicated = sharded + head, replicated + norm
        return sharded // tp + replicated


@dataclass(frozen=True)
class Cluster:
    """GPUs and links. Bandwidths in bytes/s per GPU (one direction), ``flops`` peak per GPU."""

    gpus: int
    gpus_per_node: int = 8
    memory: float = 80 * GiB              # an H100's HBM (sold as "80GB"); ~76 GiB of it is left for tensors
    intra_bandwidth: float = 450e9        # NVLink 4 on H100 SXM, per direction (chapter 2's cost model)
    inter_bandwidth: float = 25e9         # one 200 Gb/s network port per GPU
    flops: float = 989e12                 # H100 dense bf16
    mfu: float = 0.4                      # share of peak FLOPs a good run reaches


@dataclass(frozen=True)
class Training:
    """The batch and how it is computed. ``global_batch`` and ``micro_batch`` count sequences."""

    global_batch: int
    micro_batch: int = 1
    precision: str = "mixed"
    recompute: str = "none"
    sequence_parallel: bool = False

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.global_batch < 1 or self.micro_batch < 1:
            raise ValueError("global_batch and micro_batch must be positive")


def _check_divides(parts: int, size: int, name: str, what: str) -> None:
    if size % parts:
        raise ValueError(f"{name}={parts} does not divide {what} ({size})")


def micro_batches(training: Training, dp: int) -> int:
    """Micro-batches each pipeline runs per step: ``global_batch / (dp * micro_batch)``."""
    per_replica, rest = divmod(training.global_batch, dp * training.micro_batch)
    if rest or not per_replica:
        raise ValueError(f"a global batch of {training.global_batch} does not split into dp={dp} replicas "
                         f"of micro-batches of {training.micro_batch}")
    return per_replica


# -- the formulas ---------------------------------------------------------------------------------

def activation_bytes_per_layer(model: Model, training: Training, tp: int = 1) -> float:
    """Korthikanti et al. (2023), Table 2: activations one layer keeps for one micro-batch."""
    s, b, h, a = model.seq, training.micro_batch, model.hidden, model.heads
    sbh, sp = s * b * h, training.sequence_parallel
    if training.recompute == "full":
        per = 2 * sbh / (tp if sp else 1)
    elif training.recompute == "selective":
        per = 34 * sbh / tp if sp else sbh * (10 + 24 / tp)
    elif sp:
        per = sbh / tp * (34 + 5 * a * s / h)
    else:
        per = sbh * (10 + 24 / tp + 5 * a * s / (h * tp)) if tp > 1 else sbh * (34 + 5 * a * s / h)
    return per * ACTIVATION_BYTES[training.precision] / 2


def bubble(pp: int, micro_batches: int) -> float:
    """Share of a pipelined step the stages sit idle: ``(p-1) / (m+p-1)`` (GPipe and 1F1B alike)."""
    return (pp - 1) / (micro_batches + pp - 1)


def link(grid: Grid, axis: str, gpus_per_node: int, cp: int = 1) -> str | None:
    """``"intra"`` if every group along ``axis`` sits inside one node, ``"inter"`` if not, ``None`` for size 1.

    A group spans ``stride * size`` consecutive ranks (see :meth:`distlab.parallel3d.mesh.Grid.stride`;
    with ``cp`` ranks of context parallelism, :func:`.context.span`); it stays in a node when that
    span divides the node size (or the job has one node). ``axis`` may be ``"cp"``.
    """
    if (cp if axis == "cp" else grid.size(axis)) == 1:
        return None
    span = context.span(grid, axis, cp)
    return "intra" if grid.world_size * cp <= gpus_per_node or gpus_per_node % span == 0 else "inter"


# -- one layout -----------------------------------------------------------------------------------

@dataclass
class Estimate:
    """Everything :func:`estimate` predicts for one layout, per GPU, for the busiest pipeline stage."""

    grid: Grid
    zero: int
    micro_batches: int
    cp: int = 1                                       # context-parallel ranks (next to tp)
    memory: dict = field(default_factory=dict)        # parameters, gradients, optimizer, activations, total
    fits: bool = False
    comm_bytes: dict = field(default_factory=dict)    # bytes a GPU sends per step, by axis
    comm_seconds: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)         # axis -> "intra" / "inter" / None
    bubble: float = 0.0
    ideal_seconds: float = 0.0                        # the step's compute alone, no bubble, no waiting
    compute_seconds: float = 0.0                      # with the bubble
    step_seconds: float = 0.0

    @property
    def exposed_comm(self) -> float:
        """Share of the step spent waiting for communication."""
        return 1 - self.compute_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def efficiency(self) -> float:
        """Share of the step spent on useful compute: neither in the bubble nor waiting for communication."""
        return self.ideal_seconds / self.step_seconds if self.step_seconds else 1.0

    def describe(self) -> str:
        g = self.grid
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        return (f"dp={g.dp} pp={g.pp} tp={g.tp}{cp} {STAGE_NAMES[self.zero]}: "
                f"{self.memory['total'] / GiB:.1f} GiB/GPU ({'fits' if self.fits else 'does not fit'}), "
                f"step {self.step_seconds:.3g} s, {self.efficiency:.0%} of it useful compute "
                f"(bubble {self.bubble:.0%}, communication exposed {self.exposed_comm:.0%})")


def estimate(model: Model, cluster: Cluster, training: Training, grid: Grid, zero: int = 0, cp: int = 1) -> Estimate:
    """Memory, communication and time per GPU for ``grid`` with ZeRO stage ``zero`` over dp.

    ``cp > 1`` adds context parallelism: ``grid``'s ``dp * pp * tp`` ranks times ``cp`` make the
    cluster, each rank holds ``s / cp`` tokens of every sequence, and ZeRO shards over ``dp * cp``
    (:mod:`.context`). Raises ``ValueError`` when the layout cannot run: sizes that do not multiply
    to the GPUs, tp not dividing the heads, pp not dividing the layers, cp not dividing the
    sequence, a batch that does not split.
    """
    if cp == 1:
        grid.check(cluster.gpus)
    elif grid.world_size * cp != cluster.gpus:
        raise ValueError(f"dp * pp * tp * cp = {grid.world_size} * {cp} ranks, but there are {cluster.gpus} GPUs; "
                         "the sizes must multiply to the world size")
    dp, pp, tp = grid.dp, grid.pp, grid.tp
    m = micro_batches(training, dp)
    precision = training.precision
    act = ACTIVATION_BYTES[precision]
    _check_divides(cp, model.seq, "cp", "the sequence length")
    sbh = model.seq // cp * training.micro_batch * model.hidden        # a rank's share of the tokens
    _check_divides(pp, model.layers, "pp", "the number of layers")
    _check_divides(tp, model.heads, "tp", "the number of heads")
    layers_here = model.layers // pp

    stages = []                                     # (memory, dp bytes, pp bytes) per pipeline stage
    for stage in range(pp):
        params = model.params_on_rank(tp, pp, stage)
        memory = model_state_theory(params, dp * cp, zero, precision)
        in_flight = min(m, pp - stage)
        memory["activations"] = layers_here * in_flight * activation_bytes_per_layer(model, training, tp) / cp
        memory["total"] += memory["activations"]
        grad_bytes = params * PRECISIONS[precision]["gradients"]
        dp_bytes = (3 if zero == 3 else 2) * (dp * cp - 1) / (dp * cp) * grad_bytes
        pp_bytes = m * sbh * act * ((stage < pp - 1) + (stage > 0))
        stages.append((memory, dp_bytes, pp_bytes))
    memory = max((s[0] for s in stages), key=lambda mem: mem["total"])
    all_reduces = 6 if training.recompute == "full" else 4
    head_dim, kv_heads = model.hidden // model.heads, context.kv_heads_on_rank(model.kv_heads or model.heads, tp)
    ring = context.cp_bytes_per_layer(model.seq, training.micro_batch, kv_heads, head_dim, act, cp, training.recompute)
    comm = {"tp": layers_here * m * all_reduces * all_reduce_bytes(sbh * act, tp),
            "pp": max(s[2] for s in stages), "dp": max(s[1] for s in stages), "cp": layers_here * m * ring}
    links = {axis: link(grid, axis, cluster.gpus_per_node, cp) for axis in (*AXES, "cp")}
    bandwidth = {"intra": cluster.intra_bandwidth, "inter": cluster.inter_bandwidth, None: math.inf}
    seconds = {axis: comm[axis] / bandwidth[links[axis]] for axis in comm}

    tokens = training.global_batch * model.seq
    flops = (8 if training.recompute == "full" else 6) * model.params * tokens / cluster.gpus
    ideal = flops / (cluster.flops * cluster.mfu)
    idle = bubble(pp, m)
    compute = ideal / (1 - idle)
    hidden_behind = ideal if zero == 3 else ideal * 2 / 3          # what DP's traffic can overlap with
    attention = layers_here * m * context.attention_flops(model.seq, training.micro_batch, model.heads // tp,
                                                          head_dim, cp) / (cluster.flops * cluster.mfu)
    ring_exposed = max(0.0, seconds["cp"] - attention) if cp > 1 else 0.0   # the ring hides behind attention
    step = compute + seconds["tp"] + seconds["pp"] + ring_exposed + max(0.0, seconds["dp"] - hidden_behind)
    return Estimate(grid=grid, zero=zero, micro_batches=m, cp=cp, memory=memory,
                    fits=memory["total"] <= cluster.memory, comm_bytes=comm, comm_seconds=seconds, links=links,
                    bubble=idle, ideal_seconds=ideal, compute_seconds=compute, step_seconds=step)
