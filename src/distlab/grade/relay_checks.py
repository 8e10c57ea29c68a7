"""Checks on what the grader's network saw: the exercises' communication rules, as facts.

A run made with ``checks.run_ranks(..., network="relay")`` goes through the relay
(:mod:`distlab.relay`): its results carry ``.record``, every message and collective the ranks
sent, written down by the router outside the ranks. The checks here read that record, never
the ranks' own (:mod:`distlab.tools.comm`, which a rank's code can reach around or edit):

* :func:`assert_ring`: chapter 2's rule, a ring (only to the right neighbour, ``N-1`` chunk-sized
  messages per pass, no built-in collective), and nothing on the loopback besides (see
  :func:`assert_quiet_loopback`);
* :func:`assert_relay_bytes`: a byte limit per rank (chapter 0), counted exactly, so with no
  allowance at all;
* :func:`assert_relay_calls`: the collectives each rank called, in order, with their sizes
  (chapter 3's buckets);
* :func:`assert_relay_silent`: nothing at all went through it (chapter 1's sampler, which
  each rank computes alone);
* :func:`assert_pipeline_messages`: chapter 6's schedules (activations to the next stage only,
  gradients to the previous one only, one per micro-batch, of its size, no collective), and
  :func:`assert_few_all_reduces` its bubble task (all-reduces of a few numbers only);
* :func:`assert_kv_ring`: chapter 8's ring attention (key/value blocks to the right neighbour
  only, step by step exactly the bytes of
  :func:`distlab.context_parallel.ring.ring_bytes_per_step`, no collective).

The checks on the record are exact (no allowance): a byte more or less fails them.

All raise :class:`~distlab.grade.failures.CheckFailed` with a message a student may read. A run
that was not on the relay fails them too: a test that forgot ``network="relay"`` must not pass
by default.
"""

from __future__ import annotations

from distlab.grade.failures import CheckFailed
from distlab.relay import record as relay_record

QUIET_BYTES_PER_RANK = 2 * 1024
"""What the loopback may carry per rank during a run on the relay, which uses none of it: room
for stray packets, and for idle gloo pools of the same notebook (besides
:data:`distlab.grade.boundary.wire.PER_SECOND_BYTES` per rank per second). A gloo process group of the
ranks' own costs more than this in hand-shakes alone (a store: 9 to 10 KB per rank)."""


def record_of(results) -> relay_record.Record:
    """The relay's record of a run (the ``results`` of :func:`distlab.grade.checks.run_ranks`)."""
    seen = getattr(results, "record", None)
    if seen is None:
        raise CheckFailed("this run was not on the grader's network: run it with run_ranks(..., network='relay')")
    return seen


def assert_ring(results, n: int, cases: list[tuple], what: str = "a ring") -> None:
    """Every rank's messages, case by case, are a ring's (see :func:`distlab.relay.record.check_ring`):
    ``cases`` is ``(numel, itemsize, passes)`` per case, in the order the run made them."""
    try:
        relay_record.check_ring(record_of(results), n, cases, what)
    except relay_record.RecordMismatch as exc:
        raise CheckFailed(str(exc)) from None
    assert_quiet_loopback(results, n)


def assert_quiet_loopback(results, n: int) -> None:
    """While the ranks ran on the relay, the sandbox's loopback stayed (almost) silent.

    The relay uses descriptors, not the network: bytes on the loopback (counted by the
    operating system, :mod:`distlab.grade.boundary.wire`, where the grader meters it) are a channel the
    grader does not own, such as a gloo process group on a store of the ranks' own. Where the
    loopback is not metered (a student's kernel), there is nothing to check. Once each graded
    rank has a network of its own (none), no such channel is left at all.
    """
    from distlab.grade.boundary import wire

    measured = getattr(results, "wire", None)
    if measured is None or measured.sent is None:
        return
    allowed = int(n * (QUIET_BYTES_PER_RANK + wire.PER_SECOND_BYTES * measured.seconds))
    if measured.sent > allowed:
        raise CheckFailed(f"the ranks put {measured.sent} bytes on the sandbox's network (counted by the operating "
                          f"system, at most {allowed} allowed): the grader's network does not use it, so something "
                          "went around it")


def assert_relay_bytes(results, n: int, max_bytes_sent: int) -> None:
    """No rank sent more than ``max_bytes_sent`` bytes through the grader's network: its messages,
    plus its share of each collective under :mod:`distlab.tools.comm_bytes`'s rules."""
    seen = record_of(results)
    for rank in range(n):
        sent = seen.sent_by(rank)
        if sent > max_bytes_sent:
            raise CheckFailed(f"rank {rank} sent {sent} bytes through the grader's network (counted there, outside "
                              f"the ranks); the most this needs is {max_bytes_sent} bytes. What it saw: "
                              f"{seen.describe()}")


