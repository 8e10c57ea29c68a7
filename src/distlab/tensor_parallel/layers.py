"""The layers of tensor parallelism: each holds its rank's slice of a weight, and knows how it was cut.

A linear layer ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` splits in two ways:
by the output features (:class:`ColumnParallelLinear`: no communication forward) or by the
input features (:class:`RowParallelLinear`: a partial sum, added up across the ranks). The
embedding and the output layer split along the vocabulary (:class:`VocabParallelEmbedding`,
:func:`vocab_parallel_cross_entropy`). Every layer has a ``shard(name, full)`` method: the rule
that cut its weights is the rule that cuts a reference gradient for comparison
(:func:`shard_like`, :func:`load_full_weights`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.tensor_parallel.regions import (
    SEQUENCE_DIM,
    all_gather,
    copy_to_parallel_region,
    divide,
    gather_from_parallel_region,
    gather_from_sequence_region,
    reduce_from_parallel_region,
    reduce_scatter,
    reduce_scatter_to_sequence_region,
    scatter_to_parallel_region,
)
from distlab.tools.groups import world


class _GatherThenLinear(torch.autograd.Function):
    """Sequence parallel, Megatron's way: all-gather then ``F.linear``, saving only my shard.

    A plain ``gather_from_sequence_region`` followed by ``F.linear`` makes autograd save the
    *gathered* input for the weight gradient: a full ``(batch, seq, in)`` tensor on every
    rank, the very replication sequence parallelism set out to remove. Here forward saves
    only this rank's sequence shard, and backward gathers it again when the weight gradient
    needs it: one more all-gather, for ``1/N`` of the memory (Korthikanti et al., 2023).
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, dim, group):
        ctx.save_for_backward(x_shard, weight)
        ctx.dim, ctx.group, ctx.has_bias = dim, group, bias is not None
        return F.linear(all_gather(x_shard, dim, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_shard, weight = ctx.saved_tensors
        x = all_gather(x_shard, ctx.dim, ctx.group)                       # again: not kept from forward
        grad_x = reduce_scatter(grad @ weight, ctx.dim, ctx.group)      # as gather_from_sequence_region
        grad_weight = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None


# -- slicing: one rule per layer, used to build it and to compare with the reference ---------------

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
