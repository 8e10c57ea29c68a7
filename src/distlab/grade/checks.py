"""What the exercise tests assert: values, gradients, bytes on the wire, memory, forbidden APIs.

Every check raises :class:`CheckFailed` (an ``AssertionError``) with a message that says
what was wrong *about the student's result* (which parameter, which rank, how far off, the
tolerance) but never prints the reference values themselves: the messages end up in the
feedback students receive, and hidden tests must stay hidden.

Tolerances, and why they are what they are
-------------------------------------------
Floating-point addition is not associative. A sum over ranks computed in another order (a
ring all-reduce, a tree, a single process adding a full batch) gives a slightly different
float32 result, never a bitwise-equal one. For a sum of ``n`` float32 terms the rounding
error is at most about ``(n - 1) * eps * sum(|terms|)`` with ``eps = 2**-24 ≈ 6e-8``. Measured
on this course's CPUs: data-parallel gradients differ from the single-process full-batch
gradients by about ``1e-8`` absolute (gradients of order ``1e-2 .. 1``), and are bitwise
identical run to run at a fixed world size. Hence:

* :data:`VALUE_RTOL`, :data:`VALUE_ATOL_SCALE` for reduced values (a mean over ranks):
  ``atol = 1e-6 * max|reference|``: with 4 ranks the bound above is ``3 * 6e-8 ≈ 2e-7``
  relative, so the tolerance leaves a 5x margin, while any real bug (a sum instead of a
  mean, a missing rank) is off by tens of percent. The bound scales with the *terms*, not
  the result: where a sum can cancel (random inputs of both signs), pass ``scale=`` the
  size of the terms to :func:`assert_tensor_close`, or a near-zero result fails spuriously.
* :data:`GRAD_RTOL`, :data:`GRAD_ATOL_SCALE` for gradients: ``atol = 1e-5 * max|reference|``.
  Measured on chapter 3's transformer (largest gradient ``1.4e-2``), averaging on 2 or 4 ranks
  differs from one process by at most ``6.5e-9``, ``4.5e-7`` of the largest gradient: the
  tolerance is about 20x that, room for another machine's order of additions, and still
  orders of magnitude below forgetting to average one parameter or dividing by the wrong
  world size (off by a sizeable fraction of the gradient itself).
* After optimizer steps use :func:`optimizer_tolerance`: SGD moves a parameter by
  ``lr * grad``, so a gradient error ``δ`` becomes a parameter error ``lr * δ`` per step; Adam
  divides by ``sqrt(v)``, which turns a ``1e-8`` gradient difference on a near-zero gradient
  into a step difference of up to ``lr`` (measured: ``5e-4`` at ``lr = 1e-2``). So compare
  gradients tightly, and trajectories with SGD, or with Adam at a tolerance of ``steps * lr``.

Communication and memory are *counted*, not timed: the counts are exact (see
:mod:`distlab.tools.comm_bytes` for the counting rules), so their default margin is zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distlab.grade.boundary import seed
from distlab.grade.boundary.forbid import ForbiddenError, forbid  # noqa: F401 - part of this module's API
from distlab.grade.failures import CheckFailed, Failures  # noqa: F401 - part of this module's API
from distlab.grade.references import using_references  # noqa: F401 - part of this module's API
from distlab.grade.relay_checks import (  # noqa: F401 - part of this module's API
    assert_relay_bytes,
    assert_relay_calls,
    assert_relay_collectives,
    assert_relay_groups,
    assert_ring,
)
from distlab.tools.comm_bytes import all_reduce_bytes  # noqa: F401 - part of this module's API

VALUE_RTOL = 1e-6
VALUE_ATOL_SCALE = 1e-6
GRAD_RTOL = 1e-5
GRAD_ATOL_SCALE = 1e-5


def grading_seed() -> int:
    """The seed hidden tests draw their inputs from: fixed in a student's notebook, so runs are
    reproducible; fresh for every submission when graded, chosen by the clean room outside the
    student's reach (:mod:`distlab.grade.boundary.seed`), so values read from a test file are of no use."""
    return seed.current()


def generator(offset: int = 0):
    """A ``torch.Generator`` seeded from :func:`grading_seed` (plus ``offset``) for test inputs."""
    import torch

    return torch.Generator().manual_seed(grading_seed() + offset)


# -- running the student's function on N ranks --------------------------------------------------

