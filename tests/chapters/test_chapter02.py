"""Chapter 2's exercise: the guard closes every road to a built-in collective, and wrong answers lose points."""

from __future__ import annotations

import grading_support as gs
import torch
import torch.distributed as dist

import distlab

SLUG = "02-collectives"


def fresh_ops(namespace):
    import torch._ops

    return torch._ops._OpNamespace(namespace)


def real_module_from_the_guard(name):
    """Any real (not stand-in) forbidden module that the guard's module keeps in a dict."""
    import types

    from distlab.grade.boundary import forbid

    for value in list(vars(forbid).values()):
        for held in (value.values() if isinstance(value, dict) else ()):
            if isinstance(held, types.ModuleType) and not isinstance(held, forbid.ForbiddenModule) \
                    and held.__name__.startswith(name):
                return held.__name__
    raise forbid.ForbiddenError("the guard hands out no real module")


def try_every_road(forbidden):
    from distlab.grade.boundary.forbid import forbid

    forbid(*forbidden)
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    roads = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(2)),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([torch.ones(2)]),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(torch.empty(1), torch.ones(2)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(1), torch.ones(2)),
        "all_gather_single": lambda: dist.all_gather_single(torch.empty(2), torch.ones(1)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(2), torch.ones(1)),
        "group.allreduce": lambda: group.allreduce([torch.ones(2)]).wait(),
        "group.reduce_scatter_single": lambda: group.reduce_scatter_single(torch.empty(1), torch.ones(2)),
        "group.all_gather_single": lambda: group.all_gather_single(torch.empty(2), torch.ones(1)),
        "broadcast": lambda: dist.broadcast(torch.ones(2), src=0),
        # Below the process group: gloo's backend object is not a ProcessGroup subclass.
        "backend.allreduce": lambda: backend.allreduce([torch.ones(2)]).wait(),
        "backend.allreduce_coalesced": lambda: backend.allreduce_coalesced([torch.ones(2)]).wait(),
        "backend.broadcast": lambda: backend.broadcast([torch.ones(2)]).wait(),
        "backend._allgather_base": lambda: backend._allgather_base(torch.empty(2), torch.ones(1)).wait(),
        # The dispatcher's ops, looked up afresh (torch.ops.c10d's attributes are only a cache).
        "a fresh torch.ops namespace": lambda: fresh_ops("_c10d_functional").wait_tensor(
            fresh_ops("_c10d_functional").all_reduce(torch.ones(2), "sum", group.group_name)),
        "torch._C._broadcast_coalesced": lambda: torch._C._distributed_c10d._broadcast_coalesced(
            group, [torch.ones(2)], 1 << 20, 0),
        "the real module from the guard's own records": lambda: real_module_from_the_guard("distlab.collectives"),
    }
    verdicts = gs.try_each(roads)
    # Point-to-point stays allowed: it is what the exercise is built from.
    peer = 1 - dist.get_rank()
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(1), peer),
                                    dist.P2POp(dist.irecv, torch.empty(1), peer)])
    for work in works:
        work.wait()
    verdicts["batch_isend_irecv"] = "allowed"
    return verdicts


def test_every_spelling_of_a_forbidden_collective_is_closed():
    forbidden = gs.forbidden_list(SLUG)
    for verdicts in distlab.run(try_every_road, forbidden, nprocs=2):
        assert verdicts.pop("batch_isend_irecv") == "allowed"
        open_roads = {road: verdict for road, verdict in verdicts.items() if verdict != "ForbiddenError"}
        assert not open_roads, "still open: " + "; ".join(f"{road} ({verdict})" for road, verdict in open_roads.items())


def test_the_reference_solution_matches_the_book_and_the_exercise_uses_2_and_4_ranks():
    sources = "\n".join(c.source for c in gs.notebook_cells(gs.solution_path(SLUG)))
    assert "nprocs=2" in sources and "nprocs=4" in sources
    assert "forbidden=FORBIDDEN" in sources


NAIVE_ALL_REDUCE = '''
def ring_all_reduce(tensor):
    """Everything to rank 0 and back: right numbers, too many bytes from rank 0."""
    n, r = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    if r == 0:
        incoming = torch.empty_like(tensor)
        for other in range(1, n):
            dist.recv(incoming, src=other)
            total += incoming
        for other in range(1, n):
            dist.send(total, dst=other)
    else:
        dist.send(tensor, dst=0)
        dist.recv(total, src=0)
    return total
'''

BUILTIN_REDUCE_SCATTER = '''
def ring_reduce_scatter(tensor):
    """Sneaks in the built-in under its new torch 2.13 name."""
    n, r = dist.get_world_size(), dist.get_rank()
    padded = torch.zeros(n * -(-tensor.numel() // n), dtype=tensor.dtype)
    padded[: tensor.numel()] = tensor
    out = torch.empty(padded.numel() // n, dtype=tensor.dtype)
    dist.reduce_scatter_single(out, padded)
    return out[: len(torch.tensor_split(tensor, n)[r])]
'''


