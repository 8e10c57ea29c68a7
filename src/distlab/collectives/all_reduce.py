"""All-reduce from scratch, three ways, using nothing but point-to-point messages.

Every rank holds a tensor of ``S`` bytes; afterwards every rank must hold the element-wise
sum. How much each rank sends decides how fast that is:

* **naive** (:func:`naive_all_reduce`): everyone sends its tensor to rank 0, rank 0 adds
  them up and sends the sum back to everyone. Rank 0 receives and sends ``(N-1)*S``: its
  link is the bottleneck, and it gets worse with every rank you add.
* **tree** (:func:`tree_all_reduce`): ranks pair up and add, halving the number of partial
  sums each round, then the sum travels back down the same tree. ``log2 N`` rounds (good
  for small messages, where latency dominates), but each round still moves all ``S`` bytes.
* **ring** (:func:`ring_all_reduce`): cut the tensor into ``N`` chunks and pass chunks around
  a ring. First a *reduce-scatter* (:func:`ring_reduce_scatter`, ``N-1`` steps): after it,
  rank ``r`` owns the complete sum of one chunk. Then an *all-gather*
  (:func:`ring_all_gather`, ``N-1`` steps): each finished chunk travels around the ring.
  Each rank sends ``2(N-1)/N * S`` bytes in total, which is the minimum any all-reduce
  needs: that is why it is called bandwidth-optimal, and why NCCL uses rings for large
  messages.

Each function takes an optional ``on_step(phase, step, tensor)`` callback: the book uses it
to draw the state of every rank after every step of a real run.

The α-β (latency-bandwidth) cost model of each algorithm is in :mod:`.cost_model`.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from distlab.tools.groups import global_rank


def _ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """This rank's position in the ring, the ring size, and the global ranks of its neighbours."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    return me, n, global_rank(group, (me - 1) % n), global_rank(group, (me + 1) % n)


def _start_exchange(send: torch.Tensor, recv: torch.Tensor, to: int, frm: int, group=None) -> list:
    """Post a send to one neighbour and a receive from the other; return the requests unwaited."""
    return dist.batch_isend_irecv([
        dist.P2POp(dist.isend, send.contiguous(), to, group),
        dist.P2POp(dist.irecv, recv, frm, group),
    ])


def _exchange(send: torch.Tensor, recv: torch.Tensor, to: int, frm: int, group=None) -> None:
    """Send to one neighbour while receiving from the other. Both at once, or a ring deadlocks:
    if every rank first waited in a blocking send, nobody would be receiving."""
    for request in _start_exchange(send, recv, to, frm, group):
        request.wait()


def ring_reduce_scatter(chunks: list[torch.Tensor], group=None, on_step=None) -> int:
    """Sum ``chunks`` across ranks so that this rank ends up owning one complete chunk.

    ``chunks`` is this rank's tensor cut into N pieces (they are updated in place). In step
    ``s``, rank ``r`` sends chunk ``(r - s) mod N`` to its right neighbour and adds the chunk
    ``(r - s - 1) mod N`` arriving from its left. After ``N-1`` steps, chunk ``(r + 1) mod N``
    holds the sum over all ranks. Returns the index of that chunk.
    """
    me, n, left, right = _ring_neighbours(group)
    buffer = torch.empty_like(chunks[0])  # chunks differ by at most one element: reuse one buffer
    for step in range(n - 1):
        send_index, recv_index = (me - step) % n, (me - step - 1) % n
        incoming = buffer[: chunks[recv_index].numel()].view_as(chunks[recv_index])
        _exchange(chunks[send_index], incoming, right, left, group)
        chunks[recv_index] += incoming
        if on_step is not None:
            on_step("reduce-scatter", step, chunks)
    return (me + 1) % n


def ring_all_gather(chunks: list[torch.Tensor], owned: int, group=None, on_step=None) -> None:
    """Give every rank every complete chunk: each rank starts owning chunk ``owned``.

    In step ``s`` rank ``r`` forwards the complete chunk it received last (at first its own)
    to the right, and stores the one arriving from the left. ``N-1`` steps, in place.
    """
    me, n, left, right = _ring_neighbours(group)
    for step in range(n - 1):
        send_index, recv_index = (owned - step) % n, (owned - step - 1) % n
        incoming = torch.empty_like(chunks[recv_index])
        _exchange(chunks[send_index], incoming, right, left, group)
        chunks[recv_index].copy_(incoming)
        if on_step is not None:
            on_step("all-gather", step, chunks)


def ring_all_reduce(tensor: torch.Tensor, group=None, on_step=None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, with a ring: reduce-scatter, then all-gather.

    Works for any number of elements: ``torch.tensor_split`` makes N chunks whose sizes
    differ by at most one element.
    """
    n = dist.get_world_size(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    chunks = list(torch.tensor_split(flat, n))  # views into flat: updating them updates tensor
    owned = ring_reduce_scatter(chunks, group, on_step)
    ring_all_gather(chunks, owned, group, on_step)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def naive_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place: everything to rank 0 and back."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    root = global_rank(group, 0)
    if me == 0:
        incoming = torch.empty_like(tensor)
        for other in range(1, n):
            dist.recv(incoming, src=global_rank(group, other), group=group)
            tensor += incoming
        for other in range(1, n):
            dist.send(tensor, dst=global_rank(group, other), group=group)
    else:
        dist.send(tensor, dst=root, group=group)
        dist.recv(tensor, src=root, group=group)
    return tensor


def tree_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place: reduce up a binary tree, broadcast back down.

    In round ``k`` (distance ``d = 2**k``), a rank whose index is an odd multiple of ``d``
    sends its partial sum to the rank ``d`` below it and drops out; after ``ceil(log2 N)``
    rounds rank 0 holds the total, which then travels back down the same tree.
    """
    n, me = dist.get_world_size(group), dist.get_rank(group)
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    incoming = torch.empty_like(tensor)
    for k in range(rounds):  # up: partial sums flow towards rank 0
        d = 2 ** k
        if me % (2 * d) == d:
            dist.send(tensor, dst=global_rank(group, me - d), group=group)
            break
        if me % (2 * d) == 0 and me + d < n:
            dist.recv(incoming, src=global_rank(group, me + d), group=group)
            tensor += incoming
    for k in reversed(range(rounds)):  # down: the total flows back along the same edges
        d = 2 ** k
        if me % (2 * d) == d:
            dist.recv(tensor, src=global_rank(group, me - d), group=group)
        elif me % (2 * d) == 0 and me + d < n:
            dist.send(tensor, dst=global_rank(group, me + d), group=group)
    return tensor
