"""Chapter 6's exercise: the references are switched off, and plausible wrong answers lose points.

The general gates (release equals notebooks/, no solution in the release, solution full marks,
blank release zero, time bound) run for every assignment in tests/grade/test_grading.py; here are
the chapter's own.

The exercise forbids ``distlab.pipeline_parallel`` and ``distlab.parallel3d`` (which holds a reference to
it: ``distlab.parallel3d.train.run_step`` would be the reference under another name) and
``torch.distributed.pipelining``; the test below checks that each road raises while what the
exercise is built from (point-to-point messages, autograd through a received tensor, a MAX
all-reduce in float64, SGD and AdamW) still works, twice on one warm pool, as in the grader.

Seen to fail for the intended reason, against the visible tests, while writing them: a loss not
divided by ``m`` (the loss), a stage that forgets ``requires_grad_()`` on what it receives (its
``x.grad`` is None: sending it raises on the rank), a stage run by ``stage.forward(x)`` (the
Recorder sees no forwards), GPipe submitted as 1F1B and a 1F1B with one warm-up forward too
many (the micro-batches in flight), a PipelineRank with blocking ``dist.send`` (GPipe passes,
1F1B deadlocks and ends in a DistTimeout after the test's TIMEOUT, on the relay as on gloo: a
send there waits for its receiver), a bubble computed from one rank's own spans (the value),
and one computed in float32 (the value: the clock's readings are
near 73 123 s, where float32 steps by 0.008 s).

Timing, ``grade class`` of the solution and the blank release together, per notebook, on the
2-core machine shared with other work: 27 s at load average 2 (clean room 17 s and 20 s), 35 s
at 3-4, 46 s at 6-7, 90 s at 10. The chapter's forbidden list costs about 1 s more than chapter
5's per new pool (importing ``torch.distributed.pipelining`` to switch it off). This file: about
50 s, the slow test 36 s of it.
"""

from __future__ import annotations

import time

import grading_support as gs
import pytest

import distlab

SLUG = "06-pipeline"


def test_the_references_and_torchs_pipelining_are_forbidden_in_metadata_and_setup():
    forbidden = set(gs.forbidden_list(SLUG))
    assert {"distlab.pipeline_parallel", "distlab.parallel3d", "torch.distributed.pipelining"} <= forbidden


def try_forbidden(forbidden):
    import importlib

    import torch
    import torch.distributed as dist

    from distlab import models
    from distlab.grade.boundary.forbid import forbid
    from distlab.tools import comm

    forbid(*forbidden)
    mod = importlib.import_module
    verdicts = gs.try_each({
        "distlab.pipeline_parallel": lambda: __import__("distlab.pipeline_parallel").pipeline_parallel.schedules,
        "import a module of it": lambda: mod("distlab.pipeline_parallel.executor").Executor,
        "from distlab.pipeline_parallel import schedules": lambda: __import__(
            "distlab.pipeline_parallel", fromlist=["schedules"]).schedules.one_f_one_b(2, 4),
        "distlab.parallel3d": lambda: mod("distlab.parallel3d").train,
        "what chapter 7's code imported by name": lambda: mod("distlab.parallel3d.train").run_step,
        "ScheduleGPipe": lambda: mod("torch.distributed.pipelining").ScheduleGPipe,
        "Schedule1F1B (defining module)": lambda: mod("torch.distributed.pipelining.schedules").Schedule1F1B,
        "PipelineStage": lambda: mod("torch.distributed.pipelining").PipelineStage(torch.nn.Linear(2, 2), 0, 2,
                                                                                   torch.device("cpu")),
        "pipeline() and SplitPoint": lambda: mod("torch.distributed.pipelining").SplitPoint,
    })

    # and what the exercise is built from still works: SGD and AdamW steps (AdamW's first step
    # imports torch._dynamo), messages both ways between two ranks at once (isend, recv, irecv,
    # send), autograd through a received tensor, a MAX all-reduce in float64
    model = models.build("gpt", seed=0)
    for optimizer in (torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.AdamW(model.parameters(), lr=1e-2)):
        models.loss_fn(model, models.example_batch("gpt", 2)).backward()
        optimizer.step()
    rank, other = dist.get_rank(), 1 - dist.get_rank()
    with comm.record() as log:
        mine = torch.full((2, 3), float(rank + 1))
        work = dist.isend(mine, dst=other)
        theirs = torch.empty(2, 3)
        dist.recv(theirs, src=other)
        work.wait()
        x = theirs.requires_grad_()
        (3 * x).sum().backward()
        grad = torch.empty(2, 3)
        if rank == 0:
            dist.send(x.grad, dst=1)
            request = dist.irecv(grad, src=1)
        else:
            request = dist.irecv(grad, src=0)
            dist.send(x.grad, dst=0)
        request.wait()
        latest = torch.tensor([-1000.5 * rank, 73123.4567 + rank], dtype=torch.float64)
        dist.all_reduce(latest, op=dist.ReduceOp.MAX)
    return (verdicts, bool(torch.isfinite(model.head.weight).all()), theirs.tolist(), grad.tolist(),
            latest.tolist(), [c.op for c in log])


