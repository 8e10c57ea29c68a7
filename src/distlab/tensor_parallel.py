"""Tensor parallelism from scratch: split every big matrix of the model across ``N`` ranks.

Data parallelism (chapters 3-4) gives every rank a different slice of the *batch*. Tensor
parallelism gives every rank a different slice of each *weight matrix*, and every rank sees
the whole batch. It is what makes a layer that does not fit on one GPU possible, and it is
the "TP" of 3D parallelism (Shoeybi et al., 2019, "Megatron-LM").

A linear layer ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` splits in two ways:

* **by columns of the output** (:class:`ColumnParallelLinear`): rank ``r`` holds the rows
  ``W[r*out/N : (r+1)*out/N]`` and computes its slice of ``y``'s features. No communication
  forward: every rank already has all of ``x``.
* **by rows of the input** (:class:`RowParallelLinear`): rank ``r`` holds the columns
  ``W[:, r*in/N : (r+1)*in/N]``, takes its slice of ``x``'s features and computes a *partial
  sum* of ``y``. An all-reduce adds the partial sums.

Megatron's trick (:class:`ParallelMLP`): put a column-parallel layer first and a
row-parallel layer second. The first one's output is exactly the sharded input the second
one wants, and an elementwise activation in between works on shards. A whole MLP then costs
**one all-reduce forward and one all-reduce backward**. Attention works the same way with
heads as the unit (:class:`ParallelAttention`), and so do the embedding and the output layer
with the vocabulary as the unit (:class:`VocabParallelEmbedding`,
:func:`vocab_parallel_cross_entropy`): the full ``(batch, seq, vocab)`` logits never exist
on any rank.

All the communication goes through six tiny ``torch.autograd.Function`` s, in conjugate
pairs: what one does forward, its partner does backward.

=========================================  =============================  =============================
function                                   forward                        backward
=========================================  =============================  =============================
:func:`copy_to_parallel_region`            identity                       all-reduce
:func:`reduce_from_parallel_region`        all-reduce                     identity
:func:`scatter_to_parallel_region`         keep my slice of last dim      all-gather along last dim
:func:`gather_from_parallel_region`        all-gather along last dim      keep my slice of last dim
:func:`gather_from_sequence_region`        all-gather along sequence      reduce-scatter along sequence
:func:`reduce_scatter_to_sequence_region`  reduce-scatter along sequence  all-gather along sequence
=========================================  =============================  =============================

The last pair is **sequence parallelism** (Korthikanti et al., 2022): between two
tensor-parallel regions (LayerNorm, residual adds, dropout), activations are replicated on
every rank: wasted memory. Instead, keep them split along the *sequence*, and replace each
all-reduce by a reduce-scatter (into sequence shards) and each identity-before-a-column-layer
by an all-gather. A ring all-reduce *is* a reduce-scatter followed by an all-gather
(chapter 2), so the bytes on the wire are the same; the activations between regions take
``1/N`` of the memory. The price: parameters used inside a sequence-sharded region (the
LayerNorms, the position embedding, the row-parallel biases) now see only their rank's part
of the sequence, so their gradients must be summed over the ranks
(:func:`all_reduce_sequence_parallel_gradients`). And the column-parallel layers must not
keep the gathered input for backward, or it is replicated again
(:func:`save_only_sequence_shards`).

:func:`parallelize_gpt` turns a :class:`distlab.models.TinyGPT` into its tensor-parallel twin
by slicing the reference weights, with the same parameter names; :func:`shard_like` slices
any full tensor (a reference gradient, say) the way a rank's parameter was sliced, so the
two can be compared shard by shard.

Every rank must hold the *same full batch* (tensor parallelism does not split the data) and
run the same code: the collectives happen in the same order everywhere. Sizes must divide
evenly by ``N`` (out features of a column layer, in features of a row layer, heads,
vocabulary, sequence length); anything else raises a ``ValueError`` naming the sizes, as
Megatron does. Kept out, to stay readable: dropout (TinyGPT has none; under sequence
parallelism each rank would need its own random stream), overlap of communication with
compute, and mixed precision.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab import models


# -- who am I ----------------------------------------------------------------------------------

def world(group=None) -> tuple[int, int]:
    """``(number of ranks, my rank)`` in the tensor-parallel ``group`` (default: all ranks)."""
    return dist.get_world_size(group), dist.get_rank(group)


def divide(size: int, parts: int, what: str) -> int:
    """``size // parts``, or a ``ValueError`` naming both when ``parts`` does not divide ``size``."""
    if size % parts:
        raise ValueError(f"{what} ({size}) does not split evenly over {parts} tensor-parallel ranks; "
                         f"pick a size that is a multiple of {parts}")
    return size // parts