def assert_relay_calls(results, n: int, expected: list[tuple[str, int]], what: str = "the step",
                       besides: tuple = ()) -> None:
    """Each rank called exactly the collectives ``expected``, ``[(op, bytes of its tensor)]`` in order,
    and sent no point-to-point message. Calls of the ops in ``besides`` (a setup's broadcasts, say)
    may come anywhere, in any number."""
    seen = record_of(results)
    if seen.messages():
        raise CheckFailed(f"{what} sent point-to-point messages ({seen.describe()}); it uses collectives only")
    for rank in range(n):
        made = [(op, size) for op, size in seen.collective_calls(rank) if op not in besides]
        if made != list(expected):
            shown = ", ".join(f"{op} of {size} bytes" for op, size in made[:8]) or "none"
            want = ", ".join(f"{op} of {size} bytes" for op, size in expected[:8])
            raise CheckFailed(f"rank {rank}'s collectives, as the grader's network saw them: {shown}"
                              f"{' ...' if len(made) > 8 else ''}; {what} calls {want}"
                              f"{' ...' if len(expected) > 8 else ''}")


# -- chapters 1, 6 and 8 ---------------------------------------------------------------------------

def _sizes(values) -> str:
    shown = ", ".join(map(str, values[:6]))
    return f"[{shown}{', ...' if len(values) > 6 else ''}]"


def _no_collective(seen, what: str, made_of: str) -> None:
    if seen.collectives():
        ops = sorted({c.op for c in seen.collectives()})
        raise CheckFailed(f"the grader's network saw {what} call built-in collectives ({', '.join(ops)}); "
                          f"it is made of {made_of} only")


def assert_relay_silent(results, n: int, what: str) -> None:
    """Nothing went through the grader's network while ``what`` ran: no message, no collective."""
    seen = record_of(results)
    if seen.entries:
        raise CheckFailed(f"{what} needs no communication (every rank computes its own share from the seed), "
                          f"but the grader's network saw: {seen.describe()}")
    assert_quiet_loopback(results, n)


def assert_pipeline_messages(results, p: int, message_bytes: list[int], what: str = "the pipeline") -> None:
    """Chapter 6: stage ``s`` sent its activations to ``s + 1`` only and its input gradients to
    ``s - 1`` only, each one message per micro-batch in micro-batch order, of ``message_bytes``
    (every case's micro-batches, in the order the run made them), and called no collective."""
    seen = record_of(results)
    _no_collective(seen, what, "send and receive")
    for s in range(p):
        mine = [m for m in seen.messages() if m.src == s]
        astray = [m for m in mine if m.dst not in (s - 1, s + 1)]
        if astray:
            raise CheckFailed(f"{what}: rank {s} sent {astray[0].nbytes} bytes to rank {astray[0].dst}; a stage "
                              f"sends to its neighbours only (ranks {s - 1} and {s + 1})")
        for dst, kind, sends in ((s + 1, "activation", s < p - 1), (s - 1, "input gradient", s > 0)):
            expected = list(message_bytes) if sends else []
            got = [m.nbytes for m in mine if m.dst == dst]
            if got != expected:
                raise CheckFailed(f"{what}: rank {s} sent rank {dst} {len(got)} messages of {_sizes(got)} bytes, "
                                  f"as the grader's network saw them; the schedule sends it {len(expected)}, one "
                                  f"{kind} per micro-batch in order, of {_sizes(expected)} bytes")
    assert_quiet_loopback(results, p)


def assert_few_all_reduces(results, n: int, most_bytes: int, what: str) -> None:
    """Every rank only all-reduced, at most ``most_bytes`` bytes in all (chapter 6's bubble: three
    float64 numbers per case), and sent no message."""
    seen = record_of(results)
    if seen.messages():
        raise CheckFailed(f"{what} sent point-to-point messages ({seen.describe()}); it combines its numbers "
                          "with all-reduces")
    for rank in range(n):
        calls = seen.collective_calls(rank)
        others = sorted({op for op, _ in calls} - {"all_reduce"})
        if others:
            raise CheckFailed(f"{what}: rank {rank} called {', '.join(others)}; it combines its numbers with "
                              "all-reduces")
        total = sum(size for _, size in calls)
        if total > most_bytes:
            raise CheckFailed(f"{what}: rank {rank} all-reduced {total} bytes, as the grader's network saw them; "
                              f"three float64 numbers per case are {most_bytes} bytes")
    assert_quiet_loopback(results, n)