test_a_naive_all_reduce_and_a_disguised_builtin_score_zero = gs.wrong_answers_test(
    SLUG, {"task1-answer": BUILTIN_REDUCE_SCATTER, "task3-answer": NAIVE_ALL_REDUCE},
    {"task1-tests": "the built-in reduce-scatter", "task3-tests": "the naive all-reduce (by the byte count)"})

# -- issue 43: the ranks talk only through the grader's relay, which records every message -------

GC_BUILTIN_ALL_REDUCE = '''
def ring_all_reduce(tensor):
    """The guard's own registrations found through the garbage collector and removed, then the
    built-in all-reduce through a functional operator looked up afresh: on gloo the ranks' record
    says 0 bytes and the values are right."""
    import gc
    for obj in gc.get_objects():
        if isinstance(obj, torch.library.Library):
            obj._destroy()
    ops = torch._ops._OpNamespace("_c10d_functional")
    return ops.wait_tensor(ops.all_reduce(tensor.clone(), "sum", dist.group.WORLD.group_name))
'''

GC_BUILTIN_SLICE = '''
def ring_reduce_scatter(tensor):
    """Task 1 as a slice of the same smuggled all-reduce."""
    import gc
    for obj in gc.get_objects():
        if isinstance(obj, torch.library.Library):
            obj._destroy()
    ops = torch._ops._OpNamespace("_c10d_functional")
    whole = ops.wait_tensor(ops.all_reduce(tensor.clone(), "sum", dist.group.WORLD.group_name))
    return torch.tensor_split(whole, dist.get_world_size())[dist.get_rank()].clone()
'''

test_the_guard_removed_through_gc_and_a_builtin_all_reduce_score_zero = gs.wrong_answers_test(
    SLUG, {"task1-answer": GC_BUILTIN_SLICE, "task3-answer": GC_BUILTIN_ALL_REDUCE},
    {"task1-tests": "a reduce-scatter sliced from a smuggled built-in all-reduce",
     "task3-tests": "a built-in all-reduce with the guard removed through gc"})

NAIVE_WITH_ITS_RECORD_EMPTIED = NAIVE_ALL_REDUCE.replace('''    return total
''', '''    from distlab.tools import comm
    for log in comm._recorders:      # the rank's own record of what it sent: emptied
        log.clear()
    return total
''')

test_a_rank_that_empties_its_own_record_scores_zero = gs.wrong_answers_test(
    SLUG, {"task3-answer": NAIVE_WITH_ITS_RECORD_EMPTIED},
    {"task3-tests": "a naive all-reduce whose rank record was emptied"},
    reasons=["a ring all-reduce sends 1 per pass around the ring"])

GLOO_OF_ITS_OWN_BEHIND_A_DUMMY_RING = '''
import datetime
_side = {}

def ring_all_reduce(tensor):
    """The sum over a gloo process group of the ranks' own (a TCPStore on the loopback), and the
    ring's schedule sent through the relay with zeros, so its record looks right."""
    n, r = dist.get_world_size(), dist.get_rank()
    if n not in _side:
        store = dist.TCPStore("127.0.0.1", 29731 + n, n, r == 0, timeout=datetime.timedelta(seconds=30))
        _side[n] = dist.ProcessGroupGloo(store, r, n, datetime.timedelta(seconds=30))
    side = _side[n]
    flat = tensor.reshape(-1).clone()
    total = flat.clone()
    if r == 0:
        for other in range(1, n):
            incoming = torch.empty_like(flat)
            side.recv([incoming], other, 0).wait()
            total += incoming
        for other in range(1, n):
            side.send([total], other, 0).wait()
    else:
        side.send([flat], 0, 0).wait()
        side.recv([total], 0, 0).wait()
    chunks = torch.tensor_split(flat, n)
    for shift in (1, 0):
        for step in range(n - 1):
            out, back = chunks[(r - step - shift) % n], chunks[(r - step - shift - 1) % n]
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.zeros_like(out), (r + 1) % n),
                                                dist.P2POp(dist.irecv, torch.empty_like(back), (r - 1) % n)]):
                work.wait()
    return total.reshape(tensor.shape)
'''

# The relay's record alone cannot see this one: the data would go over a gloo process group the
# ranks make from a TCPStore of their own, and the relay carries a ring of zeros. Each graded rank
# is in a room of its own with no network at all (distlab.grade.boundary.rank_room), so the second rank
# cannot even reach the first one's store; were the room off, the sandbox loopback's byte counter
# would catch the traffic instead ("went around it", distlab.grade.relay_checks).
test_a_gloo_group_of_the_ranks_own_behind_a_dummy_ring_scores_zero = gs.wrong_answers_test(
    SLUG, {"task3-answer": GLOO_OF_ITS_OWN_BEHIND_A_DUMMY_RING},
    {"task3-tests": "a sum over a gloo group of the ranks' own, behind a ring of zeros"},
    reasons=["Network is unreachable"])
