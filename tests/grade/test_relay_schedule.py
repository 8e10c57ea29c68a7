"""The relay's seeded schedule (distlab.relay.schedule): with DISTLAB_RELAY_SEED set where the router
runs (this test's process), messages arrive late and out of order between different pairs of
ranks, never within one pair, and a solution that works only by luck of timing fails under some
seed while the correct one passes under every seed tried.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.relay import record, schedule

SEEDS = range(5)


def exchange(read_before_wait: bool):
    """Rank 0 sends 7s to rank 1 (an ``isend``: a blocking send would wait for a receive that
    comes only after the barrier), then both meet in a barrier, then rank 1 receives: a racy
    solution reads the buffer before ``wait()``. Without delays the message always came first
    (the router forwards rank 0's frames in order: the message before the barrier's answer), so
    the racy solution always finds it there."""
    if dist.get_rank() == 0:
        send = dist.isend(torch.full((4,), 7.0), 1)
        dist.barrier()
        send.wait()
        return None
    dist.barrier()
    buffer = torch.zeros(4)
    work = dist.irecv(buffer, 0)
    seen = buffer.clone() if read_before_wait else None
    work.wait()
    return (seen if read_before_wait else buffer).tolist()


def _run(monkeypatch, seed, fn, *args, nprocs=2):
    if seed is None:
        monkeypatch.delenv(schedule.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(schedule.VARIABLE, str(seed))
    with record.capture() as seen:
        results = distlab.run(fn, *args, nprocs=nprocs, backend="relay", timeout=60)
    return results, seen


def test_a_solution_that_reads_before_wait_fails_under_some_seed_and_the_correct_one_under_none(monkeypatch):
    racy = {seed: _run(monkeypatch, seed, exchange, True)[0][1] for seed in (None, *SEEDS)}
    assert racy[None] == [7.0] * 4, "without a seed the racy solution's luck holds (the attack's premise)"
    assert any(racy[seed] != [7.0] * 4 for seed in SEEDS), racy
    for seed in SEEDS:
        results, seen = _run(monkeypatch, seed, exchange, False)
        assert results[1] == [7.0] * 4
        assert seen.seeds == {seed}   # the record says which schedule it was made under


def many_senders(count):
    """Ranks 1..N-1 each send rank 0 ``count`` numbered messages on one tag; rank 0 receives them
    from any sender in the order they come and notes who came when."""
    r, n = dist.get_rank(), dist.get_world_size()
    if r != 0:
        for i in range(count):
            dist.send(torch.tensor([float(r), float(i)]), 0)
        return None
    works = {src: [] for src in range(1, n)}
    for src in range(1, n):
        for _ in range(count):
            buffer = torch.zeros(2)
            works[src].append((dist.irecv(buffer, src), buffer))
    arrival = []
    pending = [(src, i) for src in works for i in range(count)]
    while pending:
        for src, i in list(pending):
            if works[src][i][0].is_completed():
                arrival.append(works[src][i][1].tolist())
                pending.remove((src, i))
        time.sleep(0.001)
    return arrival


def test_within_one_pair_the_order_is_kept_and_between_pairs_it_changes(monkeypatch):
    count = 8
    orders = set()
    for seed in SEEDS:
        results, _ = _run(monkeypatch, seed, many_senders, count, nprocs=4)
        arrival = results[0]
        for src in (1, 2, 3):
            assert [i for s, i in arrival if s == src] == list(range(count)), (seed, arrival)
        orders.add(tuple(s for s, _ in arrival))
    assert len(orders) > 1, "the seeds should interleave the senders differently"


@pytest.mark.parametrize("seed", [3])
def test_the_same_seed_draws_the_same_delays(seed):
    first, second = schedule.Schedule(seed), schedule.Schedule(seed)
    draws = [[s._random.uniform(0, 1) for _ in range(5)] for s in (first, second)]
    assert draws[0] == draws[1]


def peek_at_the_seed_then_race():
    """What a rank could learn of the seed (to draw the router's delays itself), then the racy
    exchange, to see that the delays still apply."""
    import os

    with open("/proc/self/environ", "rb") as first:
        environ = first.read()
    return schedule.VARIABLE in os.environ, schedule.VARIABLE.encode() in environ, exchange(True)


def test_the_ranks_do_not_see_the_seed_and_its_delays_still_apply(monkeypatch):
    racy = []
    for seed in SEEDS:
        results, seen = _run(monkeypatch, seed, peek_at_the_seed_then_race)
        assert [found[:2] for found in results] == [(False, False)] * 2, f"a rank saw the seed {seed}"
        assert seen.seeds == {seed}
        racy.append(results[1][2])
    assert any(got != [7.0] * 4 for got in racy), racy   # the delays made the racy solution fail


SEED_PEEKING_CELL = '''
def peek_at_the_seed():
    import ctypes
    import os
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)   # PR_SET_DUMPABLE: its own /proc files readable again
    with open("/proc/self/environ", "rb") as first:
        environ = first.read()
    return "DISTLAB_RELAY_SEED" in os.environ, b"DISTLAB_RELAY_SEED" in environ
'''
SEED_TEST_CELL = '''
import distlab
from distlab.relay import record
with record.capture() as seen:
    found = distlab.run(peek_at_the_seed, nprocs=2, backend="relay", timeout=60)
assert seen.seeds == {7}, f"the router's seeds: {seen.seeds}"
assert found == [(False, False)] * 2, f"the ranks saw the seed: {found}"
print("the seed stayed with the router")
'''


def test_graded_ranks_do_not_see_the_seed_the_instructor_grades_with(monkeypatch):
    """The clean room, started as the grader starts it (in its sandbox where the machine has one),
    with DISTLAB_RELAY_SEED=7 in the grader's environment: its router delays with 7, and neither
    a rank's environment nor the first environment of its process (which a fork inherits from
    the clean room; the rank makes itself dumpable again to read it) holds it."""
    from distlab.grade.pipeline import nbplugins

    monkeypatch.setenv(schedule.VARIABLE, "7")
    job = {"cells": [{"grade_id": "answer", "source": SEED_PEEKING_CELL}, {"grade_id": "seed", "source": ""}],
           "trusted_cells": [], "test_cells": [{"grade_id": "seed", "source": SEED_TEST_CELL}],
           "caps": {"label": "this rank"}, "protected": [], "forbidden": [], "test_timeout": 240,
           "assignment": "relay-seed"}
    verdicts, problem = nbplugins.CleanRoomTests().run_clean_room(job, 1)
    assert problem is None, problem
    assert verdicts["seed"]["passed"], verdicts["seed"]["outputs"]