def test_forbidden_apis_raise_on_a_rank_and_training_and_messages_still_work():
    with distlab.Pool(2):
        for _ in range(2):     # again on the same warm ranks, as the grader's calls are
            for rank, (verdicts, trained, theirs, grad, latest, calls) in enumerate(
                    distlab.run(try_forbidden, gs.forbidden_list(SLUG), nprocs=2, timeout=120)):
                assert set(verdicts.values()) == {"ForbiddenError"}, verdicts
                assert trained and theirs == [[float(2 - rank)] * 3] * 2 and grad == [[3.0] * 3] * 2
                assert latest == [0.0, 73124.4567]
                assert calls == (["isend", "recv", "send", "irecv", "all_reduce"] if rank == 0 else
                                 ["isend", "recv", "irecv", "send", "all_reduce"])


def test_the_exercise_runs_on_2_and_4_ranks_with_hidden_tests():
    found = gs.assert_tasks_graded_on_2_and_4_ranks(SLUG)
    assert all("on_ranks(" in found[task] for task in ("task1-tests", "task2-tests", "task3-tests"))
    assert "timeout=TIMEOUT" in found["setup"]
    assert "(2, 4, s + 10)" in gs.hidden_part(found["task2-tests"]), "1F1B with m < p is hidden"
    for question in "abcd":
        assert "### BEGIN HIDDEN TESTS" in found[f"concept-{question}-tests"], question


# -- the notebook's checks, run here on wrong answers ---------------------------------------------

def notebook_namespace(answers: dict, timeout: float | None = None) -> dict:
    """The setup cell, the given answer cells and the test cells' definitions (not their calls), run here."""
    found = gs.grade_cells(SLUG)
    namespace = {"__name__": "__chapter06_notebook__"}
    exec(compile(found["setup"], "<setup>", "exec"), namespace)  # noqa: S102 - our own notebook
    if timeout is not None:
        namespace["TIMEOUT"] = timeout
    for task in ("task1", "task2", "task3"):
        exec(compile(answers.get(f"{task}-answer", found[f"{task}-answer"]), f"<{task}-answer>", "exec"), namespace)  # noqa: S102
        definitions = gs.visible_part(found[f"{task}-tests"]).split("\ncheck_task")[0]   # as in a student's kernel
        exec(compile(definitions, f"<{task}-tests>", "exec"), namespace)  # noqa: S102
    return namespace


GPIPE_AS_1F1B = '''
def one_f_one_b_step(stage, inputs, targets):
    """Right loss and gradients, but every forward before the first backward: that is GPipe."""
    rank = PipelineRank(stage, inputs, targets)
    for i in range(rank.m):
        rank.forward(i)
    for i in range(rank.m):
        rank.backward(i)
    return rank.finish()
'''

BLOCKING_SENDS = (  # the solution's two isends, as blocking sends
    ("            self.sends.append((dist.isend(activation, dst=self.s + 1), activation))\n",
     "            dist.send(activation, dst=self.s + 1)\n"),
    ("            self.sends.append((dist.isend(x.grad, dst=self.s - 1), x.grad))\n",
     "            dist.send(x.grad, dst=self.s - 1)\n"))


def test_gpipe_submitted_as_1f1b_fails_and_blocking_sends_deadlock_into_a_timeout():
    from distlab import DistTimeout
    from distlab.grade import checks

    task1 = gs.grade_cells(SLUG)["task1-answer"]
    for old, new in BLOCKING_SENDS:
        assert old in task1, "the solution's sends changed: update this test"
        task1 = task1.replace(old, new)
    gpipe = notebook_namespace({"task2-answer": GPIPE_AS_1F1B})
    blocking = notebook_namespace({"task1-answer": task1}, timeout=8)
    with distlab.Pool(2, backend="relay"):   # warm relay ranks, as in the grader (the deadlock, last, ends them)
        with pytest.raises(checks.CheckFailed, match=r"rank 0 held the activations of 4 micro-batches at once"):
            gpipe["check_task2"]([(4, 8, 2)], nprocs=2)
        blocking["check_task1"]([(4, 8, 1)], nprocs=2)        # GPipe runs with blocking sends
        start = time.monotonic()
        with pytest.raises(DistTimeout, match=r"blocked in send") as caught:
            blocking["check_task2"]([(4, 8, 2)], nprocs=2)    # 1F1B's neighbours send to each other at once
        assert time.monotonic() - start < 8 + 10, caught.value   # the test's timeout, plus ending the ranks


