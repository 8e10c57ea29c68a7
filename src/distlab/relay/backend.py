"""The rank's side of the relay: a ``torch.distributed`` backend that talks only to the router.

``init_process_group()`` here (what the worker calls when a run asks for ``backend="relay"``)
joins a process group whose every operation, point-to-point or collective, is a frame
written to one descriptor (:mod:`distlab.relay.frames`) and answered on the same descriptor
by the router (:mod:`distlab.relay.router`), which sees and records all of it.

The contract with whatever starts the rank
------------------------------------------
* The rank inherits one end of a connected ``AF_UNIX`` stream socket (a ``socketpair``) from
  its launch, and finds its number in the environment variable ``DISTLAB_RELAY_FD``
  (:data:`RELAY_FD`). That descriptor is the rank's only link to the others.
* ``RANK`` and ``WORLD_SIZE`` say who it is, as under torchrun. No ``MASTER_ADDR``, no port:
  the process group's store is a :class:`torch.distributed.HashStore`, a dictionary inside
  this one process, which can carry nothing between ranks (the backend never uses it).
* So the backend needs no network, no store shared between ranks and no shared file: it
  works unchanged in a rank that has no network at all, no ``/tmp`` or ``/dev/shm`` shared
  with another rank, and no folder in common (the private room the grader gives each graded
  rank). What a rank sends is recorded by the router from the descriptor it came in on.

What it implements: ``send``/``recv`` (so ``isend``/``irecv`` and ``batch_isend_irecv``, which
torch builds on them for backends without coalescing), and ``all_reduce``, ``broadcast``,
``reduce``, ``all_gather`` (and ``all_gather_into_tensor``), ``reduce_scatter`` (and
``reduce_scatter_tensor``), ``all_to_all`` (and ``all_to_all_single``), ``gather``, ``scatter``
and ``barrier``, which the router performs centrally (:mod:`distlab.relay.collectives`). Groups
made with ``new_group`` work too. A send's work completes once the receiver has taken the
message, as gloo's does (a blocking ``send`` waits for the matching ``recv``); a receive waits
until the message arrives.

torch's functional collectives (``torch.ops._c10d_functional``: what DTensor, device meshes and
``fully_shard`` call) work too. They find a process group by its name in torch's C++ registry and
call it through the binding's trampoline, which knows only some of a Python group's methods:
``allreduce``, ``broadcast``, ``alltoall_base``, and the coalesced all-gather and reduce-scatter
(:meth:`RelayGroup.all_gather_single_coalesced`, :meth:`RelayGroup.reduce_scatter_single_coalesced`,
each tensor a collective of its own); ``wait_tensor`` then waits on the :class:`Work` returned. So
the group answers to its name (:meth:`RelayGroup.getGroupName`): a Python group has no C++
backend from which torch could read it. Their in-place and ``_out`` variants (``all_reduce_``,
``broadcast_``, ``reduce_scatter_tensor_out``, ...) take the same roads, except one:
``all_gather_into_tensor_out``'s kernel asks the group for that C++ backend, so a rank that joins
the relay gives the operator a kernel of its own (:func:`_all_gather_into_tensor_out`).
``new_group`` and device meshes need nothing shared either: their groups are made by every rank
alike, named by their ranks, and never use the store.

Not provided: ``recv`` from any source; it fails with an error instead of going around the router.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from distlab.relay import frames
from distlab.relay.link import RELAY_FD, RelayError, Work, link  # noqa: F401 - RELAY_FD: part of this module's contract

NAME = "relay"
STORE_WAIT_S = 2
"""How long a ``get`` on the process group's (private) store waits for a key that is not there."""
_REDUCTIONS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max",
               "BAND": "band", "BOR": "bor", "BXOR": "bxor"}


def _reduction(opts) -> str:
    name = getattr(getattr(opts.reduceOp, "op", opts.reduceOp), "name", "")
    if name not in _REDUCTIONS:
        raise RelayError(f"the relay does not perform the reduction {name or opts.reduceOp!r}")
    return _REDUCTIONS[name]


def _copy_into(targets):
    """An arrival handler copying the router's tensors into ``targets``, in order."""
    def copy(tensors):
        if len(tensors) != len(targets):
            raise RelayError(f"the router answered with {len(tensors)} tensors for {len(targets)}")
        for target, tensor in zip(targets, tensors):
            if target.numel() != tensor.numel():
                raise RelayError(f"received {tensor.numel()} elements into a tensor of {target.numel()}")
            target.copy_(tensor.reshape(target.shape))
        return list(targets)
    return copy