def assert_kv_ring(results, n: int, cases: list[tuple], what: str = "ring attention") -> None:
    """Chapter 8: per case ``(seq, batch, heads, head_dim, element_size)`` on the balanced layout,
    in the order the run made them, every rank sent its right neighbour ``N - 1`` key/value
    blocks, step ``t`` exactly ``ring_bytes_per_step(...)[t]`` bytes (keys and values as one
    message or two of half that), nothing else, and no collective was called."""
    from distlab.context_parallel import balance, ring

    seen = record_of(results)
    _no_collective(seen, what, "send and receive")
    for rank in range(n):
        right = (rank + 1) % n
        mine = [m for m in seen.messages() if m.src == rank]
        astray = [m for m in mine if m.dst != right]
        if astray:
            raise CheckFailed(f"{what}: rank {rank} sent {astray[0].nbytes} bytes to rank {astray[0].dst}; a ring "
                              f"passes its blocks to the right neighbour only (rank {right})")
        sizes = [m.nbytes for m in mine]
        for index, (seq, batch, heads, head_dim, element_size) in enumerate(cases):
            steps = ring.ring_bytes_per_step(balance.balanced(seq, n), rank, batch, heads, head_dim, element_size)
            for step, (block, _) in enumerate(steps[:-1]):
                taken = sizes[:1] if sizes[:1] == [block] else sizes[:2]
                if taken not in ([block], [block // 2, block // 2]):
                    raise CheckFailed(f"case {index}, step {step}: rank {rank} sent {_sizes(taken)} bytes, as the "
                                      f"grader's network saw them; this step passes on one key/value block of "
                                      f"{block} bytes (keys and values: one message, or two of {block // 2})")
                sizes = sizes[len(taken):]
        if sizes:
            raise CheckFailed(f"{what}: rank {rank} sent {len(sizes)} messages more than the ring's blocks "
                              f"({_sizes(sizes)} bytes)")
    assert_quiet_loopback(results, n)


# -- chapters 4, 5 and 7 ---------------------------------------------------------------------------

def assert_relay_collectives(results, n: int, allowed: tuple, max_bytes_sent: int | None = None,
                             per_rank_calls: dict | None = None, what: str = "this task") -> None:
    """Sharded training's rules, on the grader's record (chapters 4, 5 and 7): the ranks called only
    the collectives in ``allowed`` (no point-to-point message), each rank sent at most
    ``max_bytes_sent`` bytes in all (its counted share of each collective, :mod:`distlab.tools.comm_bytes`'s
    rules), and ``per_rank_calls`` (``{op: count}``) says how many of an op each rank called.

    The count is what the exercise's algorithm needs: ZeRO's reduce-scatter of each layer's
    gradients and all-gather of its weights, Megatron's one all-reduce per block and pass. A
    rank that takes a shortcut through another collective (an all-reduce sliced afterwards), or
    sends the same data twice, breaks one of the three, whatever its own record says.
    """
    seen = record_of(results)
    if seen.messages():
        raise CheckFailed(f"{what} sent point-to-point messages ({seen.describe()}); it uses collectives only")
    for rank in range(n):
        made = [op for op, _ in seen.collective_calls(rank)]
        other = sorted(set(made) - set(allowed))
        if other:
            raise CheckFailed(f"rank {rank} called {', '.join(other)} (as the grader's network saw it); {what} "
                              f"uses only {', '.join(allowed)}")
        for op, count in (per_rank_calls or {}).items():
            if made.count(op) != count:
                raise CheckFailed(f"rank {rank} called {op} {made.count(op)} times (as the grader's network saw "
                                  f"it); {what} calls it {count} times")
    if max_bytes_sent is not None:
        assert_relay_bytes(results, n, max_bytes_sent)


def assert_relay_groups(results, groups, allowed: tuple = ("all_reduce",), what: str = "this task") -> None:
    """Every collective the grader's network saw ran over one of ``groups`` (lists of global ranks,
    each in order) and was one of ``allowed``, and no point-to-point message was sent (chapter 7:
    tensor parallelism talks only inside a tp group, the gradient average only inside a dp group).

    The group is what the router saw: the ranks that handed in the same call, not what a rank's
    own record says about the group it thought it used.
    """
    seen = record_of(results)
    if seen.messages():
        raise CheckFailed(f"{what} sent point-to-point messages ({seen.describe()}); it uses collectives only")
    wanted = {tuple(g) for g in groups}
    for call in seen.collectives():
        if call.op not in allowed:
            raise CheckFailed(f"ranks {list(call.ranks)} called {call.op} (as the grader's network saw it); {what} "
                              f"uses only {', '.join(allowed)}")
        if tuple(call.ranks) not in wanted:
            raise CheckFailed(f"ranks {list(call.ranks)} called {call.op} together (as the grader's network saw it); "
                              f"{what} talks only inside the groups {sorted(wanted)}")
