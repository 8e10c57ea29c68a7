"""How many bytes a distributed call sends and receives: the rules :mod:`distlab.tools.comm` counts by.

How bytes are counted (``S`` = bytes of the tensor(s) named, ``N`` = ranks in the group).
Point-to-point calls are counted exactly. For collectives, torch's backends choose their
own algorithms, so we count what this rank sends and receives under the standard
bandwidth-optimal algorithms: the same convention as the "bus bandwidth" of NCCL's tests.

==========================================  ==========================  ==========================
op                                          sent by this rank           received by this rank
==========================================  ==========================  ==========================
send / isend                                S                           0
recv / irecv                                0                           S
batch_isend_irecv                           sum over its sends          sum over its receives
broadcast                                   S on the source, else 0     0 on the source, else S
reduce                                      0 on the root, else S       S on the root, else 0
all_reduce                                  2(N-1)/N * S                2(N-1)/N * S
reduce_scatter(_tensor) (S = output)        (N-1) * S                   (N-1) * S
all_gather(_into_tensor) (S = input)        (N-1) * S                   (N-1) * S
all_to_all(_single)                         input chunks for others     output chunks from others
gather (S = one rank's tensor)              S, or 0 on the root         (N-1) * S on the root
scatter (S = one rank's tensor)             (N-1) * S on the source     S, or 0 on the source
barrier / monitored_barrier                 0                           0
*_object(_list)                             as the tensor twin, with S = pickled size of the objects
==========================================  ==========================  ==========================

Fractions are rounded down to whole bytes.
"""

from __future__ import annotations

import pickle


def all_reduce_bytes(nbytes, n: int):
    """Bytes one rank sends (and receives) in a bandwidth-optimal all-reduce of ``nbytes`` over
    ``n`` ranks: ``2 (n-1)/n * nbytes``, rounded down (an integer for integer ``nbytes``).

    A ring all-reduce is a reduce-scatter and an all-gather, each sending ``(n-1)/n`` of the
    tensor (chapter 2): the least any all-reduce can send, and the bytes every count, check and
    estimate in distlab uses.
    """
    return 2 * (n - 1) * nbytes // n


def _nbytes(t) -> int:
    """Bytes of a tensor (0 for anything else). Duck-typed: this module needs no torch."""
    return t.numel() * t.element_size() if hasattr(t, "element_size") else 0


def _pickled(obj) -> int:
    try:
        return len(pickle.dumps(obj))
    except Exception:
        return 0


def _is_root(a, key, rank) -> bool:
    """Is ``rank`` (this rank's index in the group) the root named by ``key`` (src or dst)?"""
    return a["_root_in_group"] == rank


def _all_to_all_single(a, n, rank):
    def others(t, splits):
        if splits is None:
            return _nbytes(t) * (n - 1) // n
        row = _nbytes(t) // max(1, t.shape[0])
        return row * (sum(splits) - splits[rank])
    return others(a["input"], a.get("input_split_sizes")), others(a["output"], a.get("output_split_sizes"))


def _p2p_batch(a, n, rank):
    sends = [op for op in a["p2p_op_list"] if op.op.__name__ == "isend"]
    recvs = [op for op in a["p2p_op_list"] if op.op.__name__ == "irecv"]
    return sum(_nbytes(op.tensor) for op in sends), sum(_nbytes(op.tensor) for op in recvs)


RULES = {
    "send": lambda a, n, r: (_nbytes(a["tensor"]), 0),
    "isend": lambda a, n, r: (_nbytes(a["tensor"]), 0),
    "recv": lambda a, n, r: (0, _nbytes(a["tensor"])),
    "irecv": lambda a, n, r: (0, _nbytes(a["tensor"])),
    "batch_isend_irecv": _p2p_batch,
    "broadcast": lambda a, n, r: (_nbytes(a["tensor"]), 0) if _is_root(a, "src", r) else (0, _nbytes(a["tensor"])),
    "reduce": lambda a, n, r: (0, _nbytes(a["tensor"])) if _is_root(a, "dst", r) else (_nbytes(a["tensor"]), 0),
    "all_reduce": lambda a, n, r: (all_reduce_bytes(_nbytes(a["tensor"]), n),) * 2,
    "all_reduce_coalesced": lambda a, n, r: (all_reduce_bytes(sum(map(_nbytes, a["tensors"])), n),) * 2,
    "reduce_scatter": lambda a, n, r: ((n - 1) * _nbytes(a["output"]),) * 2,
    "reduce_scatter_tensor": lambda a, n, r: ((n - 1) * _nbytes(a["output"]),) * 2,
    "reduce_scatter_single": lambda a, n, r: ((n - 1) * _nbytes(a["output"]),) * 2,
    "all_gather": lambda a, n, r: ((n - 1) * _nbytes(a["tensor"]),) * 2,
    "all_gather_into_tensor": lambda a, n, r: ((n - 1) * _nbytes(a["input_tensor"]),) * 2,
    "all_gather_single": lambda a, n, r: ((n - 1) * _nbytes(a["input_tensor"]),) * 2,
    "all_to_all": lambda a, n, r: (
        sum(_nbytes(t) for i, t in enumerate(a["input_tensor_list"]) if i != r),
        sum(_nbytes(t) for i, t in enumerate(a["output_tensor_list"]) if i != r)),
    "all_to_all_single": _all_to_all_single,
    "gather": lambda a, n, r: (0, (n - 1) * _nbytes(a["tensor"])) if _is_root(a, "dst", r) else (_nbytes(a["tensor"]), 0),
    "scatter": lambda a, n, r: ((n - 1) * _nbytes(a["tensor"]), 0) if _is_root(a, "src", r) else (0, _nbytes(a["tensor"])),
    "barrier": lambda a, n, r: (0, 0),
    "monitored_barrier": lambda a, n, r: (0, 0),
    # Object collectives: bytes are measured after the call, when every list is filled in.
    "broadcast_object_list": lambda a, n, r: (_pickled(a["object_list"]), 0) if _is_root(a, "src", r) else (0, _pickled(a["object_list"])),
    "all_gather_object": lambda a, n, r: ((n - 1) * _pickled(a["obj"]), sum(_pickled(o) for i, o in enumerate(a["object_list"]) if i != r)),
    "gather_object": lambda a, n, r: (0, sum(_pickled(o) for i, o in enumerate(a["object_gather_list"] or []) if i != r)) if _is_root(a, "dst", r) else (_pickled(a["obj"]), 0),
    "scatter_object_list": lambda a, n, r: (sum(_pickled(o) for i, o in enumerate(a["scatter_object_input_list"] or []) if i != r), 0) if _is_root(a, "src", r) else (0, _pickled(a["scatter_object_output_list"])),
    "send_object_list": lambda a, n, r: (_pickled(a["object_list"]), 0),
    "recv_object_list": lambda a, n, r: (0, _pickled(a["object_list"])),
}
P2P_PEER = {"send": "dst", "isend": "dst", "send_object_list": "dst",
             "recv": "src", "irecv": "src", "recv_object_list": "src"}
ROOTED = {"broadcast": "src", "reduce": "dst", "gather": "dst", "scatter": "src",
           "broadcast_object_list": "src", "gather_object": "dst", "scatter_object_list": "src"}
