"""DeepSpeed-Ulysses: trade the sequence split for a head split, attend, and trade back.

Attention's heads are independent of one another: head ``h`` needs the queries, keys and values
of head ``h`` only, but of *every* token. So instead of passing blocks around (:mod:`.ring`),
Ulysses (Jacobs et al., 2023, "DeepSpeed Ulysses") re-cuts the tensors:

1. each rank holds all heads of its tokens, ``(batch, heads, tokens/N, head_dim)``;
2. one ``all_to_all`` per tensor (:func:`sequence_to_heads`): rank ``r`` sends head group
   ``j`` of its tokens to rank ``j`` and receives head group ``r`` of every rank's tokens,
   ``(batch, heads/N, tokens, head_dim)``;
3. ordinary attention over the whole sequence, for its ``heads/N`` heads
   (``F.scaled_dot_product_attention``: any fast kernel will do, nothing blockwise);
4. one ``all_to_all`` back (:func:`heads_to_sequence`): each rank gets all heads of its tokens.

Backward is the same with the two all-to-alls swapped (an all-to-all's gradient is the inverse
all-to-all). **Its constraint:** the heads must split evenly over the ranks, so the degree of
Ulysses is at most the number of (key/value) heads: 8 for Llama 3 70B's grouped keys and
values, however long the sequence.

**Bytes per rank** (``E = batch * heads * seq * head_dim * element size``, one whole tensor):
each all-to-all keeps ``1/N`` of a rank's ``E/N`` and sends the rest, ``(N-1)/N^2 E``; forward
moves q, k, v and the output, backward the output's gradient and those of q, k and v: four each
way, ``4 (N-1)/N^2 E`` (:func:`ulysses_bytes`). The ring sends ``2 (N-1)/N E`` forward
(:func:`~distlab.context_parallel.ring.ring_bytes`): Ulysses sends ``2/N`` of the ring's bytes,
and its bytes per rank *fall* as ranks are added while the ring's stay near ``2 E``. The ring's
advantage is elsewhere: its messages go to a neighbour only and hide behind compute; an
all-to-all involves every rank and waits for the slowest link.

The sequence may be cut by any :class:`~distlab.context_parallel.layout.Layout`, uneven ones
too: after the all-to-all each rank holds the tokens in layout order, and the causal mask is
made from their positions.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.context_parallel.blockwise import causal_allowed
from distlab.context_parallel.layout import Layout, contiguous
from distlab.tools.groups import world


def check_heads(heads: int, n: int) -> None:
    """Ulysses gives every rank ``heads / n`` whole heads: refuse what does not divide."""
    if heads % n:
        raise ValueError(f"Ulysses needs the heads ({heads}) to split evenly over {n} ranks: each rank attends "
                         f"with whole heads; use a number of ranks that divides {heads}, or ring attention")


def _all_to_all(pieces: list[torch.Tensor], shapes: list[tuple], group) -> list[torch.Tensor]:
    """Send ``pieces[j]`` to rank ``j``; return what each rank ``i`` sent me, shaped ``shapes[i]``.

    Flattened into one ``all_to_all_single``, so pieces of different sizes (uneven layouts) go too.
    """
    if len(pieces) == 1:                                  # one rank: it sends itself everything
        return [pieces[0].reshape(shapes[0])]
    send = torch.cat([p.reshape(-1) for p in pieces])
    sizes = [torch.Size(s).numel() for s in shapes]
    receive = send.new_empty(sum(sizes))
    dist.all_to_all_single(receive, send, output_split_sizes=sizes,
                           input_split_sizes=[p.numel() for p in pieces], group=group)
    return [part.view(shape) for part, shape in zip(receive.split(sizes), shapes)]


def sequence_to_heads(x: torch.Tensor, layout: Layout, group=None) -> torch.Tensor:
    """``(batch, heads, my tokens, d)`` to ``(batch, heads/N, all tokens in layout order, d)``."""
    n, _ = world(group)
    batch, heads, _, head_dim = x.shape
    check_heads(heads, n)
    mine = heads // n
    pieces = [x[:, j * mine:(j + 1) * mine] for j in range(n)]
    parts = _all_to_all(pieces, [(batch, mine, layout.tokens(i), head_dim) for i in range(n)], group)
    return torch.cat(parts, dim=2)


def heads_to_sequence(y: torch.Tensor, layout: Layout, group=None) -> torch.Tensor:
    """The inverse: ``(batch, heads/N, all tokens, d)`` to ``(batch, heads, my tokens, d)``."""
    n, me = world(group)
    batch, mine, _, head_dim = y.shape
    pieces = list(y.split([layout.tokens(j) for j in range(n)], dim=2))
    parts = _all_to_all(pieces, [(batch, mine, layout.tokens(me), head_dim)] * n, group)
    return torch.cat(parts, dim=1)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout, group):
        ctx.layout, ctx.group = layout, group
        return sequence_to_heads(x, layout, group)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_sequence(grad.contiguous(), ctx.layout, ctx.group), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, layout, group):
        ctx.layout, ctx.group = layout, group
        return heads_to_sequence(y, layout, group)

    @staticmethod
    def backward(ctx, grad):
        return sequence_to_heads(grad.contiguous(), ctx.layout, ctx.group), None, None


def ulysses_attention(q, k, v, causal: bool = False, layout: Layout | None = None, group=None) -> torch.Tensor:
    """Attention of this rank's tokens (all heads) by two all-to-alls around plain attention; differentiable.

    ``q``, ``k``, ``v``: ``(batch, heads, tokens, head_dim)``, this rank's tokens in ``layout``'s
    order (default :func:`~distlab.context_parallel.layout.contiguous`). Returns this rank's
    rows of the output.
    """
    n, me = world(group)
    layout = contiguous(n * q.shape[-2], n) if layout is None else layout
    check_heads(q.shape[1], n)
    if q.shape[-2] != layout.tokens(me):
        raise ValueError(f"rank {me} holds {q.shape[-2]} tokens; its layout gives it {layout.tokens(me)}")
    q, k, v = (_SequenceToHeads.apply(t.contiguous(), layout, group) for t in (q, k, v))
    mask = None
    if causal:
        positions = torch.cat([layout.positions(r) for r in range(n)]).to(q.device)
        mask = causal_allowed(positions, positions)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return _HeadsToSequence.apply(out.contiguous(), layout, group)


def ulysses_bytes(n: int, seq: int, batch: int, heads: int, head_dim: int, element_size: int) -> int:
    """Bytes one rank sends (and receives) forward, or backward: four all-to-alls of ``(N-1)/N^2`` of a tensor."""
    whole = batch * heads * seq * head_dim * element_size
    return 4 * (n - 1) * whole // (n * n)
