"""Chapter 8's exercise (Context parallelism): its references against single-process attention,
the bytes the ring sends against the formula, what is switched off on a graded rank, and
plausible wrong answers that lose their own task and nothing else.

The general gates (release equals notebooks/, no solution in the release, solution full marks,
blank release zero, time bound) run for every assignment in tests/grade/test_grading.py;
tests/grade/test_independent_grading.py breaks Task 1 and grades Task 2 with its reference.

Tolerances (``checks.assert_tensor_close``: ``|got - want| <= atol + rtol |want|``, ``atol =
atol_scale * max|want|``), the notebook's own: float64 ``1e-12`` (the merge regroups one sum:
measured within 9e-16 of the largest value), float32 ``2e-5`` against float64 attention on the
same inputs (measured within 5e-7 with ordinary scores and 3.5e-6 with scores in the hundreds,
where a score's rounding error, ``|s| * 6e-8``, becomes its weight's relative error).

Seen to fail for the intended reason while writing them: a merge that exponentiates ``lse``
without subtracting the maximum (NaN in the float32 cases with large scores; right in float64),
a ring that masks by the contiguous ring's recipe, its own block lower-triangular and earlier
ranks' blocks whole (the causal cases), a merge that averages
the blocks' outputs (test_independent_grading, Task 2 without the reference).
"""

from __future__ import annotations

import grading_support as gs
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab import chapters
from distlab.context_parallel import balance, blockwise, layout, ring
from distlab.grade import checks

SLUG = "08-context-parallel"
F64 = {"rtol": 1e-12, "atol_scale": 1e-12}
F32 = {"rtol": 2e-5, "atol_scale": 2e-5}


def test_each_task_is_graded_on_2_and_4_ranks_with_the_grading_seed():
    found = gs.assert_tasks_graded_on_2_and_4_ranks(SLUG, tasks=("task1-tests", "task2-tests"))
    assert "given=EARLIER_TASKS" in found["task2-tests"] and "timeout=TIMEOUT" in found["setup"]
    for question in "abc":
        assert "### BEGIN HIDDEN TESTS" in found[f"concept-{question}-tests"], question


def test_the_exercise_forbids_the_chapters_package_and_every_built_in_collective():
    from distlab.grade import exercise

    forbidden = gs.forbidden_list(SLUG)
    assert chapters.by_slug(SLUG).package in forbidden
    assert set(exercise.COLLECTIVES) <= set(forbidden)


def try_the_roads(forbidden):
    """On a rank with the exercise's list switched off: each forbidden road raises, and a ring
    exchange through ``batch_isend_irecv`` (what Task 2 is built from) still works."""
    import importlib

    from distlab.grade.boundary.forbid import forbid

    forbid(*forbidden)
    verdicts = gs.try_each({
        "all_gather": lambda: dist.all_gather([torch.empty(2) for _ in range(2)], torch.ones(2)),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(2), torch.ones(2)),
        "all_reduce": lambda: dist.all_reduce(torch.ones(1)),
        "distlab.context_parallel.ring": lambda: importlib.import_module("distlab.context_parallel.ring").ring_attention,
        "the reference": lambda: importlib.import_module("distlab.context_parallel.reference").merge_partials,
    })
    n, r = dist.get_world_size(), dist.get_rank()
    arriving = torch.empty(3)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % n),
                                        dist.P2POp(dist.irecv, arriving, (r - 1) % n)]):
        work.wait()
    return verdicts, arriving.tolist()


def test_forbidden_roads_raise_on_a_rank_and_point_to_point_still_works():
    for rank, (verdicts, arriving) in enumerate(distlab.run(try_the_roads, gs.forbidden_list(SLUG), nprocs=2,
                                                            timeout=120)):
        assert set(verdicts.values()) == {"ForbiddenError"}, verdicts
        assert arriving == [float(1 - rank)] * 3


# -- the references against one process ----------------------------------------------------------

