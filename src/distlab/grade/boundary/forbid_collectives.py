"""Forbidden collectives: every layer of ``torch.distributed`` that can send, closed.

Chapter 2 asks for an all-reduce built from point-to-point messages, so ``all_reduce`` and
its relatives must not be reachable at all on a graded rank. A collective can be called at
three layers, and :func:`forbid_collective` closes each one:

1. **Python functions**: ``torch.distributed.all_reduce``, its twin in
   ``torch.distributed.distributed_c10d``, and the functional collective
   (``torch.distributed._functional_collectives.all_reduce``) are replaced by functions that
   raise :class:`~distlab.grade.boundary.forbid.ForbiddenError`.
2. **Objects that send**: the process group (``group.allreduce``) *and the backend under it*
   (``group._get_backend(torch.device("cpu")).allreduce``: gloo's, NCCL's, ...). A backend is
   not a ``ProcessGroup``: it is a ``torch._C._distributed_c10d.Backend``, with its own copy of
   every collective method. The methods are replaced on both classes and on every subclass
   that defines its own. (A ``Work`` object, which an async call returns, only waits for a
   collective already sent: it has nothing to close.)
3. **The dispatcher**: the process group's C++ code sends through operators such as
   ``c10d::allreduce_``, and so does every C++ road to a collective: a functional collective,
   ``torch._C._distributed_c10d._broadcast_coalesced``, DDP's reducer, an operator looked up
   afresh through ``torch._ops._OpNamespace("c10d")`` (``torch.ops.c10d``'s attributes are
   only a cache). For each such operator, a kernel that raises is registered
   (:class:`torch.library.Library`) for every device the real one serves; the real kernel
   stays in the dispatcher, hidden behind ours.

Point-to-point messages (``send``, ``recv``, ``batch_isend_irecv``) stay open unless forbidden
by name: they are what the exercise is built from.

What still gets through, said plainly: all of this lives in the rank's own Python process.
Code there can find any live object through the garbage collector (``gc.get_objects()``,
e.g. the ``Library`` that holds our kernels, and remove them) or call C functions through
``ctypes``. The grader does not trust the rank for its verdict (:mod:`.cleanroom`), and the
rank runs in an operating-system sandbox (:mod:`.bubblewrap`); but which collective a rank
used, and how many bytes it sent, are observed inside the rank.
"""

from __future__ import annotations

import importlib
import warnings

# For each collective: (methods of the process group and backend objects, dispatcher
# operators, functional collectives of the same name).
COLLECTIVES = {
    "all_reduce": (("allreduce",), ("c10d.allreduce_", "_c10d_functional.all_reduce",
                                    "_c10d_functional.all_reduce_", "_c10d_functional.all_reduce_coalesced",
                                    "_c10d_functional.all_reduce_coalesced_"),
                   ("all_reduce", "all_reduce_inplace", "all_reduce_coalesced")),
    "all_reduce_coalesced": (("allreduce_coalesced",), ("c10d.allreduce_coalesced_",), ()),
    "reduce": (("reduce",), ("c10d.reduce_",), ()),
    "broadcast": (("broadcast",), ("c10d.broadcast_", "_c10d_functional.broadcast",
                                   "_c10d_functional.broadcast_"), ("broadcast",)),
    "all_gather": (("allgather",), ("c10d.allgather_", "_c10d_functional.all_gather_into_tensor",
                                    "_c10d_functional.all_gather_into_tensor_out"),
                   ("all_gather_tensor", "all_gather_into_tensor")),
    "all_gather_into_tensor": (("_allgather_base",), ("c10d._allgather_base_",
                                                      "_c10d_functional.all_gather_into_tensor",
                                                      "_c10d_functional.all_gather_into_tensor_out"),
                               ("all_gather_tensor",)),
    "reduce_scatter": (("reduce_scatter",), ("c10d.reduce_scatter_", "_c10d_functional.reduce_scatter_tensor",
                                             "_c10d_functional.reduce_scatter_tensor_out"),
                       ("reduce_scatter_tensor",)),
    "reduce_scatter_tensor": (("_reduce_scatter_base",), ("c10d._reduce_scatter_base_",
                                                          "_c10d_functional.reduce_scatter_tensor",
                                                          "_c10d_functional.reduce_scatter_tensor_out"),
                              ("reduce_scatter_tensor",)),
    "all_to_all": (("alltoall",), ("c10d.alltoall_",), ()),
    "all_to_all_single": (("alltoall_base", "all_to_all_single"),
                          ("c10d.alltoall_base_", "_c10d_functional.all_to_all_single",
                           "_dtensor.shard_dim_alltoall"),
                          ("all_to_all_single",)),
    "gather": (("gather",), ("c10d.gather_",), ()),
    "scatter": (("scatter",), ("c10d.scatter_",), ()),
    # torch 2.13's new names for the single-tensor versions, and the coalesced methods of the
    # process group (a list of tensors in one call): other roads to the same collectives.
    "all_gather_single": (("all_gather_single",), (), ()),
    "reduce_scatter_single": (("reduce_scatter_single",), (), ()),
    "all_gather_coalesced": (("allgather_coalesced",), ("c10d.allgather_coalesced_",), ()),
    "all_gather_into_tensor_coalesced": (("allgather_into_tensor_coalesced",),
                                         ("c10d.allgather_into_tensor_coalesced_",
                                          "_c10d_functional.all_gather_into_tensor_coalesced"), ()),
    "all_gather_single_coalesced": (("all_gather_single_coalesced",), (), ()),
    "reduce_scatter_tensor_coalesced": (("reduce_scatter_tensor_coalesced",),
                                        ("c10d.reduce_scatter_tensor_coalesced_",
                                         "_c10d_functional.reduce_scatter_tensor_coalesced"), ()),
    "reduce_scatter_single_coalesced": (("reduce_scatter_single_coalesced",), (), ()),
    "send": (("send",), ("c10d.send",), ()),
    "recv": (("recv", "recv_anysource"), ("c10d.recv_", "c10d.recv_any_source_"), ()),
    "isend": (("send",), ("c10d.send",), ()),
    "irecv": (("recv", "recv_anysource"), ("c10d.recv_", "c10d.recv_any_source_"), ()),
    "barrier": (("barrier", "monitored_barrier"), ("c10d.barrier", "c10d.monitored_barrier_"), ()),
}

