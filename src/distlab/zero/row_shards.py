"""FSDP2's unit of sharding: one parameter cut by rows, and a group's two collectives over such pieces.

The flat-unit form (:mod:`.flat`) lays a layer's parameters end to end and cuts the *buffer*
in ``N``: a rank's slice may start inside one weight and end inside the next, so it is no
parameter of the model, only a piece of memory. Torch's FSDP2 cuts *each parameter* along its
first dimension instead (``torch.chunk(param, N, dim=0)``): rank ``r`` holds rows
``[r c, (r + 1) c)`` of every weight, ``c = ceil(rows / N)``, which is what a
:class:`~torch.distributed.tensor.DTensor` with placement ``Shard(0)`` on a 1-D mesh of the
``N`` ranks means. So a rank's piece of ``fc1.weight`` *is* a parameter, with a name, a shape
and a gradient of the same shape, and the optimizer, gradient clipping and checkpoints see
parameters again. :class:`RowShard` keeps one of them:

* ``sharded``: the ``nn.Parameter`` the module holds between steps, a ``Shard(0)`` DTensor;
  its local piece is a view into ``c`` rows (zero-padded when the rows do not divide by
  ``N``; the last ranks' pieces may even be empty), as FSDP2 keeps it;
* ``unsharded``: the ``nn.Parameter`` the module computes with, all rows, in the compute
  dtype. It is created once and keeps its identity (autograd saves it for backward); only its
  memory comes and goes (``untyped_storage().resize_``), as in the flat form.

One collective per *group* (the parameters of one ``fully_shard`` call), not per parameter,
since a collective's fixed cost is paid per call. The price of cutting by rows is in copies:

* all-gather (:func:`all_gather`, :func:`copy_out`): *copy in* every padded local piece, end
  to end, into one send buffer; after the all-gather the receive buffer holds rank 0's pieces,
  then rank 1's...; *copy out* parameter by parameter, each taking its rows from every rank.
  Two copies the flat form does without: its parameters are views into the gathered buffer;
* reduce-scatter (:func:`reduce_scatter`): every gradient padded to ``N c`` rows and seen as
  ``N`` blocks of ``c`` rows, copied side by side into one send buffer of ``N`` rows (FSDP2
  does it in one kernel, ``chunk_cat``), so that rank ``r`` receives the average of its own
  rows of every gradient; they become the ``sharded`` parameters' ``.grad``, as DTensors of
  the same layout. One copy, as the flat form's (it lays the gradients end to end).

The layout of both buffers is FSDP2's, element for element, which is why gloo's reductions
(whose rounding depends on an element's position) give the same bits as torch's.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard


def local_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``(first, end)``: the rows of a ``rows``-row tensor rank ``rank`` holds (``torch.chunk``'s cut)."""
    per_rank = math.ceil(rows / world)
    first = min(rank * per_rank, rows)
    return first, min(first + per_rank, rows)


