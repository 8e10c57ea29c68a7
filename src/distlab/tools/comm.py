"""Record every ``torch.distributed`` call a rank makes: which op, how many bytes, how long.

Use it inside a rank::

    from distlab.tools import comm

    def step():
        with comm.record() as log:
            dist.all_reduce(torch.ones(1024))
        return log                      # travels back to the notebook

    logs = distlab.run(step, nprocs=4)
    print(logs[0].summary())            # all_reduce  1 call  sent 6.0 KiB  received 6.0 KiB

How it works: :func:`install` replaces each public function of ``torch.distributed``
(``all_reduce``, ``send``, ``isend``, ...) by a thin wrapper that notes the call, runs the
original and notes the time it took. The wrapper is installed on both
``torch.distributed`` and ``torch.distributed.distributed_c10d``; when one recorded function
calls another (``broadcast_object_list`` calls ``broadcast``), only the outer call is logged.
distlab's worker installs it on every rank before your function runs, which is also how a
:class:`distlab.DistTimeout` can tell which call each rank is stuck in.

What is *not* seen: collectives that torch's C++ code issues without going through these
Python functions, notably the gradient all-reduces of ``DistributedDataParallel`` (its C++
reducer) and DTensor's functional collectives (use
``torch.distributed.tensor.debug.CommDebugMode`` for those).

How many bytes each call sends and receives is decided by the rules of
:mod:`distlab.tools.comm_bytes`.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distlab.tools import comm_bytes
from distlab.tools.memory import human


@dataclass
class Call:
    """One recorded distributed call on this rank."""

    op: str
    sent: int = 0                 # bytes this rank sends (see the table above)
    received: int = 0             # bytes this rank receives
    group_size: int = 1
    peer: int | None = None       # the other rank of a p2p call, or the root of a rooted collective
    shape: tuple | None = None    # shape of the (first) tensor involved
    dtype: str | None = None
    async_op: bool = False
    start: float = 0.0            # time.time() when the call began
    duration: float | None = None  # seconds until it finished (async ops: until the work completed,
    #                                or, for works without a future, until wait() returned)
    note: str | None = None       # a description that replaces the generated one

    def describe(self) -> str:
        """A short human description, e.g. ``recv(float32[4], from rank 1, group of 2)``."""
        if self.note:
            return self.note
        parts = []
        if self.shape is not None:
            parts.append(f"{self.dtype}[{', '.join(map(str, self.shape))}]")
        if self.peer is not None:
            if self.op in ("send", "isend", "send_object_list"):
                parts.append(f"to rank {self.peer}")
            elif self.op in ("recv", "irecv", "recv_object_list"):
                parts.append(f"from rank {self.peer}")
            else:
                parts.append(f"root {self.peer}")
        parts.append(f"group of {self.group_size}")
        return f"{self.op}({', '.join(parts)})"


class CommLog(list):
    """The calls recorded by :func:`record`, in order, with a few summaries."""

    def counts(self) -> Counter:
        """``{op: number of calls}``."""
        return Counter(call.op for call in self)

    def bytes_sent(self, op: str | None = None) -> int:
        return sum(c.sent for c in self if op is None or c.op == op)

    def bytes_received(self, op: str | None = None) -> int:
        return sum(c.received for c in self if op is None or c.op == op)

    def summary(self) -> str:
        """A small table: calls, bytes sent and received, per op."""
        rows = ["op                        calls        sent    received"]
        for op, n in self.counts().items():
            rows.append(f"{op:<24}{n:>7}  {human(self.bytes_sent(op)):>10}  {human(self.bytes_received(op)):>10}")
        return "\n".join(rows)


def _root(a, key):
    value = a.get(key)
    return value if value is not None else a.get(f"group_{key}")


def _first_tensor(a):
    for value in a.values():
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


# ---------------------------------------------------------------------------------------------
# The wrappers and the state they share.

_local = threading.local()        # .depth: nesting level of recorded calls on this thread
_recorders: list[CommLog] = []    # active `record()` logs (innermost last)
_pending_async: list[Call] = []   # async calls launched and not finished yet
_raised: list[Call] = []          # distributed calls that raised instead of finishing
_observer = None                  # callback(event, call) used by the worker for diagnostics
_originals: dict[str, object] = {}
_installed = False


def original(op: str):
    """The unwrapped ``torch.distributed`` function (for distlab's own bookkeeping calls)."""
    return _originals.get(op) or getattr(c10d, op)


def current_call() -> Call | None:
    """The outermost distributed call this thread is inside right now, if any."""
    return getattr(_local, "current", None)


def pending_async() -> list[Call]:
    """Async calls that were launched and have not completed yet."""
    return list(_pending_async)


def calls_that_raised() -> list[Call]:
    """Distributed calls that raised (a peer vanished, shapes differed, a timeout) since the last
    :func:`forget_pending`: after one of those, the process group's state is unknown."""
    return list(_raised)


def forget_pending() -> None:
    """Forget async calls and open recorders left by a finished call (a pool's next call starts clean)."""
    _pending_async.clear()
    _raised.clear()
    _waiting_for.clear()
    _recorders.clear()


def set_observer(callback) -> None:
    """Call ``callback(event, call)`` with ``event`` in ``{"enter", "exit"}`` around every recorded call."""
    global _observer
    _observer = callback


def _notify(event, call):
    if _observer is not None:
        try:
            _observer(event, call)
        except Exception:
            pass


def _describe_call(op, signature, args, kwargs) -> tuple[Call, dict]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    group = a.get("group")
    if group is None and op == "batch_isend_irecv" and a["p2p_op_list"]:
        group = a["p2p_op_list"][0].group
    n = dist.get_world_size(group)
    tensor = _first_tensor(a)
    peer_key = comm_bytes.P2P_PEER.get(op) or comm_bytes.ROOTED.get(op)
    if op in comm_bytes.ROOTED:  # roots are global ranks (src=) or ranks within the group (group_src=)
        key = comm_bytes.ROOTED[op]
        if a.get(key) is not None:
            a["_root_in_group"] = dist.get_group_rank(group, a[key]) if group is not None else a[key]
        else:
            a["_root_in_group"] = a.get(f"group_{key}")
    call = Call(
        op=op, group_size=n,
        peer=_root(a, peer_key) if peer_key else None,
        shape=tuple(tensor.shape) if tensor is not None else None,
        dtype=str(tensor.dtype).replace("torch.", "") if tensor is not None else None,
        async_op=bool(a.get("async_op")) or op in ("isend", "irecv", "batch_isend_irecv"),
        start=time.time(),
    )
    return call, a


_waiting_for: dict[int, Call] = {}  # id(Work) -> its call, for works without a future


def _finished(call: Call) -> None:
    if call.duration is None:
        call.duration = time.time() - call.start
    if call in _pending_async:
        _pending_async.remove(call)


def _track_completion(call: Call, result) -> None:
    """Note when an async call's work completes: by its future, else when ``wait()`` returns."""
    works = [w for w in (result if isinstance(result, list) else [result]) if w is not None]
    if not works:
        _finished(call)
        return
    _pending_async.append(call)
    remaining = [len(works)]
    lock = threading.Lock()

    def one_done(_=None):
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                _finished(call)

    for work in works:
        try:
            work.get_future().add_done_callback(one_done)
        except Exception:  # gloo's point-to-point works have no future
            _waiting_for[id(work)] = (call, one_done)


def _wrap(op: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def recorded(*args, **kwargs):
        depth = getattr(_local, "depth", 0)
        if depth > 0 or not dist.is_initialized():
            return original(*args, **kwargs)
        call, a = _describe_call(op, signature, args, kwargs)
        _local.depth, _local.current = 1, call
        _notify("enter", call)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _raised.append(call)
            raise
        finally:
            _local.depth, _local.current = 0, None
        if call.async_op:
            _track_completion(call, result)
        else:
            call.duration = time.time() - call.start
        n, rank = call.group_size, dist.get_rank(a.get("group"))
        call.sent, call.received = comm_bytes.RULES[op](a, n, rank)
        for log in _recorders:
            log.append(call)
        _notify("exit", call)
        return result

    recorded.__distlab_original__ = original
    return recorded


def _wrap_wait(original):
    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        entry = _waiting_for.pop(id(self), None)
        waited_for = entry[0].describe() if entry else ", ".join(c.describe() for c in _pending_async[:3])
        call = Call(op="Work.wait", start=time.time(), note=f"Work.wait() for {waited_for or 'an async op'}")
        outer = getattr(_local, "current", None) is None
        if outer:
            _local.current = call
            _notify("enter", call)
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            _raised.append(call)
            raise
        finally:
            if entry:
                entry[1]()
            if outer:
                _local.current = None
                _notify("exit", call)
    wait.__distlab_original__ = original
    return wait


def install() -> None:
    """Wrap torch.distributed's functions (once per process; later calls do nothing)."""
    global _installed
    if _installed:
        return
    for op in comm_bytes.RULES:
        original = getattr(c10d, op, None)
        if original is None:  # not in this torch version
            continue
        _originals[op] = original
        wrapper = _wrap(op, original)
        setattr(c10d, op, wrapper)
        if getattr(dist, op, None) is original:
            setattr(dist, op, wrapper)
    _originals["Work.wait"] = dist.Work.wait
    dist.Work.wait = _wrap_wait(dist.Work.wait)
    _installed = True


@contextmanager
def record():
    """Record the distributed calls made inside the ``with`` block into a :class:`CommLog`.

    Async calls are logged when launched; their ``duration`` is filled in when they complete.
    """
    install()
    log = CommLog()
    _recorders.append(log)
    try:
        yield log
    finally:
        # By identity: logs are lists, and two nested logs with the same calls compare equal.
        _recorders[:] = [other for other in _recorders if other is not log]
