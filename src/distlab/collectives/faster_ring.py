"""The ring all-reduce again, without the waste: the same messages as :mod:`.all_reduce`, less work around them.

:func:`~.all_reduce.ring_all_reduce` is written to be read. Profiled on one rank (chapter 2's
"Closing the gap to gloo" section measures each part), its time goes to three things besides
the ``2(N-1)`` messages themselves:

1. **Fresh memory.** Each all-gather step received into a new temporary and then copied it
   into place. New memory is not free: the operating system hands it out one 4 kB page at a
   time, on first touch, and on a busy machine that costs a good part of sending it. The
   all-gather needs no temporary at all, since the arriving chunk overwrites the stale copy,
   so here it is received *in place*.
2. **A scratch buffer per call.** The reduce-scatter does need one chunk of scratch space to
   receive into before adding. It is allocated once and kept between calls
   (:func:`_scratch`), as NCCL and gloo keep theirs.
3. **Adding while nothing moves.** The reduce-scatter adds a received chunk only after the
   whole chunk arrived. Cut into ``segments`` pieces, the next piece can travel while the
   previous one is added: the transfer and the addition overlap, as in gloo's and NCCL's
   rings. Each piece is one more message, though, and every message pays the latency α
   once; pipelining pays only where the work it hides is large next to α. On a CPU machine
   the additions are a few percent of the time and two segments measured no faster than
   one, hence the default ``segments=1``; on GPUs NCCL cuts chunks into many pieces.

With these changes the ring runs as fast as gloo's built-in on the machine that built the
book (``benchmarks/collectives.py`` prints the ratio). Bytes sent are exactly those of the
simple ring, ``2(N-1)/N`` of the tensor per rank.
"""

from __future__ import annotations

import torch

from distlab.collectives.all_reduce import _exchange, _ring_neighbours, _start_exchange

_SCRATCH: dict[tuple, torch.Tensor] = {}


def _scratch(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A buffer of ``numel`` elements of ``like``'s dtype and device, reused from call to call.

    One buffer per (dtype, device), grown when a larger one is asked for: its pages are
    touched once, the first time, instead of in every all-reduce.
    """
    key = (like.dtype, like.device)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = _SCRATCH[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buffer[:numel]


def _receive_and_add(send: torch.Tensor, into: torch.Tensor, scratch: torch.Tensor, to: int, frm: int,
                     segments: int, group=None) -> None:
    """Send ``send`` to the right, receive the left neighbour's chunk and add it into ``into``.

    With ``segments > 1`` the chunks travel in pieces, and piece ``j`` is added while piece
    ``j + 1`` is on the wire.
    """
    sends = torch.tensor_split(send, segments)
    targets = torch.tensor_split(into, segments)
    arriving = torch.tensor_split(scratch, segments)
    in_flight = _start_exchange(sends[0], arriving[0], to, frm, group)
    for j in range(segments):
        for request in in_flight:
            request.wait()
        if j + 1 < segments:  # the next piece travels while this one is added
            in_flight = _start_exchange(sends[j + 1], arriving[j + 1], to, frm, group)
        targets[j].add_(arriving[j])


def faster_ring_all_reduce(tensor: torch.Tensor, group=None, segments: int = 1) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place: the ring of :mod:`.all_reduce`, with no
    temporaries, a reused scratch buffer and, optionally, pipelined pieces (see the module)."""
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    me, n, left, right = _ring_neighbours(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    chunks = list(torch.tensor_split(flat, n))
    scratch = _scratch(chunks[0].numel(), flat)        # chunk 0 is the largest
    for step in range(n - 1):                          # reduce-scatter
        send_index, recv_index = (me - step) % n, (me - step - 1) % n
        incoming = scratch[: chunks[recv_index].numel()]
        _receive_and_add(chunks[send_index], chunks[recv_index], incoming, right, left, segments, group)
    owned = (me + 1) % n
    for step in range(n - 1):                          # all-gather, received straight into place
        send_index, recv_index = (owned - step) % n, (owned - step - 1) % n
        _exchange(chunks[send_index], chunks[recv_index], right, left, group)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor
