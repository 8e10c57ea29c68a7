"""distlab.pipeline_parallel against the single-process reference, the bubble formulas and torch.distributed.pipelining.

Every rank builds TinyGPT (8 blocks) from the same seed as the reference and keeps its chunks;
each schedule runs one step on the full batch of 8 sequences cut into micro-batches. The
gradients of all ranks together must be the single-process full-batch gradients, name by name.

Tolerances (float32; see distlab.grade.checks):

* Gradients: ``checks.assert_gradients_match`` (1e-5 of each parameter's largest gradient).
  A pipeline adds ``m`` micro-batch gradients where one process sums one batch (the same terms
  in another order): measured at most 7.7e-7 of the largest on 2 and 4 ranks, for ours and
  torch's schedules alike (the naive schedule, one micro-batch: bitwise equal), a 13x margin.
  Forgetting to divide each micro-batch's loss by ``m`` is off by a factor ``m``; a lost
  micro-batch by ``1/m`` of everything.
* Loss: relative 1e-6 (measured: bitwise equal on 2 and 4 ranks).
* The model (:func:`pp_timeline.simulate`) is exact arithmetic on the same action lists: its
  bubble must equal the textbook formulas to 1e-12, its in-flight counts the executor's exactly.
* Measured timelines (``delay`` of pretend compute per action; the machine has 2 cores and is
  shared with other tests, so times are noisy): only what holds under any load is asserted.
  On the shared clock no action starts before what it needs has finished; the idle fraction is
  not below the model's by more than 0.05 (messages cost time, they never save it); the naive
  schedule idles more than GPipe (model: 0.5 vs 0.2 on 2 ranks, 0.75 vs 0.43 on 4).

One ``distlab.Pool`` per world size and one call per pool that runs every schedule (ours and
torch's), the timed runs and the bad inputs (caught on the ranks, so the pools stay up). The
mismatched-schedule test runs last: its timeout throws its pool away. File: 23 s on the
2-core machine when quiet, 50-65 s while other tests load it (load average 10-14).

Checked to fail when the implementation is broken (each a one-line change, and the test that
caught it): each micro-batch's loss not divided by ``m``, the zero-bubble W pass skipped, and
``_accumulate`` overwriting ``.grad`` instead of adding (the one-process gradients); a stage
passing on the gradient it received instead of its input's (the 2-rank gradients); a 1F1B
warm-up of ``p - s`` forwards instead of ``p - 1 - s`` (the hand-written order, and the in-flight
bound on the ranks); ZB-H1 holding back ``p - 1 - s`` W's instead of ``s`` (the order, and the
modelled bubble is no longer the formula); the interleaved backward visiting its chunks in
forward order (the order, and the model finds a deadlock).
"""

from __future__ import annotations

import functools
import time

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import distlab  # noqa: E402
from distlab import models  # noqa: E402
from distlab.grade import checks
from distlab.pipeline_parallel import measured_model, schedules, stages, torch_pipelining, training
from distlab.pipeline_parallel import timeline as pp_timeline
from distlab.pipeline_parallel.schedules import Action  # noqa: E402

WORLD_SIZES = (2, 4)
CONFIG = {"layers": 8}          # 8 blocks: 2 or 4 stages, or 8 chunks for interleaved on 4 ranks
BATCH, M = 8, 4
DELAY = 0.03                    # seconds of pretend compute per forward in the timed runs
OURS = {                        # run name: (schedule, micro-batches, chunks per rank)
    "naive": ("naive", 1, 1), "gpipe": ("gpipe", M, 1), "1f1b": ("1f1b", M, 1),
    "1f1b m=2": ("1f1b", 2, 1), "interleaved": ("interleaved", M, 2), "zb-h1": ("zb-h1", M, 1),
}
TIMED = ("naive", "gpipe")


def batch():
    return models.example_batch("gpt", BATCH, seed=1, **CONFIG)