SAME_COLLECTIVE = {
    "all_reduce": ("all_reduce_coalesced",),
    "all_gather": ("all_gather_coalesced",),
    "all_gather_into_tensor": ("all_gather_single", "all_gather_into_tensor_coalesced",
                               "all_gather_single_coalesced"),
    "reduce_scatter_tensor": ("reduce_scatter_single", "reduce_scatter_tensor_coalesced",
                              "reduce_scatter_single_coalesced"),
}
"""Forbidding a collective forbids every other spelling of it too."""

DEVICE_KEYS = ("CPU", "CUDA", "PrivateUse1", "SparseCPU", "SparseCUDA")
"""Dispatch keys of the devices a collective's kernel serves (the ``Meta`` kernel sends nothing)."""

_libraries: dict = {}
_kernels_in_place: set[tuple[str, str]] = set()


def forbid_collective(op: str, raiser) -> None:
    """Close ``op`` (a ``torch.distributed`` name such as ``"all_reduce"``) and its spellings.

    ``raiser(label)`` makes the function that stands in for a forbidden one
    (:func:`distlab.grade.boundary.forbid.raiser`: it raises ``ForbiddenError`` naming ``label``).
    """
    for name in (op,) + SAME_COLLECTIVE.get(op, ()):
        methods, operators, functional = COLLECTIVES.get(name, ((), (), ()))
        label = f"torch.distributed.{name}"
        _replace_functions(name, functional, raiser, label)
        for method in methods:
            _replace_method(method, raiser, label)
        for operator in operators:
            _replace_operator(operator, raiser, label)


def _replace_functions(name: str, functional: tuple, raiser, label: str) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    try:  # imported before any operator is replaced: importing it looks those operators up
        fc = importlib.import_module("torch.distributed._functional_collectives")
    except ImportError:
        fc = None
    for module in (dist, c10d):
        if hasattr(module, name):
            setattr(module, name, raiser(label))
    for fname in functional:
        if fc is not None and hasattr(fc, fname):
            setattr(fc, fname, raiser(f"torch.distributed._functional_collectives.{fname} (behind {label})"))


def _replace_method(method: str, raiser, label: str) -> None:
    """On the process group's class, the backend's, and every subclass that has its own copy."""
    from torch._C._distributed_c10d import Backend, ProcessGroup

    for root in (ProcessGroup, Backend):
        for cls in [root] + _all_subclasses(root):
            if method in vars(cls) or (cls is root and hasattr(cls, method)):
                try:
                    setattr(cls, method, raiser(f"{cls.__name__}.{method} (behind {label})"))
                except (AttributeError, TypeError):
                    pass


def _replace_operator(qualified: str, raiser, label: str) -> None:
    """``torch.ops``'s cached attribute, and the operator's kernel on every device."""
    import torch

    namespace, opname = qualified.split(".")
    forbidden = raiser(f"torch.ops.{qualified} (behind {label})")
    try:
        setattr(getattr(torch.ops, namespace), opname, forbidden)
    except Exception:  # noqa: BLE001 - an operator this torch build does not have
        return
    if not torch._C._dispatch_has_kernel(f"{namespace}::{opname}"):
        return
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
    with warnings.catch_warnings():  # "... other operators may also be overridden": that is the point
        warnings.simplefilter("ignore")
        for key in DEVICE_KEYS:
            if (qualified, key) in _kernels_in_place:
                continue
            try:
                library.impl(opname, forbidden, key)
                _kernels_in_place.add((qualified, key))
            except Exception:  # noqa: BLE001 - a device this build does not know
                continue


def _all_subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found
