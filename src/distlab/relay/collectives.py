"""The collectives the router performs itself, and the bytes each one counts.

When a rank on the relay calls a collective (``all_reduce``, ``all_gather``, ...), it does not
talk to the other ranks: it hands its tensors to the router, which waits for every rank of the
group, computes the result in one place, and hands each rank its share. Each collective is
described by the tensors every rank contributes (its *parts*) and the tensors every rank gets
back, in one of these shapes (``N`` ranks in the group, ``op`` the reduction):

==============  =======================================  =============================================
op              what rank ``i`` contributes              what rank ``r`` gets back
==============  =======================================  =============================================
all_reduce      its tensors ``t_k``                      ``op_i(t_k of rank i)`` for every ``k``
broadcast       its tensor (only the root's is read)     the root's tensor
reduce          its tensor                               the root: ``op_i(t of i)``; the others: nothing
all_gather      its tensor                               every rank's tensor, in rank order
reduce_scatter  ``N`` tensors                            ``op_i(tensor r of rank i)``
all_to_all      ``N`` tensors                            ``tensor r of every rank i``, in rank order
gather          its tensor                               the root: every rank's; the others: nothing
scatter         the root: ``N`` tensors; others: none    ``tensor r`` of the root's
barrier         nothing                                  nothing
==============  =======================================  =============================================

The rank side (:mod:`distlab.relay.backend`) turns torch's variants into these
(``all_gather_into_tensor`` is an all_gather into the pieces of one tensor, and so on).

How many bytes a collective *counts* for each rank is not what went through the router (every
rank sends the router all its data): it is what the rank would send in the bandwidth-optimal
algorithm, by the rules of :mod:`distlab.tools.comm_bytes`, the same rules the rank's own
recorder (:mod:`distlab.tools.comm`) uses, so the two records can be compared.
"""

from __future__ import annotations

from distlab.tools import comm_bytes

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
       "scatter", "barrier")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCTIONS = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor")
MOST_ERROR_CHARS = 500
"""The longest error the router sends every rank of a group about a collective that failed."""


class Mismatch(Exception):
    """The ranks of a group called different collectives, or with tensors that do not fit."""


def wrong_call(op, reduction, root, ranks: list) -> str | None:
    """Why a collective's header names no call the relay performs (checked when it arrives), or
    ``None``. When the ranks of a group call different collectives, each is told what the others
    called: only these names and numbers then reach it, never a string another rank chose."""
    if op not in OPS:
        return f"the relay does not perform {str(op)[:40]!r}"
    if reduction not in REDUCTIONS:
        return f"the relay does not perform the reduction {str(reduction)[:40]!r}"
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < len(ranks):
        return f"{op}: root {str(root)[:40]} is not a rank of a group of {len(ranks)}"
    return None


def _reduce(tensors: list, reduction: str):
    import torch

    if reduction not in REDUCTIONS:
        raise Mismatch(f"unknown reduction {reduction!r}")
    result = tensors[0].clone()
    for other in tensors[1:]:
        if reduction in ("sum", "avg"):
            result += other
        elif reduction == "product":
            result *= other
        elif reduction == "min":
            torch.minimum(result, other, out=result)
        elif reduction == "max":
            torch.maximum(result, other, out=result)
        elif reduction == "band":
            result &= other
        elif reduction == "bor":
            result |= other
        else:
            result ^= other
    if reduction == "avg":
        result = result / len(tensors) if result.is_floating_point() else result // len(tensors)
    return result


def _same_layout(contributions: list, what: str) -> None:
    first = [(t.dtype, tuple(t.shape)) for t in contributions[0]]
    for rank, tensors in enumerate(contributions):
        if [(t.dtype, tuple(t.shape)) for t in tensors] != first:
            raise Mismatch(f"{what}: rank {rank} of the group passed "
                           f"{[(str(t.dtype), tuple(t.shape)) for t in tensors]}, rank 0 passed "
                           f"{[(str(d), s) for d, s in first]}")


def perform(op: str, contributions: list, reduction: str = "sum", root: int = 0) -> list:
    """Every group rank's outputs (a list of tensors each), from every group rank's parts."""
    n = len(contributions)
    if op not in OPS:
        raise Mismatch(f"the relay does not perform {op!r}")
    if op in ROOTED and not 0 <= root < n:
        raise Mismatch(f"{op}: root {root} is not a rank of a group of {n}")
    if op == "barrier":
        return [[] for _ in range(n)]
    if op == "all_reduce":
        _same_layout(contributions, op)
        result = [_reduce([c[k] for c in contributions], reduction) for k in range(len(contributions[0]))]
        return [result for _ in range(n)]
    if op == "broadcast":
        return [list(contributions[root]) for _ in range(n)]
    if op == "reduce":
        _same_layout(contributions, op)
        return [[_reduce([c[0] for c in contributions], reduction)] if r == root else [] for r in range(n)]
    if op in ("all_gather", "gather"):
        whole = [c[0] for c in contributions]
        return [whole if op == "all_gather" or r == root else [] for r in range(n)]
    if op == "scatter":
        if len(contributions[root]) != n:
            raise Mismatch(f"scatter: the root passed {len(contributions[root])} tensors for {n} ranks")
        return [[contributions[root][r]] for r in range(n)]
    for rank, c in enumerate(contributions):   # reduce_scatter and all_to_all: N tensors each
        if len(c) != n:
            raise Mismatch(f"{op}: rank {rank} of the group passed {len(c)} tensors for {n} ranks")
    if op == "reduce_scatter":
        return [[_reduce([c[r] for c in contributions], reduction)] for r in range(n)]
    return [[c[r] for c in contributions] for r in range(n)]


class _Sized:
    """Stands for a tensor of ``nbytes`` bytes where :mod:`distlab.tools.comm_bytes` asks for one."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.shape = (nbytes,)

    def numel(self) -> int:
        return self.nbytes

    def element_size(self) -> int:
        return 1


def counted_bytes(op: str, parts_bytes: list, group_rank: int, n: int, root: int = 0) -> tuple[int, int]:
    """``(sent, received)`` by :mod:`distlab.tools.comm_bytes`'s rules for group rank ``group_rank``,
    whose parts have ``parts_bytes`` bytes each (and, for all_to_all, ``n`` parts)."""
    one = _Sized(sum(parts_bytes))
    args = {"tensor": one, "output": _Sized(parts_bytes[0] if parts_bytes else 0), "input_tensor": one,
            "_root_in_group": root}
    if op == "reduce_scatter":   # S = the output: one of the N parts
        args["output"] = _Sized(parts_bytes[group_rank] if len(parts_bytes) == n else 0)
    if op == "all_to_all":
        args["input_tensor_list"] = [_Sized(b) for b in parts_bytes]
        args["output_tensor_list"] = args["input_tensor_list"]
    if op == "scatter":
        args["tensor"] = _Sized(max(parts_bytes, default=0))
    return comm_bytes.RULES[op](args, n, group_rank)