class RankLogs(list):
    """Per rank, the distributed calls it recorded (``{"op", "sent", "received", "group_size"}``
    each), and in ``.wire`` what the operating system counted on the wire for the whole run
    (:class:`distlab.grade.boundary.wire.Measured`; its ``sent`` is None where that is not metered)."""

    def __init__(self, logs=(), wire=None):
        super().__init__(logs)
        self.wire = wire


class RankResults(list):
    """Per-rank results, and in ``.record`` what the grader's network saw the run send (a
    :class:`distlab.relay.record.Record`; None for a run that was not on the relay), in ``.wire``
    what the operating system counted on the loopback (:class:`distlab.grade.boundary.wire.Measured`)."""

    def __init__(self, results=(), record=None, wire=None):
        super().__init__(results)
        self.record, self.wire = record, wire


@dataclass
class RankRun:
    """What :func:`run_ranks` returns: per-rank results and per-rank communication logs."""

    results: list
    comm: list = field(default_factory=RankLogs)


def _call_on_rank(call: bytes, per_rank_args, forbidden):
    import torch.distributed as dist

    from distlab.runtime import serialize
    from distlab.tools import comm

    if forbidden:
        forbid(*forbidden)
    # Unpickled only now, after forbid: unpickling looks up every class and function the
    # student's code refers to, and a lookup made earlier would hand it the real one.
    fn, args, kwargs = serialize.loads(call)
    rank = dist.get_rank()
    call_args = tuple(per_rank_args[rank]) if per_rank_args is not None else args
    with comm.record() as log:
        result = fn(*call_args, **kwargs)
    calls = [{"op": c.op, "sent": int(c.sent), "received": int(c.received),
              "group_size": int(c.group_size)} for c in log]
    return result, calls


def run_ranks(fn, nprocs: int, per_rank_args=None, args=(), kwargs=None, timeout: float = 60,
              forbidden=(), network: str | None = None) -> RankRun:
    """Run ``fn`` on ``nprocs`` ranks, recording every ``torch.distributed`` call it makes.

    ``per_rank_args[r]`` (a tuple) are rank ``r``'s arguments; otherwise every rank gets
    ``args``. ``forbidden`` names APIs that raise "not allowed in this exercise" while ``fn``
    runs (see :func:`distlab.grade.boundary.forbid.forbid`). ``network="relay"``: the ranks talk only
    through the grader's relay (:mod:`distlab.relay`), in the student's kernel as in the
    grader, and ``results.record`` holds what it saw them send (:func:`assert_ring`,
    :func:`assert_relay_bytes`, :func:`assert_relay_calls` check it).
    """
    from distlab.grade.boundary import wire
    from distlab.relay import record
    from distlab.runtime import run, serialize

    if per_rank_args is not None and len(per_rank_args) != nprocs:
        raise ValueError(f"per_rank_args has {len(per_rank_args)} entries for {nprocs} ranks")
    call = serialize.dumps_call(fn, tuple(args), dict(kwargs or {}))  # unpickled on the rank after forbid
    if network not in (None, "relay"):
        raise ValueError(f"network must be None or 'relay', got {network!r}")
    with wire.measure(nprocs) as measured, record.capture() as seen:   # counted outside the ranks
        pairs = run.run(_call_on_rank, call, per_rank_args, list(forbidden), nprocs=nprocs, timeout=timeout,
                        backend=network)
    results = RankResults([p[0] for p in pairs], seen if network == "relay" else None, measured)
    return RankRun(results=results, comm=RankLogs([p[1] for p in pairs], wire=measured))


# -- values and gradients -------------------------------------------------------------------------

def _as_tensor(value, name):
    import torch

    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{name} should be a torch.Tensor, got {type(value).__name__}")
    return value