class RowShard:
    """One parameter of a ``fully_shard`` group: this rank's rows (``sharded``) and, on demand, all of them.

    Args:
        param: the module's parameter, the same full tensor on every rank.
        mesh: the 1-D device mesh of the ranks that share it.
        compute_dtype: the dtype of ``unsharded`` (the mixed-precision policy's ``param_dtype``),
            or ``None`` for the parameter's own.
    """

    def __init__(self, param: nn.Parameter, mesh, compute_dtype: torch.dtype | None = None):
        if param.dim() == 0:
            raise ValueError("fully_shard cuts parameters by rows: a 0-dim parameter has none (make it 1-element)")
        self.mesh, self.group = mesh, mesh.get_group()
        self.world, rank = self.group.size(), dist.get_rank(self.group)
        self.shape, self.requires_grad = param.shape, param.requires_grad
        self.compute_dtype = compute_dtype or param.dtype
        self.rows_per_rank = math.ceil(self.shape[0] / self.world)
        first, end = local_rows(self.shape[0], rank, self.world)
        with torch.no_grad():
            self.padded = param.new_zeros(self.rows_per_rank, *self.shape[1:])     # this rank's rows, padded
            self.padded[: end - first].copy_(param[first:end])
            self.sharded = nn.Parameter(self.as_dtensor(self.padded[: end - first]), requires_grad=self.requires_grad)
        self.full_padded = None        # all rows, padded to N c, in compute dtype: allocated by the first gather
        self.unsharded = None

    @property
    def numel_per_rank(self) -> int:
        """Elements of one rank's padded piece: its share of the group's collective buffers."""
        return self.padded.numel()

    def as_dtensor(self, local: torch.Tensor) -> DTensor:
        """``local`` (this rank's rows) as a ``Shard(0)`` DTensor of the full parameter's shape."""
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False, shape=self.shape,
                                  stride=torch.empty(self.shape, device="meta").stride())

    # -- the full rows: their memory comes and goes, the Parameter object stays -------------------

    def allocate(self) -> None:
        """Give ``unsharded`` memory for all rows (creating it the first time)."""
        if self.full_padded is None:
            self.full_padded = torch.empty(self.world * self.rows_per_rank, *self.shape[1:],
                                           dtype=self.compute_dtype, device=self.padded.device)
            self.unsharded = nn.Parameter(torch.empty(0, dtype=self.compute_dtype), requires_grad=self.requires_grad)
            # `.data = view`: the Parameter keeps its own version counter, so writing the buffer
            # in the next gather does not look to autograd like an in-place change of a saved tensor
            self.unsharded.data = self.full_padded[: self.shape[0]]
        storage = self.full_padded.untyped_storage()
        storage.resize_(self.full_padded.numel() * self.full_padded.element_size())

    def free(self) -> None:
        """Release the full rows' memory; ``unsharded`` keeps its shape but holds nothing."""
        if self.full_padded is not None:
            self.full_padded.untyped_storage().resize_(0)

    def receive_gradient(self, local_grad: torch.Tensor) -> None:
        """Add this rank's averaged rows (a view of the reduce-scatter's output) to ``sharded.grad``."""
        first_rows = local_grad.view(self.rows_per_rank, *self.shape[1:])[: self.sharded.to_local().shape[0]]
        if self.sharded.grad is None:
            self.sharded.grad = self.as_dtensor(first_rows)
        else:                                                   # several backwards before a step: they add up
            self.sharded.grad.to_local().add_(first_rows)


# -- a group's collectives ---------------------------------------------------------------------

def all_gather(shards: list[RowShard], async_op: bool = False):
    """Copy in every padded piece, in compute dtype, and all-gather: ``(work or None, receive buffer)``."""
    send = torch.cat([s.padded.reshape(-1).to(s.compute_dtype) for s in shards])
    receive = send.new_empty(shards[0].world * send.numel())
    work = dist.all_gather_single(receive, send, group=shards[0].group, async_op=async_op)
    return work, receive


def copy_out(shards: list[RowShard], receive: torch.Tensor) -> None:
    """From the receive buffer (rank by rank, piece by piece) into each parameter's full rows."""
    world = shards[0].world
    per_rank = receive.view(world, -1)
    for s, pieces in zip(shards, per_rank.split([s.numel_per_rank for s in shards], dim=1)):
        s.allocate()
        s.full_padded.view(world, -1).copy_(pieces)       # rank r's rows land at rows [r c, (r + 1) c)


def reduce_scatter(shards: list[RowShard], reduce_dtype: torch.dtype | None = None) -> None:
    """Average the ``unsharded`` parameters' gradients over the ranks into the ``sharded`` ones' ``.grad``.

    Only the parameters that have a gradient take part (as in FSDP2); each full gradient is
    dropped as soon as it is copied into the send buffer. Reduced in ``reduce_dtype`` (default: the gradients' own), handed to
    the sharded parameters in their dtype.
    """
    with_grad = [s for s in shards if s.unsharded is not None and s.unsharded.grad is not None]
    if not with_grad:
        return
    world, dtype = with_grad[0].world, reduce_dtype or with_grad[0].unsharded.grad.dtype
    sizes = [s.numel_per_rank for s in with_grad]
    send = torch.empty(world, sum(sizes), dtype=dtype, device=with_grad[0].padded.device)
    for s, columns in zip(with_grad, send.split(sizes, dim=1)):
        grad, missing_rows = s.unsharded.grad, world * s.rows_per_rank - s.shape[0]
        if missing_rows:                                       # zero rows, so that N row blocks of c fit
            grad = F.pad(grad, [0, 0] * (len(s.shape) - 1) + [0, missing_rows])
        columns.copy_(grad.reshape(world, -1))                 # row block r to row r of the buffer (and cast)
        s.unsharded.grad = None                                # copied: the full gradient can go
    receive = send.new_empty(send.shape[1])
    dist.reduce_scatter_single(receive, send.view(-1), op=dist.ReduceOp.AVG, group=with_grad[0].group)
    receive = receive.to(with_grad[0].sharded.dtype)
    for s, mine in zip(with_grad, receive.split(sizes)):
        s.receive_gradient(mine)