# -- the collectives, without autograd ----------------------------------------------------------

def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of ``x`` over the ranks (on a copy: autograd may still need ``x``)."""
    x = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """My rank's equal slice of ``x`` along ``dim``. No communication."""
    n, rank = world(group)
    divide(x.shape[dim], n, f"dimension {dim} of a tensor of shape {tuple(x.shape)}")
    return x.chunk(n, dim=dim)[rank].contiguous()


def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's ``x``, concatenated along ``dim`` in rank order."""
    n, _ = world(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum of ``x`` over the ranks, of which I receive only my slice along ``dim``."""
    n, _ = world(group)
    divide(x.shape[dim], n, f"dimension {dim} of a tensor of shape {tuple(x.shape)}")
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM, group=group)
    return mine


# -- the conjugate pairs, as autograd functions ---------------------------------------------------
# Each one is a single line forward and a single line backward. The rule that finds the
# backward: if forward hands the same value to every rank (identity on a replicated input),
# each rank's gradient is only a part of the true one, so backward must sum them (all-reduce);
# if forward sums, backward hands the same gradient to every part (identity).

class _CopyToParallelRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward; all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToParallelRegion(torch.autograd.Function):
    """Keep my slice of the last dimension forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class _GatherFromParallelRegion(torch.autograd.Function):
    """All-gather along the last dimension forward; keep my slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Sequence parallel: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Sequence parallel: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class _GatherThenLinear(torch.autograd.Function):
    """Sequence parallel, Megatron's way: all-gather then ``F.linear``, saving only my shard.

    A plain ``gather_from_sequence_region`` followed by ``F.linear`` makes autograd save the
    *gathered* input for the weight gradient: a full ``(batch, seq, in)`` tensor on every
    rank, the very replication sequence parallelism set out to remove. Here forward saves
    only this rank's sequence shard, and backward gathers it again when the weight gradient
    needs it: one more all-gather, for ``1/N`` of the memory (Korthikanti et al., 2022).
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, dim, group):
        ctx.save_for_backward(x_shard, weight)
        ctx.dim, ctx.group, ctx.has_bias = dim, group, bias is not None
        return F.linear(_all_gather(x_shard, dim, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_shard, weight = ctx.saved_tensors
        x = _all_gather(x_shard, ctx.dim, ctx.group)                       # again: not kept from forward
        grad_x = _reduce_scatter(grad @ weight, ctx.dim, ctx.group)      # as gather_from_sequence_region
        grad_weight = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None


SEQUENCE_DIM = 1   # activations are (batch, seq, features), as in distlab.models


def copy_to_parallel_region(x, group=None):
    """Enter a tensor-parallel region with a replicated ``x``: identity forward, all-reduce backward."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x, group=None):
    """Leave a tensor-parallel region by summing partial results: all-reduce forward, identity backward."""
    return _ReduceFromParallelRegion.apply(x, group)


def scatter_to_parallel_region(x, group=None):
    """Keep my slice of the last dimension: no communication forward, all-gather backward."""
    return _ScatterToParallelRegion.apply(x, group)


def gather_from_parallel_region(x, group=None):
    """Concatenate every rank's slice of the last dimension: all-gather forward, slice backward."""
    return _GatherFromParallelRegion.apply(x, group)


def gather_from_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Sequence shards to the full sequence: all-gather forward, reduce-scatter backward."""
    return _GatherFromSequenceRegion.apply(x, dim, group)


def reduce_scatter_to_sequence_region(x, group=None, dim: int = SEQUENCE_DIM):
    """Partial sums to summed sequence shards: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterToSequenceRegion.apply(x, dim, group)


# -- slicing: one rule per layer, used to build it and to compare with the reference ---------------

def _mark_sequence_parallel(module: nn.Module) -> None:
    """Mark ``module``'s parameters as replicated but fed with sequence shards (see the module doc)."""
    for p in module.parameters():
        p.sequence_parallel = True


def shard_like(tp_model: nn.Module, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's slice of every full tensor, cut the way ``tp_model``'s parameter of that name is.

    ``full`` maps the single-process model's parameter names to tensors of the full shape
    (its weights, or its gradients). Parallel layers know how they are sliced
    (their ``shard(name, tensor)`` method); every other parameter is replicated, so its
    "slice" is the whole tensor.
    """
    out = {}
    for module_name, module in tp_model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            key = f"{module_name}.{name}" if module_name else name
            shard = getattr(module, "shard", None)
            out[key] = shard(name, full[key]) if shard else full[key]
    return out


@torch.no_grad()
def load_full_weights(tp_model: nn.Module, reference: nn.Module) -> nn.Module:
    """Copy into every parameter of ``tp_model`` its slice of ``reference``'s weight of the same name."""
    shards = shard_like(tp_model, dict(reference.named_parameters()))
    for name, p in tp_model.named_parameters():
        if p.shape != shards[name].shape:
            raise ValueError(f"{name}: this rank's parameter has shape {tuple(p.shape)}, "
                             f"its slice of the reference has shape {tuple(shards[name].shape)}")
        p.copy_(shards[name])
    return tp_model


def _linear_init(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    """``nn.Linear``'s initialisation, with the fan-in of the *full* layer, not of the shard."""
    bound = 1 / math.sqrt(fan_in)
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias.uniform_(-bound, bound)


# -- the layers -------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W``'s rows (the output features) split over the ranks.

    Rank ``r`` holds ``W[r*out/N : (r+1)*out/N]`` and the matching slice of ``b``: shape
    ``(out/N, in)``. It receives the full ``x`` and returns its slice of ``y``'s features
    (``gather_output=True`` all-gathers the full ``y`` instead). The input goes through
    :func:`copy_to_parallel_region`: forward nothing happens, backward each rank only knows
    the part of ``dL/dx`` that flows through its output features, so the parts are summed.

    ``parts`` is for fused layers: ``qkv`` stacks three ``(dim, dim)`` matrices in one
    ``(3*dim, dim)`` weight, and each rank must get its slice of *each* (its heads' q, k and
    v), not the first third of the stack (that would be all of q for rank 0 of 3).

    With ``sequence_parallel=True`` the input arrives split along the sequence and is
    all-gathered first (:func:`gather_from_sequence_region`), which backward becomes a
    reduce-scatter: it does the job of the all-reduce above. ``save_sharded_input = True``
    (:func:`save_only_sequence_shards`) keeps only the shard for backward and gathers again
    there (:class:`_GatherThenLinear`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = False,
                 parts: int = 1, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.parts = parts
        self.save_sharded_input = False        # see save_only_sequence_shards
        n, _ = world(group)
        per_part = divide(out_features, parts, "out_features of a fused layer")
        local = parts * divide(per_part, n, "out_features of a column-parallel linear layer"
                               + (" (per fused part)" if parts > 1 else ""))
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.empty(local)) if bias else None
        _linear_init(self.weight, self.bias, fan_in=in_features)

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """My rows of the full weight or bias (my slice of each fused part)."""
        n, rank = world(self.group)
        per_part = full.unflatten(0, (self.parts, -1))       # (parts, out/parts, ...)
        return per_part.chunk(n, dim=1)[rank].flatten(0, 1).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel and self.save_sharded_input:
            y = _GatherThenLinear.apply(x, self.weight, self.bias, SEQUENCE_DIM, self.group)
        else:
            if self.sequence_parallel:
                x = gather_from_sequence_region(x, self.group)
            else:
                x = copy_to_parallel_region(x, self.group)
            y = F.linear(x, self.weight, self.bias)
        return gather_from_parallel_region(y, self.group) if self.gather_output else y

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "ColumnParallelLinear":
        """This rank's column-parallel slice of a full ``nn.Linear`` (same weights on every rank)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, **kwargs)
        return load_full_weights(layer, linear)


class RowParallelLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W``'s columns (the input features) split over the ranks.

    Rank ``r`` holds ``W[:, r*in/N : (r+1)*in/N]`` (shape ``(out, in/N)``) and the full bias.
    It receives its slice of ``x``'s features (``input_is_parallel=False``: the full ``x``,
    of which it keeps its slice) and computes a partial sum of ``y``; the partial sums are
    added with :func:`reduce_from_parallel_region` (all-reduce forward, nothing backward:
    ``dL/dy`` is already the same on every rank). The bias is added *after* the sum, once.

    With ``sequence_parallel=True`` the sum is a reduce-scatter along the sequence
    instead: each rank gets the summed output for its part of the sequence. The bias is
    then added to a sequence shard, so its gradient is partial and is marked for
    :func:`all_reduce_sequence_parallel_gradients`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = True,
                 group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        n, _ = world(group)
        local = divide(in_features, n, "in_features of a row-parallel linear layer")
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        _linear_init(self.weight, self.bias, fan_in=in_features)
        if sequence_parallel and self.bias is not None:
            self.bias.sequence_parallel = True

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """My columns of the full weight; the bias is not split."""
        if name == "bias":
            return full
        n, rank = world(self.group)
        return full.chunk(n, dim=1)[rank].contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_parallel_region(x, self.group)
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_region(partial, self.group)
        else:
            y = reduce_from_parallel_region(partial, self.group)
        return y + self.bias if self.bias is not None else y

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "RowParallelLinear":
        """This rank's row-parallel slice of a full ``nn.Linear`` (same weights on every rank)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, **kwargs)
        return load_full_weights(layer, linear)


class ParallelMLP(nn.Module):
    """Megatron's MLP: column-parallel ``fc1``, activation on shards, row-parallel ``fc2``.

    Forward: ``copy`` (nothing) -> ``fc1`` shard -> activation -> ``fc2`` partial sum ->
    **one all-reduce**. Backward: the all-reduce's partner does nothing, and ``copy``'s
    partner is **one all-reduce** of ``dL/dx``. Splitting ``fc1`` by rows instead would need
    an all-reduce *before* the activation (``gelu(a + b) != gelu(a) + gelu(b)``): the
    column-then-row order is what makes one collective each way enough.
    """

    def __init__(self, inputs: int, hidden: int, outputs: int, activation=F.gelu, group=None,
                 sequence_parallel: bool = False):
        super().__init__()
        self.activation = activation
        self.fc1 = ColumnParallelLinear(inputs, hidden, group=group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear(hidden, outputs, group=group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


def parallelize_mlp(mlp: models.TinyMLP, group=None, sequence_parallel: bool = False) -> ParallelMLP:
    """The tensor-parallel twin of a :class:`distlab.models.TinyMLP` (ReLU), sliced from its weights."""
    tp = ParallelMLP(mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features, activation=torch.relu,
                     group=group, sequence_parallel=sequence_parallel)
    return load_full_weights(tp, mlp)


class ParallelAttention(nn.Module):
    """Causal self-attention with the heads split over the ranks: ``heads / N`` heads each.

    Heads never talk to each other until the output projection, so each rank computes
    attention for its own heads with no communication: ``qkv`` is column-parallel (sliced per
    head, in each of q, k and v) and ``proj`` row-parallel. Like the MLP: one all-reduce
    forward, one backward. Same parameter names as :class:`distlab.models.CausalSelfAttention`.
    """

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        n, _ = world(group)
        self.local_heads = divide(cfg.heads, n, "the number of attention heads")
        self.head_dim = cfg.dim // cfg.heads
        self.qkv = ColumnParallelLinear(cfg.dim, 3 * cfg.dim, parts=3, group=group, sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear(cfg.dim, cfg.dim, group=group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)               # each (batch, seq, my heads * head_dim)
        batch, seq, _ = q.shape
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))


class VocabParallelEmbedding(nn.Module):
    """An embedding table with its rows (the vocabulary) split over the ranks.

    Rank ``r`` holds the vectors of tokens ``r*V/N .. (r+1)*V/N - 1``. Each rank looks up the
    tokens it owns, writes zeros for the others, and an all-reduce adds the ranks' results:
    exactly one rank contributed each vector. (Sequence parallel: a reduce-scatter along
    the sequence instead, which leaves each rank its part of the sequence.)
    """

    def __init__(self, vocab_size: int, dim: int, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        n, rank = world(group)
        per_rank = divide(vocab_size, n, "the vocabulary size")
        self.first, self.last = rank * per_rank, (rank + 1) * per_rank   # my tokens: first <= t < last
        self.weight = nn.Parameter(torch.randn(per_rank, dim))            # nn.Embedding's N(0, 1)

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return full[self.first:self.last].contiguous()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mine = (tokens >= self.first) & (tokens < self.last)
        local = torch.where(mine, tokens - self.first, 0)                # any valid row for the others
        vectors = F.embedding(local, self.weight) * mine.unsqueeze(-1)   # zeros where not mine
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_region(vectors, self.group)
        return reduce_from_parallel_region(vectors, self.group)


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, group=None) -> torch.Tensor:
    """Cross-entropy per token from logits split along the vocabulary; never gathers them.

    ``local_logits``: this rank's ``(..., V/N)`` slice (vocabulary ``r*V/N ..``), ``targets``:
    the full ``(...)`` token ids, the same on every rank. Returns the loss per token,
    ``log sum_v exp(z_v) - z_target``, the same on every rank, using three all-reduces of
    ``(...)``-shaped tensors, ``1/V`` of the logits' size:

    1. the max over the vocabulary (MAX), subtracted for numerical stability;
    2. the target's logit (SUM: only the rank that owns the target contributes it);
    3. the sum of ``exp`` (SUM).

    Steps 2 and 3 go through :func:`reduce_from_parallel_region`, so autograd gives each
    rank the gradient of its own slice, ``softmax - one_hot(target)``, with no communication
    backward. Step 1 needs no gradient: the result does not depend on the constant subtracted.
    """
    n, rank = world(group)
    vocab_local = local_logits.shape[-1]
    first = rank * vocab_local

    biggest = local_logits.detach().amax(dim=-1)
    dist.all_reduce(biggest, op=dist.ReduceOp.MAX, group=group)
    shifted = local_logits - biggest.unsqueeze(-1)

    mine = (targets >= first) & (targets < first + vocab_local)
    local_target = torch.where(mine, targets - first, 0)
    target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * mine
    target_logit = reduce_from_parallel_region(target_logit, group)

    sum_exp = reduce_from_parallel_region(shifted.exp().sum(dim=-1), group)
    return sum_exp.log() - target_logit


# -- the whole model -----------------------------------------------------------------------------

class ParallelBlock(nn.Module):
    """:class:`distlab.models.Block` with parallel attention and MLP (same names, same maths)."""

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        sp = dict(group=group, sequence_parallel=sequence_parallel)
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = ParallelAttention(cfg, **sp)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = ColumnParallelLinear(cfg.dim, cfg.mlp_ratio * cfg.dim, **sp)
        self.fc2 = RowParallelLinear(cfg.mlp_ratio * cfg.dim, cfg.dim, **sp)
        if sequence_parallel:
            _mark_sequence_parallel(self.norm1)
            _mark_sequence_parallel(self.norm2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ParallelGPT(nn.Module):
    """:class:`distlab.models.TinyGPT`, tensor-parallel: returns this rank's ``(batch, seq, V/N)`` logits.

    Vocab-parallel token embedding and output layer, head-parallel attention, Megatron MLPs;
    the position embedding and the LayerNorms are replicated. Per block: two all-reduces
    forward, two backward (or, sequence parallel, two all-gathers and two reduce-scatters each
    way). Use :func:`loss` for the loss: the logits are sharded.
    """

    def __init__(self, cfg: models.GPTConfig, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        sp = dict(group=group, sequence_parallel=sequence_parallel)
        self.tok = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, **sp)
        self.pos = nn.Embedding(cfg.context, cfg.dim)
        self.blocks = nn.ModuleList(ParallelBlock(cfg, **sp) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = ColumnParallelLinear(cfg.dim, cfg.vocab_size, **sp)   # vocab-parallel output layer
        if sequence_parallel:
            _mark_sequence_parallel(self.pos)
            _mark_sequence_parallel(self.norm)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        if self.sequence_parallel:              # the embedding hands me my part of the sequence
            divide(tokens.shape[1], world(self.group)[0], "the sequence length (sequence parallel)")
            positions = _split(positions, 0, self.group)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parallelize_gpt(reference: models.TinyGPT, group=None, sequence_parallel: bool = False) -> ParallelGPT:
    """The tensor-parallel twin of ``reference``, sliced from its weights (build it with the same seed on every rank)."""
    return load_full_weights(ParallelGPT(reference.cfg, group=group, sequence_parallel=sequence_parallel), reference)


def loss(model: ParallelGPT, batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch, the same value on every rank."""
    inputs, targets = batch
    return vocab_parallel_cross_entropy(model(inputs), targets, model.group).mean()


def all_reduce_sequence_parallel_gradients(model: nn.Module, group=None) -> None:
    """Sum over the ranks the gradients of parameters that saw only a part of the sequence.

    Call after ``backward()`` in a sequence-parallel model (Megatron does the same for its
    LayerNorms). Nothing to do without sequence parallelism: then every replicated parameter
    sees the whole sequence and gets the whole gradient on every rank.
    """
    for p in model.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)


def save_only_sequence_shards(model: nn.Module) -> nn.Module:
    """Make every sequence-parallel column layer of ``model`` save its input shard, not the gathered input.

    Trades one extra all-gather per column-parallel layer in backward for activations that
    are all split ``N`` ways (see :class:`_GatherThenLinear`). No effect without sequence
    parallelism. Returns ``model``.
    """
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear):
            module.save_sharded_input = True
    return model
