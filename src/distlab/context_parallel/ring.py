"""Ring attention: every rank keeps its queries and passes key/value blocks around a ring.

Each of ``N`` ranks holds the queries, keys and values of its own tokens (a
:class:`~distlab.context_parallel.layout.Layout`). Attention needs every query to meet every
key, so the key/value blocks travel: in step ``s`` rank ``r`` holds the block that started on
rank ``r - s`` (mod ``N``), computes its queries' partial result over it
(:func:`~distlab.context_parallel.blockwise.block_attention`), merges that into its running
result (:func:`~distlab.context_parallel.blockwise.merge`, exact), and passes the block on to
rank ``r + 1``. After ``N`` steps every query has met every key, and no rank ever held more
than two key/value blocks (Liu et al., 2023, "Ring Attention with Blockwise Transformers").

**Overlap.** The next block does not depend on this step's arithmetic, so each step *first*
posts the transfer (``isend`` of the block it holds to the right, ``irecv`` of the next one
from the left) and only then computes; it waits for the transfer at the end of the step. On
hardware that can send and compute at once, a step costs ``max(compute, transfer)`` instead
of their sum: with blocks of ``t`` tokens the compute grows as ``t^2`` and the transfer as
``t``, so long enough blocks hide the ring entirely.

**Backward** (:class:`RingAttention`). The gradient of the queries stays home: each step adds
this block's share (:func:`~distlab.context_parallel.blockwise.block_backward`, from the
saved final output and log-sum-exp). The gradient of a key/value block is a sum over *every*
rank's queries, so it travels with the block: each rank adds its share to the accumulator that
arrives from the left and sends it on. Key/value blocks go round ``N-1`` times as in forward;
the accumulators go round ``N`` times, the last one bringing each block's finished gradient
home to the rank that owns it.

Bytes per rank (``t`` tokens per rank, ``B = 2 * batch * heads * t * head_dim * element size``,
one key block and one value block): forward ``(N-1) B``, backward ``(2N-1) B``, both sent and
received; :func:`ring_bytes` and, step by step and for uneven layouts,
:func:`ring_bytes_per_step`.

**Causal masking.** A query sees only earlier keys. The ring cuts its work into pairs of
(query chunk, key chunk) of the layout and skips the pairs in which no query sees any key;
only a pair on the diagonal needs a mask. ``on_block(step, source, q_range, k_range)`` is
called for every pair computed, which is how the tests and the book count the work
(:mod:`.balance`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.context_parallel import blockwise
from distlab.context_parallel.layout import Layout, contiguous
from distlab.tools.groups import global_rank, world

KV_TAG, GRAD_TAG = 1, 2      # the blocks and their gradient accumulators travel as separate messages


def _post_exchange(send: torch.Tensor, receive: torch.Tensor, group, tag: int) -> list:
    """Post a send to the right neighbour and a receive from the left one; return the unwaited requests.

    Both at once: if every rank first waited in a blocking send, nobody would be receiving.
    """
    n, me = world(group)
    right, left = global_rank(group, (me + 1) % n), global_rank(group, (me - 1) % n)
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right, group, tag),
                                   dist.P2POp(dist.irecv, receive, left, group, tag)])


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def _block_pairs(layout: Layout, me: int, source: int, causal: bool, device):
    """The pieces of work of one step: ``(q slice, k slice, allowed mask or None, q range, k range)``.

    Without a mask, one pair: all my queries against the whole block. Causal: every pair of
    my chunks and the block's chunks in which at least one query sees a key; the mask only
    where some do and some don't (the diagonal).
    """
    if not causal:
        yield slice(None), slice(None), None, (None, None), (None, None)
        return
    for q_slice, (q_start, q_stop) in layout.local_chunks(me):
        for k_slice, (k_start, k_stop) in layout.local_chunks(source):
            if k_start > q_stop - 1:
                continue                                  # every key after every query: no work
            allowed = None
            if k_stop - 1 > q_start:                      # some keys after some queries
                allowed = blockwise.causal_allowed(torch.arange(q_start, q_stop),
                                                   torch.arange(k_start, k_stop)).to(device)
            yield q_slice, k_slice, allowed, (q_start, q_stop), (k_start, k_stop)


def _block_shape(kv: torch.Tensor, tokens: int) -> tuple:
    return (*kv.shape[:-2], tokens, kv.shape[-1])


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward; call it through :func:`ring_attention`."""

    @staticmethod
    def forward(ctx, q, k, v, layout: Layout, causal: bool, group, on_block):
        n, me = world(group)
        kv = torch.stack([k, v])                           # one message per step: keys and values
        out, lse = blockwise.empty_result(q, v.shape[-1])
        for step in range(n):
            source = (me - step) % n
            if step < n - 1:                               # post the next block's transfer first...
                incoming = kv.new_empty(_block_shape(kv, layout.tokens((source - 1) % n)))
                requests = _post_exchange(kv, incoming, group, KV_TAG)
            for q_slice, k_slice, allowed, q_range, k_range in _block_pairs(layout, me, source, causal, q.device):
                if on_block is not None:
                    on_block(step, source, q_range, k_range)
                part = blockwise.block_attention(q[..., q_slice, :], kv[0][..., k_slice, :], kv[1][..., k_slice, :],
                                                 allowed)
                out[..., q_slice, :], lse[..., q_slice] = blockwise.merge(out[..., q_slice, :], lse[..., q_slice],
                                                                          *part)
            if step < n - 1:                               # ...then compute, then wait for it
                _wait(requests)
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.causal, ctx.group = layout, causal, group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        layout, causal, group = ctx.layout, ctx.causal, ctx.group
        n, me = world(group)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(dim=-1)               # the softmax's backward term, once per query
        grad_q = torch.zeros_like(q)
        kv = torch.stack([k, v])
        grad_requests, grad_incoming = [], None
        for step in range(n):
            source = (me - step) % n
            next_tokens = layout.tokens((source - 1) % n)
            if step < n - 1:
                incoming = kv.new_empty(_block_shape(kv, next_tokens))
                kv_requests = _post_exchange(kv, incoming, group, KV_TAG)
            if step == 0:
                grad_kv = torch.zeros_like(kv)             # my own block's accumulator starts here
            else:
                _wait(grad_requests)                       # the accumulator of the block I now hold
                grad_kv = grad_incoming
            for q_slice, k_slice, allowed, _, _ in _block_pairs(layout, me, source, causal, q.device):
                dq, dk, dv = blockwise.block_backward(
                    q[..., q_slice, :], kv[0][..., k_slice, :], kv[1][..., k_slice, :], out[..., q_slice, :],
                    lse[..., q_slice], grad_out[..., q_slice, :], allowed, delta=delta[..., q_slice])
                grad_q[..., q_slice, :] += dq
                grad_kv[0][..., k_slice, :] += dk
                grad_kv[1][..., k_slice, :] += dv
            if n > 1:                                      # pass the accumulator on; the last one comes home
                grad_incoming = kv.new_empty(_block_shape(kv, next_tokens))
                grad_requests = _post_exchange(grad_kv, grad_incoming, group, GRAD_TAG)
            if step < n - 1:
                _wait(kv_requests)
                kv = incoming
        if n > 1:
            _wait(grad_requests)
            grad_kv = grad_incoming
        return grad_q, grad_kv[0], grad_kv[1], None, None, None, None