def qkv(shape, dtype, seed, score_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    return (q * score_scale).to(dtype), k.to(dtype), v.to(dtype)


def whole_lse(q, k, causal):
    scores = q.double() @ k.double().transpose(-2, -1) * blockwise.default_scale(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~blockwise.causal_allowed(torch.arange(q.shape[-2]), torch.arange(k.shape[-2])),
                                    float("-inf"))
    return torch.logsumexp(scores, dim=-1)


MERGE_CASES = [  # (q, k, v), key block edges, the order the parts come in, causal
    (qkv((2, 3, 19, 8), torch.float64, 0), [0, 4, 5, 13, 19], [3, 1, 0, 2], True),
    (qkv((1, 2, 13, 8), torch.float64, 1), [0, 13], [0], False),
    (qkv((1, 4, 16, 16), torch.float32, 2), [0, 2, 9, 10, 16], [1, 3, 2, 0], False),
    (qkv((1, 2, 12, 8), torch.float32, 3, score_scale=80.0), [0, 6, 12], [1, 0], True),   # exp(score) overflows
]


def test_the_merge_of_partial_results_is_plain_attention_in_any_order_without_overflow():
    """Blocks in the future of some queries (lse = -inf rows), uneven blocks, one block, scores in the hundreds."""
    from distlab.context_parallel import reference

    for (q, k, v), edges, order, causal in MERGE_CASES:
        parts = []
        for i in order:
            keys = torch.arange(edges[i], edges[i + 1])
            allowed = blockwise.causal_allowed(torch.arange(q.shape[-2]), keys) if causal else None
            parts.append(blockwise.block_attention(q, k[..., keys, :], v[..., keys, :], allowed))
        if causal:
            assert any(torch.isneginf(lse).any() for _, lse in parts), "no block lies in a query's future"
        out, lse = reference.merge_partials(parts)
        tolerance = F64 if q.dtype == torch.float64 else F32
        expected = blockwise.attention(q.double(), k.double(), v.double(), causal=causal).to(q.dtype)
        checks.assert_tensor_close(out, expected, name="the merged out", **tolerance)
        checks.assert_tensor_close(lse, whole_lse(q, k, causal).to(q.dtype), name="the merged lse", **tolerance)


RING_CASES = [  # (q, k, v), causal: 16 tokens (2N divides it on 2 and 4 ranks) and 19 (it does not)
    (qkv((2, 3, 19, 8), torch.float64, 10), True),
    (qkv((1, 2, 16, 8), torch.float64, 11), False),
    (qkv((1, 4, 32, 16), torch.float32, 12), True),
    (qkv((1, 2, 19, 8), torch.float32, 13, score_scale=60.0), True),
]


def reference_ring_on_my_share(cases):
    """On each rank: the reference on this rank's share of every case, and the bytes it sent."""
    from distlab.context_parallel import reference
    from distlab.tools import comm

    n, r = dist.get_world_size(), dist.get_rank()
    found = []
    for (q, k, v), causal in cases:
        mine = balance.balanced(q.shape[-2], n)
        shares = [layout.shard(t, mine, r) for t in (q, k, v)]
        with comm.record() as log:
            out = reference.balanced_ring_attention(*shares, q.shape[-2], causal)
        found.append((out, log.bytes_sent()))
    return found


def test_the_balanced_ring_reference_is_plain_attention_and_sends_what_the_formula_says():
    for n in (2, 4):
        per_rank = distlab.run(reference_ring_on_my_share, RING_CASES, nprocs=n, timeout=120)
        for index, ((q, k, v), causal) in enumerate(RING_CASES):
            mine = balance.balanced(q.shape[-2], n)
            expected = blockwise.attention(q.double(), k.double(), v.double(), causal=causal).to(q.dtype)
            tolerance = F64 if q.dtype == torch.float64 else F32
            outs = [per_rank[rank][index][0] for rank in range(n)]
            checks.assert_tensor_close(layout.unshard(outs, mine), expected, name=f"case {index} on {n} ranks",
                                       **tolerance)
            batch, heads, seq, head_dim = k.shape
            for rank in range(n):
                sent = per_rank[rank][index][1]
                by_step = ring.ring_bytes_per_step(mine, rank, batch, heads, head_dim, k.element_size())
                assert sent == sum(out for out, _ in by_step), (n, index, rank, sent, by_step)
                if seq % (2 * n) == 0:   # even chunks: N - 1 blocks of 2 (k and v) x seq / N tokens
                    assert sent == ring.ring_bytes(n, seq, batch, heads, head_dim, k.element_size())
                    assert sent == (n - 1) * 2 * batch * heads * (seq // n) * head_dim * k.element_size()


def test_concept_a_counts_only_keys_and_values_for_the_ring_and_all_four_tensors_for_ulysses():
    """The numbers of question (a), worked out again by hand: grouped-query attention makes the ring
    send less than Ulysses (8 key/value heads of 64), the opposite of equal heads' 2/N."""
    from distlab.context_parallel import ulysses

    n, seq, heads_q, heads_kv, d, e = 8, 131072, 64, 8, 128, 2
    ring_mb = (n - 1) * 2 * heads_kv * (seq // n) * d * e / 1e6
    ulysses_mb = (n - 1) / n**2 * (2 * heads_q + 2 * heads_kv) * seq * d * e / 1e6
    assert (round(ring_mb, 6), round(ulysses_mb, 6)) == (469.762048, 528.482304)
    assert ring.ring_bytes(n, seq, 1, heads_kv, d, e) / 1e6 == ring_mb
    assert (ulysses.ulysses_bytes(n, seq, 1, heads_q, d, e) + ulysses.ulysses_bytes(n, seq, 1, heads_kv, d, e)) / 2e6 \
        == ulysses_mb
    assert ulysses.ulysses_bytes(n, seq, 1, heads_kv, d, e) < ring.ring_bytes(n, seq, 1, heads_kv, d, e)   # equal heads


# -- plausible wrong answers ----------------------------------------------------------------------

NO_RUNNING_MAXIMUM = '''
def merge_partials(parts):
    """Weighs each block by exp(lse) directly: right in float64, NaN once exp(score) overflows."""
    sums = torch.stack([torch.exp(lse) for _, lse in parts])
    outs = torch.stack([out for out, _ in parts])
    total = sums.sum(dim=0)
    return (sums.unsqueeze(-1) * outs).sum(dim=0) / total.unsqueeze(-1), torch.log(total)
'''

CONTIGUOUS_RINGS_MASK = (   # the contiguous ring's recipe: own block lower-triangular, earlier ranks' all seen
    "mask = (torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril() if holder == me else "
    "torch.full((q.shape[-2], keys.shape[-2]), holder < me)) if causal else None")

test_a_merge_without_the_maximum_and_a_contiguous_mask_lose_their_own_tasks = gs.wrong_answers_test(
    SLUG, {"task1-answer": NO_RUNNING_MAXIMUM,
           "task2-answer": ("mask = where[holder].unsqueeze(0) <= where[me].unsqueeze(1) if causal else None",
                            CONTIGUOUS_RINGS_MASK)},
    {"task1-tests": "a merge that overflows without the running maximum",
     "task2-tests": "a causal mask made for the contiguous layout"})


# -- issue 43: graded ranks talk through the grader's relay, which records every message ---------

@pytest.mark.parametrize("n", [2, 4])
def test_the_relays_record_of_the_solution_ring_is_its_schedule_exactly(n):
    """The solution's ring, through the notebook's own runner (on the relay): each rank's messages,
    in its own order, are the ring's schedule (keys then values of the block it holds, to its right
    neighbour, N - 1 steps), their bytes add up to ring_bytes_per_step's, and the chapter's check of
    the record accepts them; even chunks and uneven ones (19 tokens)."""
    from distlab.relay import record

    nb = gs.notebook_definitions(SLUG)
    g = torch.Generator().manual_seed(3)
    cases = [(*nb["qkv"]((2, 3, 19, 8), torch.float64, g), True), (*nb["qkv"]((1, 2, 16, 4), torch.float32, g), False)]
    with distlab.Pool(n, backend="relay"):
        with record.capture() as seen:
            runs = nb["on_ranks"](nb["ring_here"], (nb["balanced_ring_attention"],), cases, n)
    schedule = []
    for q, k, _, _ in cases:
        batch, heads, seq, head_dim = q.shape
        cut = balance.balanced(seq, n)
        blocks = [ring.kv_block_bytes(cut.tokens(r), batch, heads, head_dim, k.element_size()) for r in range(n)]
        schedule += record.kv_ring_schedule(blocks)
        for rank in range(n):
            by_step = ring.ring_bytes_per_step(cut, rank, batch, heads, head_dim, k.element_size())
            assert sum(b for src, _, b in record.kv_ring_schedule(blocks) if src == rank) == sum(s for s, _ in by_step)
    assert record.by_sender(seen.messages()) == record.by_sender(schedule)
    assert seen.collectives() == [] and runs.record.entries == seen.entries
    nb["relay_checks"].assert_kv_ring(runs, n, [(q.shape[-2], *k.shape[:2], k.shape[-1], k.element_size())
                                                 for q, k, _, _ in cases])


def test_a_ring_that_sends_the_wrong_way_or_a_block_too_many_fails_the_record_check():
    """The check on made-up records of one case on 2 ranks (16 tokens, 8 per rank, float32, 1 x 1 x 4):
    keys and values together in one message pass; sent to the left, or one block more, they fail."""
    from distlab.grade import relay_checks
    from distlab.grade.checks import CheckFailed
    from distlab.relay import record

    def results_with(messages):
        run = type("Run", (list,), {})()
        run.record, run.wire = record.Record([record.Message(*m) for m in messages]), None
        return run

    block = ring.kv_block_bytes(8, 1, 1, 4, 4)
    case = [(16, 1, 1, 4, 4)]
    relay_checks.assert_kv_ring(results_with([(0, 1, block // 2), (0, 1, block // 2), (1, 0, block)]), 2, case)
    on_4 = [(r, (r + 1) % 4, ring.kv_block_bytes(4, 1, 1, 4, 4) // 2) for r in range(4) for _ in range(6)]  # 3 steps
    relay_checks.assert_kv_ring(results_with(on_4), 4, [(16, 1, 1, 4, 4)])
    with pytest.raises(CheckFailed, match=r"rank 1 sent 64 bytes to rank 0; a ring passes its blocks to the right"):
        relay_checks.assert_kv_ring(results_with(on_4[:6] + [(1, 0, 64)]), 4, [(16, 1, 1, 4, 4)])
    with pytest.raises(CheckFailed, match=r"rank 1 sent 1 messages more than the ring's blocks"):
        relay_checks.assert_kv_ring(results_with([(0, 1, block), (1, 0, block), (1, 0, block)]), 2, case)
    with pytest.raises(CheckFailed, match=r"case 0, step 0: rank 0 sent \[128\] bytes"):
        relay_checks.assert_kv_ring(results_with([(0, 1, block // 2), (1, 0, block)]), 2, case)


GC_BUILTIN_ALL_GATHER_BEHIND_A_RING_OF_ZEROS = '''
def balanced_ring_attention(q, k, v, seq, causal=True):
    """The guard's registrations removed through the garbage collector, every rank's keys and
    values fetched with the built-in all-gather (a functional operator looked up afresh), and the
    ring's schedule sent with zeros so that the rank's own byte count looks right: on gloo this
    scored full marks."""
    import gc
    for obj in gc.get_objects():
        if isinstance(obj, torch.library.Library):
            obj._destroy()
    ops = torch._ops._OpNamespace("_c10d_functional")
    world, me = dist.get_world_size(), dist.get_rank()
    pieces = torch.tensor_split(torch.arange(seq), 2 * world)
    where = [torch.cat([pieces[i], pieces[2 * world - 1 - i]]) for i in range(world)]
    most = max(len(w) for w in where)

    def everyones(t):
        padded = t.new_zeros(*t.shape[:2], most, t.shape[-1])
        padded[..., : t.shape[-2], :] = t
        whole = ops.wait_tensor(ops.all_gather_into_tensor(padded.contiguous(), world, dist.group.WORLD.group_name))
        return [block[..., : len(where[r]), :] for r, block in enumerate(whole.chunk(world))]

    keys, values = everyones(k), everyones(v)
    holder = me
    for _ in range(world - 1):          # the ring, with zeros: the right sizes to the right neighbour
        arriving = (holder - 1) % world
        size = (*k.shape[:2], len(where[arriving]), k.shape[-1])
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.zeros_like(keys[holder]), (me + 1) % world),
                                            dist.P2POp(dist.isend, torch.zeros_like(values[holder]), (me + 1) % world),
                                            dist.P2POp(dist.irecv, k.new_empty(size), (me - 1) % world),
                                            dist.P2POp(dist.irecv, v.new_empty(size), (me - 1) % world)]):
            work.wait()
        holder = arriving
    parts = []
    for h in range(world):
        mask = where[h].unsqueeze(0) <= where[me].unsqueeze(1) if causal else None
        parts.append(block_attention(q, keys[h], values[h], mask))
    return merge_partials(parts)[0]
'''

# On the relay the built-in all-gather has no gloo connection to go over: it either fails (the
# relay refuses torch's functional collectives) or goes through the router, which records it and
# the ring check refuses it ("built-in collectives"). Either way Task 2 scores 0, Task 1 keeps its points.
test_a_builtin_all_gather_with_the_guard_removed_behind_a_ring_of_zeros_scores_zero = gs.wrong_answers_test(
    SLUG, {"task2-answer": GC_BUILTIN_ALL_GATHER_BEHIND_A_RING_OF_ZEROS},
    {"task2-tests": "a built-in all-gather with the guard removed, behind a ring of zeros"})