# -- one plausible student through the grader ------------------------------------------------------

LOSS_NOT_DIVIDED = ("            out = loss_of(out, self.targets[i]) / self.m   # m shares add up to the full batch's mean\n",
                    "            out = loss_of(out, self.targets[i])            # each micro-batch's mean, summed\n")

ONE_WARMUP_TOO_MANY = ("min(rank.p - 1 - rank.s, rank.m)", "min(rank.p - rank.s, rank.m)")

OWN_SPANS_ONLY = '''
def bubble_fraction(spans):
    """This rank's own idle fraction, between its own first start and last end: no other rank counted."""
    busy = sum(end - start for start, end in spans)
    length = max(end for _, end in spans) - min(start for start, _ in spans)
    return 1.0 - busy / length
'''


test_plausible_wrong_answers_score_zero_on_their_task = gs.wrong_answers_test(
    SLUG, {"task1-answer": LOSS_NOT_DIVIDED, "task2-answer": ONE_WARMUP_TOO_MANY, "task3-answer": OWN_SPANS_ONLY},
    {"task1-tests": "a loss not divided by the number of micro-batches",
     "task2-tests": "a 1F1B with one warm-up forward too many", "task3-tests": "a bubble from one rank's own spans"},
    reasons=("the loss the last stage (rank 1) returned (the mean over the whole batch) is off",
             "rank 0 held the activations of 3 micro-batches at once", "the step's idle fraction is off"))

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_test_helpers_accept_the_reference_on_every_micro_batch_count():
    """Tasks 1 and 2's checks, run on the solution with one micro-batch (the naive pipeline), an
    odd count and one sequence per micro-batch; Task 3's on a timeline with unequal stages and
    one starting at 0."""
    nb = gs.notebook_definitions(SLUG)
    with distlab.Pool(2, backend="relay"):
        for m, batch_size in ((1, 1), (1, 4), (3, 6), (8, 8)):
            nb["check_task1"]([(m, batch_size, 11)], nprocs=2)
            nb["check_task2"]([(m, batch_size, 12)], nprocs=2)
        uneven = nb["timeline"](nb["gpipe_order"](2, 3), [0.01, 0.03], [0.02, 0.05], start=1e5)
        nb["check_task3"]([("GPipe, unequal stages", uneven, None),
                           ("the naive pipeline from 0", nb["timeline"](nb["gpipe_order"](2, 1), start=0.0), 1 / 2)],
                          nprocs=2)


# -- issue 43: graded ranks talk through the grader's relay, which records every message ---------

def one_f_one_b_order(p, m):
    """Each stage's 1F1B order (the task's text): p - 1 - s warm-up forwards, then F and B in turn."""
    orders = []
    for s in range(p):
        warmup = min(p - 1 - s, m)
        order = [f"F{i}" for i in range(warmup)]
        for j in range(m - warmup):
            order += [f"F{warmup + j}", f"B{j}"]
        orders.append(order + [f"B{j}" for j in range(m - warmup, m)])
    return orders


@pytest.mark.parametrize("p", [2, 4])
def test_the_relays_record_of_the_solution_is_the_schedule_exactly(p):
    """GPipe and 1F1B of the solution, through the notebook's own runner (on the relay): each stage's
    messages, in its own order, are its schedule's (to whom, how many bytes), and the chapter's check
    of the record accepts them; m below, at and above p, and micro-batches of unequal size."""
    from distlab.relay import record

    nb = gs.notebook_definitions(SLUG)
    cases = [(3, 6, 1), (p, 2 * p, 2), (5, 9, 3)]      # 9 rows in 5 micro-batches: 2, 2, 2, 2, 1
    sizes = nb["message_sizes"](cases)
    assert sizes[-5:] == [2 * 16 * 32 * 4] * 4 + [16 * 32 * 4]
    with distlab.Pool(p, backend="relay"):
        for step, orders_of in (("gpipe_step", lambda m: nb["gpipe_order"](p, m)),
                                ("one_f_one_b_step", lambda m: one_f_one_b_order(p, m))):
            with record.capture() as seen:
                runs = nb["on_ranks"](nb["one_step"], (nb[step],), cases, p)
            schedule, start = [], 0
            for m, _, _ in cases:
                schedule += record.pipeline_schedule(orders_of(m), sizes[start:start + m])
                start += m
            assert record.by_sender(seen.messages()) == record.by_sender(schedule), step
            assert runs.record.entries == seen.entries and seen.collectives() == []
            nb["relay_checks"].assert_pipeline_messages(runs, p, sizes, what=step)
            for case, results in zip(cases, runs):
                assert [r["order"] for r in results] == orders_of(case[0]), step


def test_a_stage_that_talks_past_its_neighbour_or_skips_a_gradient_fails_the_record_check():
    """The check on made-up records: a message from stage 0 to stage 2, and a stage that sends one
    gradient fewer, each fail with the stage and what the schedule sends."""
    from distlab.grade import relay_checks
    from distlab.relay import record

    def results_with(messages):
        run = type("Run", (list,), {})()
        run.record, run.wire = record.Record(list(messages)), None
        return run

    sizes = [100, 100]
    right = [record.Message(s, d, b) for s, d, b in record.pipeline_schedule(one_f_one_b_order(3, 2), sizes)]
    relay_checks.assert_pipeline_messages(results_with(right), 3, sizes)
    with pytest.raises(checks_failed(), match=r"rank 0 sent 100 bytes to rank 2; a stage sends to its neighbours"):
        relay_checks.assert_pipeline_messages(results_with(right + [record.Message(0, 2, 100)]), 3, sizes)
    last_gradient = [m for m in right if (m.src, m.dst) == (2, 1)][-1]
    fewer = [m for m in right if m is not last_gradient]
    with pytest.raises(checks_failed(), match=r"rank 2 sent rank 1 1 messages of \[100\] bytes"):
        relay_checks.assert_pipeline_messages(results_with(fewer), 3, sizes)
    with pytest.raises(checks_failed(), match=r"built-in collectives \(all_reduce\)"):
        relay_checks.assert_pipeline_messages(
            results_with(right + [record.Collective("all_reduce", (0, 1, 2), (0, 0, 0), (8, 8, 8))]), 3, sizes)


def checks_failed():
    from distlab.grade.checks import CheckFailed

    return CheckFailed


ACTIVATIONS_OVER_A_GLOO_GROUP_OF_ITS_OWN = (  # the solution's messages, carried by a gloo group of the ranks' own
    ("class PipelineRank:\n", '''_side = {}


def side_group():
    """A gloo process group of the ranks' own, on a TCPStore of their own: a channel around the relay."""
    import datetime
    p, s = world()
    if p not in _side:
        store = dist.TCPStore("127.0.0.1", 29851 + p, p, s == 0, timeout=datetime.timedelta(seconds=20))
        _side[p] = dist.ProcessGroupGloo(store, s, p, datetime.timedelta(seconds=20))
    return _side[p]


class PipelineRank:
'''),
    ("            dist.recv(x, src=self.s - 1)\n",
     "            side_group().recv([x], self.s - 1, 0).wait()\n"
     "            dist.recv(torch.empty_like(x), src=self.s - 1)          # the relay's copy: zeros\n"),
    ("            self.sends.append((dist.isend(activation, dst=self.s + 1), activation))\n",
     "            side_group().send([activation], self.s + 1, 0).wait()\n"
     "            zeros = torch.zeros_like(activation)                    # the right size, for the record\n"
     "            self.sends.append((dist.isend(zeros, dst=self.s + 1), zeros))\n"))

SPANS_GATHERED_AROUND_THE_RECORDER = '''
def bubble_fraction(spans):
    """Every rank's spans gathered with a built-in all_gather called around the rank's own recorder
    (comm.original): right values, and the rank's record shows no call at all."""
    from distlab.tools import comm
    p = dist.get_world_size()
    mine = torch.zeros(64, 2, dtype=torch.float64)
    mine[: len(spans)] = torch.tensor(spans, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(p)]
    comm.original("all_gather")(everyone, mine)
    rows = [row for table in everyone for row in table.tolist() if row != [0.0, 0.0]]
    busy = sum(end - start for start, end in rows)
    return 1.0 - busy / (p * (max(end for _, end in rows) - min(start for start, _ in rows)))
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_task_1_over_a_gloo_group_of_its_own_and_task_3_gathered_around_the_recorder_score_zero(tmp_path):
    """Task 1's activations over a gloo group the ranks make from a TCPStore of their own, with zeros
    of the right sizes through the relay so the record looks right: each graded rank has no network
    at all, so the store is unreachable. Task 3's spans gathered with a built-in all_gather around
    the rank's recorder: right values, but the grader's network saw the all_gather."""
    solution = gs.solution_answers(SLUG)
    task1 = solution["task1-answer"]
    for old, new in ACTIVATIONS_OVER_A_GLOO_GROUP_OF_ITS_OWN:
        assert old in task1, "the solution's Task 1 changed: update this test"
        task1 = task1.replace(old, new, 1)
    gs.assert_wrong_answers_lose_only_their_tasks(
        tmp_path, SLUG, dict(solution, **{"task1-answer": task1, "task3-answer": SPANS_GATHERED_AROUND_THE_RECORDER}),
        {"task1-tests": "activations over a gloo group of the ranks' own", "task3-tests": "spans gathered"},
        reasons=("Network is unreachable", "bubble_fraction: rank 0 called all_gather"))