def assert_tensor_close(actual, expected, name: str = "the result", rtol: float = VALUE_RTOL,
                        atol: float | None = None, atol_scale: float = VALUE_ATOL_SCALE,
                        scale: float | None = None) -> None:
    """``actual`` has ``expected``'s shape and dtype and is within tolerance of it.

    ``atol`` defaults to ``atol_scale * max(max|expected|, scale)``. Pass ``scale`` (the largest
    ``|term|`` that was added up, e.g. ``max |input|`` times the number of ranks) whenever
    the result is a sum that can cancel: the rounding error of a sum scales with its terms,
    not with its result (a sum of ``±0.3`` terms that comes to ``0.007`` still carries errors of
    order ``eps * 0.3``). The message names the worst element, its absolute and relative error
    and the tolerance.
    """
    import torch

    actual = _as_tensor(actual, name)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{name} has shape {tuple(actual.shape)}, expected shape {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{name} has dtype {actual.dtype}, expected {expected.dtype}")
    if atol is None:
        largest = expected.abs().max().item() if expected.numel() else 0.0
        atol = atol_scale * max(largest, scale or 0.0, 1e-12)
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all():
        bad = (~torch.isfinite(a)).nonzero()[0].tolist()
        raise CheckFailed(f"{name} contains NaN or inf (first at index {tuple(bad)})")
    diff = (a - e).abs()
    allowed = atol + rtol * e.abs()
    if (diff > allowed).any():
        worst = int(torch.argmax(diff - allowed))
        index = tuple(torch.unravel_index(torch.tensor(worst), tuple(a.shape))) if a.dim() else ()
        index = tuple(int(i) for i in index)
        max_abs = diff.max().item()
        rel = (diff / e.abs().clamp_min(1e-30)).max().item()
        raise CheckFailed(
            f"{name} is off: max abs error {max_abs:.3g} (worst at index {index}), max rel error "
            f"{rel:.3g}; tolerance atol={atol:.3g} + rtol={rtol:.3g} * |expected|")


def assert_gradients_match(per_rank: list[dict], reference: dict, rtol: float = GRAD_RTOL,
                           atol_scale: float = GRAD_ATOL_SCALE, what: str = "gradient") -> None:
    """Every rank's ``{parameter name: gradient}`` matches the single-process reference.

    ``reference`` comes from the plain single-process model on the full batch. For a sharded
    parameter, pass the rank's shard and the matching slice of the reference. The message
    names the parameter, the rank, the max abs and rel error and the tolerance.
    """
    for rank, grads in enumerate(per_rank):
        if not isinstance(grads, dict):
            raise CheckFailed(f"rank {rank} returned {type(grads).__name__}, expected a dict of {what}s")
        missing = sorted(set(reference) - set(grads))
        if missing:
            raise CheckFailed(f"rank {rank}: no {what} for parameter(s) {', '.join(missing)}")
        for name in reference:
            if grads[name] is None:
                raise CheckFailed(f"rank {rank}: the {what} of parameter `{name}` is None")
            assert_tensor_close(grads[name], reference[name], name=f"the {what} of `{name}` on rank {rank}",
                                rtol=rtol, atol_scale=atol_scale)


def optimizer_tolerance(optimizer: str, lr: float, steps: int, grad_atol: float = 1e-7) -> float:
    """Absolute tolerance for parameters after ``steps`` optimizer steps (see the module docstring).

    SGD: each step adds at most ``lr * grad_atol``. Adam/AdamW: each step may differ by up to
    ``lr`` where a gradient is near zero, so the bound is ``steps * lr``.
    """
    optimizer = optimizer.lower()
    if optimizer == "sgd":
        return steps * lr * grad_atol + 1e-7
    if optimizer in ("adam", "adamw"):
        return steps * lr
    raise ValueError(f"optimizer must be 'sgd', 'adam' or 'adamw', got {optimizer!r}")


def assert_params_match(per_rank: list[dict], reference: dict, atol: float, what: str = "") -> None:
    """Parameters after training on every rank match the single-process run within ``atol``.

    ``what`` names the case in the message (``"gpt model, 4 ranks: "`` ...)."""
    case = f"{what}: " if what else ""
    for rank, params in enumerate(per_rank):
        for name, ref in reference.items():
            if name not in params:
                raise CheckFailed(f"{case}rank {rank}: parameter `{name}` missing")
            assert_tensor_close(params[name], ref, name=f"{case}parameter `{name}` on rank {rank}", rtol=0.0,
                                atol=atol)


# -- communication ------------------------------------------------------------------------------

def _calls(log) -> list[dict]:
    out = []
    for c in log:
        if isinstance(c, dict):
            out.append(c)
        else:  # a distlab.tools.comm.Call
            out.append({"op": c.op, "sent": c.sent, "received": c.received, "group_size": c.group_size})
    return out


def assert_comm(per_rank_logs: list, calls: dict | None = None, max_calls: int | None = None,
                max_bytes_sent: int | None = None, margin: float = 0.0) -> None:
    """Assert on the distributed calls each rank made (logs from :func:`run_ranks` or :mod:`distlab.tools.comm`).

    Args:
        calls: exact ``{op: number of calls}`` per rank, e.g. ``{"all_reduce": 1}``.
        max_calls: at most this many distributed calls per rank, whatever the ops.
        max_bytes_sent: per rank, at most this many bytes sent (a theory value, e.g. from
            :func:`all_reduce_bytes`), times ``1 + margin``. Bytes are counted by rule, not
            measured, so ``margin=0`` is right unless the theory is approximate. When grading,
            the logs of :func:`run_ranks` also carry the bytes the operating system saw on
            the wire, which must fit the same limit (:mod:`distlab.grade.boundary.wire`): a rank that
            sends around the recorder, or edits what it recorded, fails here.
    """
    for rank, log in enumerate(per_rank_logs):
        made = _calls(log)
        counts: dict[str, int] = {}
        for c in made:
            counts[c["op"]] = counts.get(c["op"], 0) + 1
        seen = ", ".join(f"{op} x{n}" for op, n in counts.items()) or "none"
        if calls is not None and counts != dict(calls):
            want = ", ".join(f"{op} x{n}" for op, n in calls.items())
            raise CheckFailed(f"rank {rank} made these distributed calls: {seen}; the exercise asks for {want}")
        if max_calls is not None and len(made) > max_calls:
            raise CheckFailed(f"rank {rank} made {len(made)} distributed calls ({seen}); at most {max_calls} allowed")
        if max_bytes_sent is not None:
            sent = sum(c["sent"] for c in made)
            limit = math.floor(max_bytes_sent * (1 + margin))
            if sent > limit:
                raise CheckFailed(f"rank {rank} sent {sent} bytes ({seen}); the most this needs is "
                                  f"{max_bytes_sent} bytes (margin {margin:.0%})")
    measured = getattr(per_rank_logs, "wire", None)
    if max_bytes_sent is not None and measured is not None and measured.sent is not None:
        recorded = sum(c["sent"] for log in per_rank_logs for c in _calls(log))
        calls = max((len(_calls(log)) for log in per_rank_logs), default=0)
        allowed = measured.allowed(max_bytes_sent * (1 + margin), calls)
        if measured.sent > allowed:
            raise CheckFailed(
                f"the ranks put {measured.sent} bytes on the network (counted by the operating system, "
                f"outside the ranks), more than {allowed}: {measured.nprocs} ranks sending at most "
                f"{max_bytes_sent} bytes each, with room for headers and hand-shakes. The ranks' own record "
                f"says {recorded} bytes in all: something was sent around the recorder, or the record was changed")


# -- memory -------------------------------------------------------------------------------------

def assert_memory(per_rank: list[dict], theory: dict, margin: float = 0.0) -> None:
    """Each rank's counted bytes (:func:`distlab.tools.memory.model_state_bytes`) are at most
    ``theory[kind] * (1 + margin)`` for every kind given (:func:`distlab.zero.theory.model_state_theory`)."""
    for rank, counted in enumerate(per_rank):
        for kind, expected in theory.items():
            have = counted.get(kind, 0)
            if have > expected * (1 + margin):
                raise CheckFailed(f"rank {rank} holds {have} bytes of {kind}; the theory allows {expected} "
                                  f"bytes (margin {margin:.0%})")


def assert_rank_ids(results: list) -> None:
    """Each rank returned its own id as a plain ``int``."""
    for rank, value in enumerate(results):
        if type(value) is not int:  # noqa: E721 - bool and tensors are not ints here
            raise CheckFailed(f"rank {rank} returned {type(value).__name__}; return a plain int (use int(...))")
        if value != rank:
            raise CheckFailed(f"rank {rank} returned {value}, not its own rank id")


# -- concept questions ---------------------------------------------------------------------------

def check_choice(name: str, answer, correct: str, revisit: dict[str, str]) -> None:
    """A multiple-choice answer against the letter the hidden test worked out.

    ``revisit``: for each wrong letter, what that option gets wrong and where the book treats
    it; the student reads it in the feedback (a :class:`CheckFailed` message is shown, a plain
    hidden ``assert`` only as "a hidden test failed"), so it must explain, not reveal.
    """
    if answer != correct:
        raise CheckFailed(f"{name} = {answer!r} is not the right option. {revisit.get(answer, '')}".rstrip())


def check_number(name: str, value, expected: float, rel: float, revisit: str) -> None:
    """A numeric answer within ``rel`` (relative) of the value the hidden test computed."""
    if not isinstance(value, (int, float)) or not math.isclose(value, expected, rel_tol=rel, abs_tol=1e-12):
        raise CheckFailed(f"{name} = {value!r} is not right. {revisit}")