@functools.lru_cache(maxsize=1)
def reference():
    """The single-process full-batch gradients and loss (one thread: see one_thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = models.build("gpt", seed=0, **CONFIG)
        return models.reference_gradients(model, batch()), models.loss_fn(model, batch()).item()
    finally:
        torch.set_num_threads(threads)


# -- what runs on every rank -------------------------------------------------------------------------

def _every_schedule(data):
    """Our schedules, torch's, the timed runs, and the bad inputs (their messages), on this rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    out = {"ours": {}, "torch": {}, "timed": {}, "errors": {}}
    for run, (name, m, v) in OURS.items():
        out["ours"][run] = training.train_step(name, data, m, v, **CONFIG)
    for name in torch_pipelining.TORCH_SCHEDULES:
        out["torch"][name] = torch_pipelining.torch_pipeline_step(name, data, M, **CONFIG)
    if world == 4:   # two pipelines of 2 stages side by side: ranks 0 -> 2 and 1 -> 3
        groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        out["ours"]["1f1b, group"] = training.train_step("1f1b", data, M, group=groups[dist.get_rank() % 2], **CONFIG)
    for name in TIMED:
        m = OURS[name][1]
        out["timed"][name] = training.train_step(name, data, m, delay=DELAY, **CONFIG)
    bad = {
        "schedule for another world size": lambda: training.train_step(
            schedules.make_schedule("gpipe", world + 1, M), data, M, **CONFIG),
        "micro-batches do not divide the batch": lambda: training.train_step("gpipe", data, 3, **CONFIG),
        "layers do not divide into stages": lambda: training.train_step("gpipe", data, M, layers=3),
        "interleaved m not a multiple of p": lambda: training.train_step("interleaved", data, world // 2, 2, **CONFIG),
        "torch: micro-batches do not divide": lambda: torch_pipelining.torch_pipeline_step("gpipe", data, 3, **CONFIG),
    }
    for what, call in bad.items():
        try:
            call()
            out["errors"][what] = "no error"
        except ValueError as exc:
            out["errors"][what] = f"ValueError: {exc}"
    return out


@pytest.fixture
def one_thread():
    """Tiny tensors: in this process, extra threads only fight over the 2 cores (10x slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)



@pytest.fixture(scope="module")
def runs(pools):
    """{world size: per-rank results of _every_schedule}, computed once for the tests below."""
    return {n: distlab.run(_every_schedule, batch(), nprocs=n, timeout=120) for n in WORLD_SIZES}


def _merged(per_rank) -> dict:
    """All ranks' gradients in one dict; each parameter must come from exactly one rank."""
    merged = {}
    for result in per_rank:
        assert not set(merged) & set(result.grads), f"two ranks hold {set(merged) & set(result.grads)}"
        merged.update(result.grads)
    return merged


# -- correctness --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", WORLD_SIZES)
def test_every_schedule_gives_the_single_process_gradients_and_loss(runs, n):
    ref_grads, ref_loss = reference()
    for family in ("ours", "torch"):
        for run in runs[n][0][family]:
            if run == "1f1b, group":
                continue
            per_rank = [result[family][run] for result in runs[n]]
            grads = _merged(per_rank)
            assert sorted(grads) == sorted(ref_grads), (family, run)
            checks.assert_gradients_match([grads], ref_grads)
            losses = [r.loss for r in per_rank if r.loss is not None]
            assert len(losses) == 1, (family, run, "one rank holds the last chunk and the loss")
            assert losses[0] == pytest.approx(ref_loss, rel=1e-6), (family, run)
    # torch's V-shaped schedule puts the last chunk (and the loss) on rank 0; ours on the last rank
    assert runs[n][0]["torch"]["zbv"].loss is not None and runs[n][-1]["ours"]["1f1b"].loss is not None


def test_two_pipelines_side_by_side_in_their_own_groups(runs):
    """On 4 ranks, pipelines {0, 2} and {1, 3}: each one's gradients are the reference's."""
    ref_grads, _ = reference()
    for members in ([0, 2], [1, 3]):
        per_rank = [runs[4][r]["ours"]["1f1b, group"] for r in members]
        assert [r.rank for r in per_rank] == [0, 1]               # the rank within the pipeline group
        checks.assert_gradients_match([_merged(per_rank)], ref_grads)
        assert per_rank[1].loss is not None and per_rank[0].loss is None


def test_one_process_runs_every_schedule_on_its_own_chunks(one_thread):
    """World size 1 (no process group): all chunks on one rank, handed over locally, same gradients."""
    ref_grads, ref_loss = reference()
    for name, m, v in [("gpipe", 4, 1), ("1f1b", 8, 1), ("interleaved", 4, 4), ("zb-h1", 2, 1)]:
        result = training.train_step(name, batch(), m, v, **CONFIG)
        checks.assert_gradients_match([result.grads], ref_grads)
        assert result.loss == pytest.approx(ref_loss, rel=1e-6)


# -- schedules, memory and the model ------------------------------------------------------------------

def _order(schedule):
    return [" ".join(map(str, actions)) for actions in schedule]


def test_1f1b_and_zb_h1_action_order():
    assert _order(schedules.make_schedule("1f1b", 4, 6)) == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    ]
    assert _order(schedules.make_schedule("gpipe", 2, 3)) == ["F0 F1 F2 B0 B1 B2"] * 2
    assert _order(schedules.make_schedule("zb-h1", 2, 4)) == [
        "F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3",
        "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3",
    ]
    interleaved = schedules.make_schedule("interleaved", 2, 2, 2)
    assert [[(a.kind, a.micro, a.chunk) for a in actions] for actions in interleaved] == [
        [("F", 0, 0), ("F", 1, 0), ("F", 0, 2), ("F", 1, 2), ("B", 0, 2), ("B", 1, 2), ("B", 0, 0), ("B", 1, 0)],
        [("F", 0, 1), ("F", 1, 1), ("F", 0, 3), ("B", 0, 3), ("F", 1, 3), ("B", 1, 3), ("B", 0, 1), ("B", 1, 1)],
    ]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_ranks_ran_their_actions_in_order_and_held_what_the_schedule_says(runs, n):
    for run, (name, m, v) in OURS.items():
        schedule = schedules.make_schedule(name, n, m, v)
        modelled = pp_timeline.simulate(schedule)
        for rank, result in enumerate(r["ours"][run] for r in runs[n]):
            assert result.actions == schedule[rank], (run, rank)
            assert [e.name for e in result.events] == [e.name for e in modelled.events[rank]], (run, rank)
            assert result.peak_in_flight == modelled.peak_in_flight[rank], (run, rank)
    for rank in range(n):
        ours = runs[n][rank]["ours"]
        assert ours["gpipe"].peak_in_flight == M                                  # GPipe: all m
        assert ours["1f1b"].peak_in_flight == min(n - rank, M)                    # 1F1B: p - s
        assert ours["1f1b m=2"].peak_in_flight == min(n - rank, 2)
        assert ours["zb-h1"].peak_in_flight == min(n, M)                          # ZB-H1: p everywhere
        # the same stage keeps the same bytes per micro-batch, so bytes scale with the count
        gpipe, one_f = ours["gpipe"].peak_activation_bytes, ours["1f1b"].peak_activation_bytes
        assert gpipe > 0 and gpipe * min(n - rank, M) == one_f * M, (rank, gpipe, one_f)


def test_modelled_bubble_equals_the_formula():
    for p in (1, 2, 3, 4, 8):
        assert pp_timeline.simulate(schedules.make_schedule("naive", p, 1)).bubble == pytest.approx((p - 1) / p, abs=1e-12)
        for m in (1, 2, 4, 5, 8, 16):
            for name in ("gpipe", "1f1b", "zb-h1") if m >= p else ("gpipe", "1f1b"):   # ZB-H1: m >= p
                modelled = pp_timeline.simulate(schedules.make_schedule(name, p, m)).bubble
                assert modelled == pytest.approx(pp_timeline.bubble_formula(name, p, m), abs=1e-12), (name, p, m)
            for v in (2, 3):
                if m % p == 0:
                    modelled = pp_timeline.simulate(schedules.make_schedule("interleaved", p, m, v)).bubble
                    assert modelled == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, m, v)
    assert pp_timeline.bubble_formula("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert pp_timeline.bubble_formula("zb-h1", 4, 8) == pytest.approx(3 / 27)
    # zero bubble with other costs (W cheaper than F): still the paper's (p-1)(F+I-W) / ...
    for forward, backward, weight in [(1, 1, 0.5), (1, 2, 1), (1, 1.5, 0.5)]:
        modelled = pp_timeline.simulate(schedules.make_schedule("zb-h1", 4, 8), forward, backward, weight).bubble
        assert modelled == pytest.approx(pp_timeline.bubble_formula("zb-h1", 4, 8, 1, forward, backward, weight))


SCHEDULE_SHAPES = [("gpipe", 4, 1), ("1f1b", 8, 1), ("interleaved", 8, 2), ("zb-h1", 8, 1)]


def test_extended_model_reads_back_the_costs_a_timeline_was_made_with():
    """Timelines simulated with a known hand-off and overhead are "measured" by the model:
    it finds both costs and every stage's compute time, and predicts the bubble they had."""
    hand_off, overhead = 0.004, 0.001
    runs = []
    for name, m, v in SCHEDULE_SHAPES:
        schedule = schedules.make_schedule(name, 4, m, v)
        made = pp_timeline.simulate(schedule, 0.02, 0.02, 0.02, hand_off=hand_off, overhead=overhead)
        runs.append((schedule, [made.events, made.events], made.bubble))
    measured_hand_off, measured_overhead = measured_model.message_costs([(s, steps) for s, steps, _ in runs])
    assert measured_hand_off == pytest.approx(hand_off, rel=1e-6)
    assert measured_overhead == pytest.approx(overhead, rel=1e-6)
    for schedule, steps, bubble in runs:
        virtual = len({a.chunk for a in schedule[0]})
        assert measured_model.action_durations(schedule, steps)[("F", 0)] == pytest.approx(0.02 / virtual)
        predicted = measured_model.predicted_bubble(schedule, steps, measured_hand_off, measured_overhead)
        assert predicted == pytest.approx(bubble, rel=1e-6)
        # with free messages the model is the textbook formula again: the formula is its limit
        free = measured_model.predicted_bubble(schedule, steps, 0.0, 0.0)
        assert free < bubble


def test_extended_model_is_the_formula_when_messages_are_free():
    for name, m, v in SCHEDULE_SHAPES:
        schedule = schedules.make_schedule(name, 4, m, v)
        steps = [pp_timeline.simulate(schedule).events]
        assert measured_model.predicted_bubble(schedule, steps, 0.0, 0.0) == pytest.approx(
            pp_timeline.bubble_formula(name, 4, m, v), abs=1e-12)


def test_extended_model_refuses_events_of_another_schedule():
    steps = [pp_timeline.simulate(schedules.make_schedule("gpipe", 2, 4)).events]
    with pytest.raises(ValueError, match="rank 0's events are not its schedule's actions"):
        measured_model.action_durations(schedules.make_schedule("1f1b", 2, 4), steps)


def test_modelled_timeline_draws_one_bar_per_action():
    timeline = pp_timeline.simulate(schedules.make_schedule("zb-h1", 4, 4))
    assert timeline.length == 15 and timeline.peak_in_flight == [4, 4, 4, 4]
    ax = pp_timeline.draw(timeline.events, unit="s")
    assert len(ax.patches) == 4 * 4 * 3
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r} stage {r}" for r in range(4)]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_measured_timelines_respect_dependencies_and_show_the_bubble(runs, n):
    for family in ("ours", "timed"):
        for run in runs[n][0][family]:
            if run == "1f1b, group":
                continue
            per_rank = [r[family][run] for r in runs[n]]
            ended = {}
            for result in per_rank:
                for action, event in zip(result.actions, result.events):
                    ended[tuple(action)] = event.end
            chunks = n * OURS[run][2]
            split = any(a.kind in "IW" for a in per_rank[0].actions)
            for result in per_rank:
                for action, event in zip(result.actions, result.events):
                    for need in pp_timeline.dependencies(action, chunks, split):
                        assert event.start >= ended[need], (run, action, need)
    measured = {name: pp_timeline.bubble_fraction([r["timed"][name].events for r in runs[n]]) for name in TIMED}
    for name in TIMED:
        schedule = schedules.make_schedule(name, n, OURS[name][1])
        assert measured[name] >= pp_timeline.simulate(schedule).bubble - 0.05, (name, measured)
        assert measured[name] < 1
    assert measured["naive"] > measured["gpipe"], measured
    # The extended model reads real traces: a message takes time, and predictions are bubbles.
    runs_of = {name: (schedules.make_schedule(name, n, OURS[name][1]), [[r["timed"][name].events for r in runs[n]]])
               for name in TIMED}
    hand_off, overhead = measured_model.message_costs(runs_of.values())
    assert hand_off > 0 and overhead >= 0, (hand_off, overhead)
    for name, (schedule, steps) in runs_of.items():
        assert 0 < measured_model.predicted_bubble(schedule, steps, hand_off, overhead) < 1, name


# -- errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", WORLD_SIZES)
def test_bad_inputs_raise_clear_value_errors_on_the_ranks(runs, n):
    errors = runs[n][0]["errors"]
    assert f"for {n + 1} pipeline ranks, but {n} ranks" in errors["schedule for another world size"]
    assert "does not split into 3 equal micro-batches" in errors["micro-batches do not divide the batch"]
    assert f"3 layers do not split evenly into {n} pipeline chunks" in errors["layers do not divide into stages"]
    assert f"multiple of {n}" in errors["interleaved m not a multiple of p"]
    assert "does not split into 3" in errors["torch: micro-batches do not divide"]


def test_bad_inputs_raise_value_errors_in_one_process(one_thread):
    cases = [
        (lambda: schedules.make_schedule("pipedream", 2, 4), "unknown schedule"),
        (lambda: schedules.make_schedule("naive", 2, 4), "micro_batches must be 1"),
        (lambda: schedules.make_schedule("1f1b", 2, 4, virtual=2), "only the interleaved"),
        (lambda: schedules.make_schedule("gpipe", 0, 4), "stages must be a positive integer"),
        (lambda: schedules.make_schedule("interleaved", 4, 6, 2), "multiple of 4"),
        (lambda: stages.split_gpt(models.build("gpt", layers=2), 4), "do not split evenly into 4"),
        (lambda: stages.micro_batches_of(batch(), 0), "does not split into 0"),
        (lambda: pp_timeline.bubble_formula("pipedream", 2, 4), "unknown schedule"),
        (lambda: training.train_step("gpipe", batch(), 5, **CONFIG), "does not split into 5"),
        # world size 1 here: a schedule for 2 ranks does not fit
        (lambda: training.train_step(schedules.make_schedule("gpipe", 2, M), batch(), M, **CONFIG),
         "for 2 pipeline ranks, but 1 ranks"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="needs stages built with zero_bubble=True"):
        training.run_step(training.build_chunks(**CONFIG), schedules.make_schedule("zb-h1", 1, M), batch(), M)
    with pytest.raises(ValueError, match="defer their weight gradients"):
        training.run_step(training.build_chunks(zero_bubble=True, **CONFIG), schedules.make_schedule("gpipe", 1, M),
                          batch(), M)
    schedule = schedules.make_schedule("1f1b", 2, 4)
    with pytest.raises(ValueError, match=r"rank 1's actions are not one of each: missing \[Action\(kind='B', micro=0"):
        schedules.check_schedule([schedule[0], [a for a in schedule[1] if a != Action("B", 0, 1)]], 4, 2)
    with pytest.raises(ValueError, match="repeated"):
        schedules.check_schedule([schedule[0], schedule[1] + [Action("F", 0, 1)]], 4, 2)


DEADLOCK = [  # every action present, in an order that cannot work: rank 1 waits for F1 before B0
    [Action("F", 0, 0), Action("B", 0, 0), Action("F", 1, 0), Action("B", 1, 0)],
    [Action("F", 0, 1), Action("F", 1, 1), Action("B", 0, 1), Action("B", 1, 1)],
]


def test_the_model_finds_a_deadlocking_schedule():
    schedules.check_schedule(DEADLOCK, 2, 2)                    # complete: the counting check passes
    with pytest.raises(ValueError, match="deadlocks: rank 0: B0 .* waits for B0 on chunk 1; rank 1: F1 .* waits for F1 on chunk 0"):
        pp_timeline.simulate(DEADLOCK)


def _deadlocked_step(data):
    return training.train_step(DEADLOCK, data, 2, **CONFIG).loss


def test_a_deadlocking_schedule_times_out_instead_of_hanging(pools):
    """Last in the file: the timeout throws the 2-rank pool away."""
    start = time.monotonic()
    with pytest.raises(distlab.DistTimeout) as caught:
        distlab.run(_deadlocked_step, batch(), nprocs=2, timeout=3)
    assert time.monotonic() - start < 20
    states = caught.value.rank_states
    assert "irecv" in states[0] and "irecv" in states[1], states