def ring_attention(q, k, v, causal: bool = False, layout: Layout | None = None, group=None, on_block=None):
    """Attention of this rank's queries over every rank's keys and values, by ring; differentiable.

    ``q``, ``k``, ``v``: this rank's tokens, ``(batch, heads, tokens, head_dim)``, in the order
    ``layout`` gives (default: :func:`~distlab.context_parallel.layout.contiguous` over
    ``N * tokens``). Returns this rank's rows of the output; ``backward`` gives this rank's rows
    of the gradients of ``q``, ``k`` and ``v``.
    """
    n, me = world(group)
    layout = contiguous(n * q.shape[-2], n) if layout is None else layout
    if layout.ranks != n:
        raise ValueError(f"the layout is for {layout.ranks} ranks, the group has {n}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-2] != layout.tokens(me):
            raise ValueError(f"{name} holds {t.shape[-2]} tokens on rank {me}; its layout gives it {layout.tokens(me)}")
    if k.shape != v.shape:
        raise ValueError(f"keys {tuple(k.shape)} and values {tuple(v.shape)} must have one shape (they travel stacked)")
    return RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), layout, causal, group, on_block)


# -- what it sends ------------------------------------------------------------------------------------

def kv_block_bytes(tokens: int, batch: int, heads: int, head_dim: int, element_size: int) -> int:
    """Bytes of one travelling block: the keys and the values of ``tokens`` tokens."""
    return 2 * batch * heads * tokens * head_dim * element_size


def ring_bytes(n: int, seq: int, batch: int, heads: int, head_dim: int, element_size: int,
               backward: bool = False) -> int:
    """Bytes one rank sends (and receives) in a ring over ``n`` ranks, ``seq`` divisible by ``n``.

    Forward: ``N-1`` blocks of ``seq/N`` tokens. Backward: the same ``N-1`` blocks again, and
    ``N`` gradient accumulators of the same size.
    """
    block = kv_block_bytes(seq // n, batch, heads, head_dim, element_size)
    return (2 * n - 1) * block if backward else (n - 1) * block


def ring_bytes_per_step(layout: Layout, rank: int, batch: int, heads: int, head_dim: int, element_size: int,
                        backward: bool = False) -> list[tuple[int, int]]:
    """``(sent, received)`` by ``rank`` in each of the ``N`` steps, for any layout (uneven blocks too).

    In step ``s`` it sends the block of rank ``rank - s`` and receives that of ``rank - s - 1``
    (nothing in the last step forward); backward, each step also sends and receives one
    gradient accumulator of those two blocks' sizes.
    """
    n = layout.ranks
    steps = []
    for step in range(n):
        held = kv_block_bytes(layout.tokens((rank - step) % n), batch, heads, head_dim, element_size)
        arriving = kv_block_bytes(layout.tokens((rank - step - 1) % n), batch, heads, head_dim, element_size)
        blocks = (held, arriving) if step < n - 1 else (0, 0)
        accumulators = (held, arriving) if backward and n > 1 else (0, 0)
        steps.append((blocks[0] + accumulators[0], blocks[1] + accumulators[1]))
    return steps