class RelayGroup(dist.ProcessGroup):
    """A process group whose every operation goes through the router (see the module docstring)."""

    def __init__(self, group_rank: int, group_size: int, global_ranks: list[int], group_id: int):
        super().__init__(group_rank, group_size)
        self._me, self._ranks, self._group_id, self._seq = group_rank, list(global_ranks), group_id, 0
        self._name = str(group_id)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._name = name

    # -- point to point --------------------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        parts, payload = frames.encode(tensors)
        work = Work(f"send to rank {self._ranks[dst]}")   # done once the receiver has taken it
        link().send_message(work, {"k": "send", "dst": self._ranks[dst], "tag": tag, "parts": parts}, payload)
        return work

    def recv(self, tensors, src: int, tag: int = 0):
        work = Work(f"recv from rank {self._ranks[src]}", _copy_into(tensors))
        link().post_receive(work, self._ranks[src], tag)
        return work

    def recv_anysource(self, tensors, tag: int = 0):
        raise RelayError("recv without a source is not available on the relay: name the rank you receive from")

    # -- collectives, performed by the router -------------------------------------------------------

    def _collective(self, op: str, tensors, on_arrival, reduction: str = "sum", root: int = 0):
        seq, self._seq = self._seq, self._seq + 1
        parts, payload = frames.encode(tensors)
        work = Work(op, on_arrival)
        link().expect_reply((self._group_id, seq), work)
        link().send({"k": "coll", "op": op, "group": self._group_id, "ranks": self._ranks, "seq": seq,
                     "reduction": reduction, "root": root, "parts": parts}, payload)
        return work

    def allreduce(self, tensors, opts=None):
        return self._collective("all_reduce", tensors, _copy_into(tensors), _reduction(opts or dist.AllreduceOptions()))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = (opts or dist.BroadcastOptions()).rootRank
        return self._collective("broadcast", tensors if self._me == root else [], _copy_into(tensors), root=root)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        targets = tensors if self._me == opts.rootRank else []
        return self._collective("reduce", tensors, _copy_into(targets), _reduction(opts), opts.rootRank)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._collective("all_gather", input_tensors, _copy_into(output_tensors[0]))

    def all_gather_single(self, output, input, opts=None):
        pieces = list(output.reshape(-1).split(input.numel())) if output.is_contiguous() else None
        if pieces is None:
            raise RelayError("all_gather_into_tensor needs a contiguous output tensor on the relay")
        return self._collective("all_gather", [input], _copy_into(pieces))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._collective("reduce_scatter", input_tensors[0], _copy_into(output_tensors),
                                _reduction(opts or dist.ReduceScatterOptions()))

    def reduce_scatter_single(self, output, input, opts=None):
        pieces = list(input.reshape(-1).split(output.numel()))
        return self._collective("reduce_scatter", pieces, _copy_into([output]),
                                _reduction(opts or dist.ReduceScatterOptions()))

    # torch's functional collectives (``torch.ops._c10d_functional``: DTensor, ``fully_shard``) reach
    # a process group from C++, through the trampoline's names: these two, ``allreduce``,
    # ``broadcast`` and ``alltoall_base``. Each tensor is one collective of its own on the router.

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return _all_of([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return _all_of([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._collective("all_to_all", input_tensors, _copy_into(output_tensors))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        ins = list(input.split(list(input_split_sizes) or input.shape[0] // n))
        outs = list(output.split(list(output_split_sizes) or output.shape[0] // n))
        return self._collective("all_to_all", ins, _copy_into(outs))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        targets = output_tensors[0] if self._me == opts.rootRank else []
        return self._collective("gather", input_tensors, _copy_into(targets), root=opts.rootRank)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        parts = input_tensors[0] if self._me == opts.rootRank else []
        return self._collective("scatter", parts, _copy_into(output_tensors), root=opts.rootRank)

    def barrier(self, opts=None):
        return self._collective("barrier", [], lambda tensors: [])

    def __repr__(self) -> str:
        return f"RelayGroup(rank {self._me} of ranks {self._ranks})"


class _AllOf(dist.Work):
    """Several operations in flight as one (a coalesced call): done when every one is."""

    def __init__(self, works: list):
        super().__init__()
        self._works = works

    def wait(self, timeout=None) -> bool:
        for work in self._works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def get_future(self):
        import torch

        return torch.futures.collect_all([work.get_future() for work in self._works])


def _all_of(works: list):
    return works[0] if len(works) == 1 else _AllOf(works)


def _create(backend_options, _process_group_options=None) -> RelayGroup:
    world = int(os.environ.get("WORLD_SIZE", backend_options.group_size))
    ranks = list(backend_options.global_ranks_in_group) or list(range(world))
    return RelayGroup(backend_options.group_rank, backend_options.group_size, ranks, backend_options.group_id)


_kernels: list = []   # the torch.library registrations this process made (kept alive: dropped, they end)


def _all_gather_into_tensor_out(input, group_size, group_name, *, out):
    """``torch.ops._c10d_functional.all_gather_into_tensor_out`` in a rank on the relay: torch's
    kernel calls ``_allgather_base_`` on the group's C++ backend, which a Python group has not.
    Here a relay group gathers as :meth:`RelayGroup.all_gather_single` does (and is recorded as
    an ``all_gather``); any other group as torch's kernel would."""
    import torch

    group = dist.distributed_c10d._resolve_process_group(group_name)
    work = group.all_gather_single(out, input) if isinstance(group, RelayGroup) else group._allgather_base(out, input)
    torch._C._distributed_c10d._register_work(out, work)   # what wait_tensor(out) waits for
    return out


def _give_kernels() -> None:
    """Register :func:`_all_gather_into_tensor_out` for the CPU and CUDA tensors of this process."""
    import torch

    if not _kernels:
        library = torch.library.Library("_c10d_functional", "IMPL")
        for device in ("CPU", "CUDA"):
            library.impl("all_gather_into_tensor_out", _all_gather_into_tensor_out, device)
        _kernels.append(library)


def register() -> None:
    """Make ``"relay"`` a backend name ``torch.distributed`` knows (once per process)."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def init_process_group(timeout=None) -> None:
    """Join the world's process group on the relay (``RANK``/``WORLD_SIZE`` from the environment)."""
    import datetime

    register()
    _give_kernels()
    link()
    store = dist.HashStore()
    dist.init_process_group(NAME, store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timeout or datetime.timedelta(minutes=30))
    # The store is this process's alone: a key another rank sets never shows here. Code that
    # uses it as a mailbox between ranks then fails in seconds, naming the key, instead of
    # waiting out the run's whole time limit for a value that cannot come.
    store.set_timeout(datetime.timedelta(seconds=STORE_WAIT_S))
