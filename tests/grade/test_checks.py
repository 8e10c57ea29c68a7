"""distlab.grade.checks, distlab.grade.boundary.forbid, distlab.grade.boundary.limits and the grader's safe loader."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from grading_support import try_each
from process_support import REPEAT_UNDER_LOAD, alive_with_marker

import distlab
from distlab.grade import checks
from distlab.grade.boundary import safeload
from distlab.runtime import options
from distlab.tools import comm_bytes, memory

# -- the data-only loader ------------------------------------------------------------------------


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/distlab-pwned-by-pickle",))


def test_safe_loader_reads_plain_data_and_marked_tensors():
    value = {"x": [1, 2.5, "a", None, (True,)], "t": safeload.encode(torch.arange(3.0))}
    loaded = safeload.loads(pickle.dumps(value))
    assert loaded["x"] == [1, 2.5, "a", None, (True,)]
    torch.testing.assert_close(loaded["t"], torch.arange(3.0))


def test_safe_loader_refuses_anything_that_could_run_code(tmp_path):
    target = "/tmp/distlab-pwned-by-pickle"
    if os.path.exists(target):
        os.remove(target)
    with pytest.raises(safeload.UnsafeData, match="refuses to load posix.system"):
        safeload.loads(pickle.dumps(_Evil()))
    with pytest.raises(safeload.UnsafeData):
        safeload.loads(pickle.dumps(torch.ones(2)))  # an unmarked tensor needs torch's globals
    assert not os.path.exists(target)
    with pytest.raises(TypeError, match="plain data"):
        safeload.encode(_Evil())


# -- values, gradients, communication, memory ------------------------------------------------------

def test_tensor_close_message_names_the_error_and_tolerance_but_not_the_reference():
    expected = torch.tensor([[1.25, 2.5], [3.75, 5.125]])
    actual = expected.clone()
    actual[1, 0] += 0.5
    with pytest.raises(checks.CheckFailed) as err:
        checks.assert_tensor_close(actual, expected, name="the mean on rank 3")
    message = str(err.value)
    assert "the mean on rank 3" in message and "max abs error 0.5" in message and "(1, 0)" in message
    assert "max rel error" in message and "atol=" in message and "rtol=" in message
    for value in ("1.25", "3.75", "5.125"):
        assert value not in message
    with pytest.raises(checks.CheckFailed, match="dtype torch.float64"):
        checks.assert_tensor_close(expected.double(), expected)
    with pytest.raises(checks.CheckFailed, match=r"shape \(4,\)"):
        checks.assert_tensor_close(expected.flatten(), expected)
    with pytest.raises(checks.CheckFailed, match="NaN"):
        checks.assert_tensor_close(expected * float("nan"), expected)
    checks.assert_tensor_close(expected * (1 + 1e-7), expected)  # reordering-sized error passes
    # a sum that cancels: judge the error against the terms' size, not the tiny result
    terms = torch.tensor([0.3, -0.2, -0.093])
    with pytest.raises(checks.CheckFailed):
        checks.assert_tensor_close(terms.sum() + 3e-8, terms.sum())
    checks.assert_tensor_close(terms.sum() + 3e-8, terms.sum(), scale=0.3 * 3)


def test_gradient_check_names_parameter_and_rank():
    reference = {"weight": torch.ones(2, 2), "bias": torch.ones(2)}
    ok = {"weight": torch.ones(2, 2) + 1e-8, "bias": torch.ones(2)}
    wrong = {"weight": torch.ones(2, 2), "bias": torch.ones(2) * 2}
    checks.assert_gradients_match([ok, ok], reference)
    with pytest.raises(checks.CheckFailed, match=r"gradient of `bias` on rank 1 is off: max abs error 1"):
        checks.assert_gradients_match([ok, wrong], reference)
    with pytest.raises(checks.CheckFailed, match="rank 0: no gradient for parameter"):
        checks.assert_gradients_match([{"weight": torch.ones(2, 2)}], reference)


def test_optimizer_tolerances_follow_the_learning_rate():
    assert checks.optimizer_tolerance("adamw", lr=1e-2, steps=3) == pytest.approx(3e-2)
    assert checks.optimizer_tolerance("sgd", lr=1e-2, steps=3) < 1e-6
    with pytest.raises(ValueError):
        checks.optimizer_tolerance("lion", lr=1.0, steps=1)


def test_comm_assertions_count_calls_and_bytes():
    log = [{"op": "all_reduce", "sent": 6, "received": 6, "group_size": 2}]
    checks.assert_comm([log, log], calls={"all_reduce": 1}, max_bytes_sent=comm_bytes.all_reduce_bytes(12, 2))
    with pytest.raises(checks.CheckFailed, match=r"rank 0 made these distributed calls: all_reduce x1; the exercise asks for all_gather x1"):
        checks.assert_comm([log], calls={"all_gather": 1})
    with pytest.raises(checks.CheckFailed, match="rank 1 sent 18 bytes"):
        checks.assert_comm([log, [{"op": "all_gather", "sent": 18, "received": 18, "group_size": 4}]],
                           max_bytes_sent=comm_bytes.all_reduce_bytes(12, 2))
    assert comm_bytes.all_reduce_bytes(1024, 4) == 1536


def test_memory_counts_parameters_gradients_and_optimizer_state():
    model = torch.nn.Linear(10, 5)  # 55 parameters, 220 bytes
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    counted = memory.model_state_bytes(model, optimizer)
    assert counted["parameters"] == 220 and counted["gradients"] == 220
    assert counted["optimizer"] == 2 * 220 + 2 * 4  # exp_avg, exp_avg_sq, and a step counter per tensor
    checks.assert_memory([counted], {"parameters": 220, "gradients": 220})
    with pytest.raises(checks.CheckFailed, match="rank 0 holds 448 bytes of optimizer"):
        checks.assert_memory([counted], {"optimizer": 220}, margin=0.5)


# -- on real ranks ---------------------------------------------------------------------------------

def _ddp_gradients(xs, ys):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(6, 3))
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = slice(rank * len(xs) // world, (rank + 1) * len(xs) // world)
    torch.nn.functional.mse_loss(model(xs[shard]), ys[shard]).backward()
    return {name.removeprefix("module."): p.grad for name, p in model.named_parameters()}


def test_torch_ddp_gradients_pass_the_gradient_check_and_a_missing_average_fails_it():
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
    torch.manual_seed(0)
    reference = torch.nn.Linear(6, 3)
    torch.nn.functional.mse_loss(reference(xs), ys).backward()
    grads = {name: p.grad for name, p in reference.named_parameters()}
    per_rank = distlab.run(_ddp_gradients, xs, ys, nprocs=2, timeout=90)
    checks.assert_gradients_match(per_rank, grads)  # ~1e-8 apart: well inside the tolerance
    summed = [{k: v * 2 for k, v in r.items()} for r in per_rank]  # forgot to divide by the world size
    with pytest.raises(checks.CheckFailed, match="rank 0 is off"):
        checks.assert_gradients_match(summed, grads)


def _try_everything():
    import subprocess

    import torch.distributed.distributed_c10d as c10d

    t = torch.ones(3)
    attempts = {
        "dist.all_reduce": lambda: dist.all_reduce(t),
        "c10d.all_reduce": lambda: c10d.all_reduce(t),
        "process group object": lambda: c10d._get_default_group().allreduce([t]).wait(),
        "dispatcher op": lambda: torch.ops.c10d.allreduce_([t]),
        "functional collective": lambda: __import__("torch.distributed._functional_collectives",
                                                    fromlist=["x"]).all_reduce(t, "sum", c10d._get_default_group()),
        "distlab.tools.comm.original": lambda: __import__("distlab.tools.comm", fromlist=["x"]).original("all_reduce")(t),
        "forbidden package": lambda: __import__("distlab.collectives", fromlist=["x"]).all_reduce,
        "module of a forbidden package": lambda: __import__("distlab.collectives.all_reduce",
                                                            fromlist=["x"]).naive_all_reduce(t),
        "source of a forbidden module": lambda: open(os.path.join(os.path.dirname(distlab.__file__), "collectives",
                                                                  "all_reduce.py")).read(),
        "listing a forbidden package": lambda: os.listdir(os.path.join(os.path.dirname(distlab.__file__),
                                                                       "collectives")),
        "protected file": lambda: open(os.path.join(os.path.dirname(distlab.__file__), "..", "..", "solutions",
                                                    "00-first-steps", "00-first-steps.ipynb")).read(),
        "start a process": lambda: subprocess.run(["true"]),
        "signal the parent": lambda: os.kill(os.getppid(), 0),
        "nested distlab.run": lambda: distlab.run(lambda: 1),
    }
    outcome = {}
    for what, attempt in attempts.items():
        try:
            attempt()
            outcome[what] = "ran"
        except Exception as exc:  # noqa: BLE001
            outcome[what] = f"{type(exc).__name__}: {exc}"
    attempts_on_path = {
        "forbidden package's file": lambda: __import__("distlab.collectives", fromlist=["x"]).__file__,
        "forbidden module's file": lambda: __import__("distlab.collectives.all_reduce", fromlist=["x"]).__file__,
    }
    for what, attempt in attempts_on_path.items():
        try:
            outcome[what] = f"ran: {attempt()}"
        except AttributeError as exc:
            outcome[what] = f"{type(exc).__name__}: {exc}"
    # Library code that only probes a forbidden module (inspect does, under torch's optimizers)
    # sees "no such attribute" and goes on: what is not forbidden still works.
    dist.broadcast(t, 0)
    layer = torch.nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().backward()
    torch.optim.Adam(layer.parameters()).step()
    outcome["broadcast"] = "ran"
    outcome["probe"] = hasattr(sys.modules["distlab.collectives"], "__file__")
    return outcome


def test_guard_forbids_apis_and_their_bypasses_files_processes_and_signals():
    solutions = os.path.join(os.path.dirname(distlab.__file__), "..", "..", "solutions")
    with options.rank_setup("distlab.grade.boundary.protect", "protect_rank", when="call", paths=[os.path.realpath(solutions)],
                           max_spawns=0, forbidden=["torch.distributed.all_reduce", "distlab.collectives"]):
        outcome = distlab.run(_try_everything, nprocs=2, timeout=90)[1]
    assert outcome.pop("broadcast") == "ran"
    assert outcome.pop("probe") is False
    for what, result in outcome.items():
        assert "not allowed in this exercise" in result, f"{what}: {result}"


DIR_FD_ATTACKS = r"""
import json, os, sys
from distlab.grade.boundary import protect

secret, work, allowed, notebook = sys.argv[1:5]
protect.deny_files([notebook])
protect.protect(paths=[secret, work], allowed=[allowed], guard_signals=False)
parent = os.open(os.path.dirname(secret), os.O_RDONLY)    # the folder above: not protected
here = os.open(allowed, os.O_RDONLY)                      # the kernel's own folder: allowed
os.chdir("/")                                             # relative paths now name other files
name = os.path.basename(secret)
attacks = {
    "read through the fd of the folder above": lambda: os.read(os.open(name + "/secret.txt", os.O_RDONLY,
                                                                       dir_fd=parent), 100),
    "create a verdict through it": lambda: os.open(name + "/verdict.json", os.O_CREAT | os.O_WRONLY, dir_fd=parent),
    "open the protected folder itself": lambda: os.open(name, os.O_RDONLY, dir_fd=parent),
    "read the notebook through the allowed folder's fd": lambda: os.read(
        os.open(os.path.basename(notebook), os.O_RDONLY, dir_fd=here), 100),
    "climb out of the allowed folder": lambda: os.read(os.open("../../../" + name + "/secret.txt", os.O_RDONLY,
                                                                dir_fd=here), 100),
    "mkdir through dir_fd": lambda: os.mkdir(name + "/planted", dir_fd=parent),
    "unlink through dir_fd": lambda: os.unlink(name + "/secret.txt", dir_fd=parent),
    "rename through dir_fd": lambda: os.rename(name + "/secret.txt", "stolen.txt", src_dir_fd=parent,
                                               dst_dir_fd=here),
    "fchdir above, then a relative path": lambda: (os.fchdir(parent), open(name + "/secret.txt").read()),
}
verdicts = {}
for what, attack in attacks.items():
    os.chdir("/")
    try:
        attack()
        verdicts[what] = "got through"
    except PermissionError as exc:
        verdicts[what] = "refused" if "not allowed" in str(exc) else repr(exc)
    except OSError as exc:
        verdicts[what] = repr(exc)
os.chdir("/")
verdicts["honest: a file of the allowed folder through its fd"] = os.read(
    os.open("answer.txt", os.O_RDONLY, dir_fd=here), 100).decode()
print(json.dumps(verdicts))
"""


def test_the_guard_resolves_paths_given_with_dir_fd_or_relative_to_another_folder(tmp_path):
    # After os.chdir elsewhere, os.open(name, dir_fd=<fd of a folder>) names a file the guard
    # never saw: the audit hook gets the bare name and resolved it against the current folder.
    import json
    import subprocess

    secret, work = tmp_path / "secret", tmp_path / "work"
    allowed = work / "autograded" / "student"
    secret.mkdir()
    allowed.mkdir(parents=True)
    (secret / "secret.txt").write_text("the hidden tests")
    (allowed / "notebook.ipynb").write_text("the hidden tests, restored")
    (allowed / "answer.txt").write_text("mine")
    done = subprocess.run([sys.executable, "-c", DIR_FD_ATTACKS, str(secret), str(work), str(allowed),
                           str(allowed / "notebook.ipynb")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout)
    assert verdicts.pop("honest: a file of the allowed folder through its fd") == "mine"
    assert {what: v for what, v in verdicts.items() if v != "refused"} == {}
    assert sorted(p.name for p in secret.iterdir()) == ["secret.txt"]
    assert (secret / "secret.txt").read_text() == "the hidden tests"


def _reach_forbidden_through_their_holders():
    """Forbid two packages and a class, then reach each through every other module that holds it,
    or holds something defined in it."""
    import importlib

    import torch.nn.parallel.distributed

    import distlab.parallel3d.train
    import distlab.zero.stages
    from distlab.grade.boundary.forbid import forbid

    forbid("distlab.tensor_parallel", "distlab.data_parallel", "torch.nn.parallel.DistributedDataParallel")
    roads = {
        "the package in sys.modules": lambda: sys.modules["distlab.tensor_parallel"].layers,
        "a module in sys.modules": lambda: sys.modules["distlab.tensor_parallel.layers"].ColumnParallelLinear,
        "the parent package's attribute": lambda: distlab.tensor_parallel.model.ParallelGPT,
        "import_module of a module": lambda: importlib.import_module("distlab.tensor_parallel.model").ParallelGPT,
        "import_module of a module never imported before": lambda: importlib.import_module(
            "distlab.data_parallel.buckets").plan_buckets,
        "a function another chapter imported by name": lambda: distlab.parallel3d.train.parallelize_gpt(None),
        "a class another chapter imported by name": lambda: distlab.parallel3d.train.ParallelGPT(None),
        "a function ZeRO imported by name": lambda: distlab.zero.stages.broadcast_parameters(None),
        "torch.nn.parallel.DistributedDataParallel": lambda: torch.nn.parallel.DistributedDataParallel(None),
        "torch.nn.parallel.distributed.DistributedDataParallel":
            lambda: torch.nn.parallel.distributed.DistributedDataParallel(None),
    }
    return try_each(roads)


def test_a_forbidden_api_stays_forbidden_where_other_modules_hold_it_on_every_call_of_a_warm_pool():
    # Between calls a warm pool puts back what a call replaced in distlab's modules, the real
    # module included where another module holds it; the next call's forbid must find it again.
    with distlab.Pool(2):
        for call in range(3):
            for outcome in distlab.run(_reach_forbidden_through_their_holders, nprocs=2, timeout=90):
                assert set(outcome.values()) == {"ForbiddenError"}, (call, outcome)


NOTEBOOK_CELL = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP   # before the guard is in


def wrap_in_torch_ddp():
    try:
        DDP(torch.nn.Linear(2, 2))
        return "allowed"
    except Exception as error:
        return type(error).__name__
"""


def test_a_forbidden_class_imported_at_the_top_of_a_notebook_cell_is_forbidden_on_the_ranks():
    # A notebook's function travels by value, with the class it uses; unpickled before forbid,
    # it would bring the real class along. Both ways of forbidding must catch it.
    cell = {"__name__": "__main__"}      # defined as in a notebook, so it is pickled by value
    exec(NOTEBOOK_CELL, cell)
    ddp = ["torch.nn.parallel.DistributedDataParallel"]
    assert checks.run_ranks(cell["wrap_in_torch_ddp"], nprocs=2, forbidden=ddp).results == ["ForbiddenError"] * 2
    with options.rank_setup("distlab.grade.boundary.protect", "protect_rank", when="call", forbidden=ddp):
        assert distlab.run(cell["wrap_in_torch_ddp"], nprocs=2, timeout=60) == ["ForbiddenError"] * 2
    assert distlab.run(cell["wrap_in_torch_ddp"], nprocs=2, timeout=60) == ["allowed"] * 2  # unguarded, it works


def _allocate_and_report(gib):
    try:
        torch.ones(int(gib * 2**30) // 4)
        return "allocated"
    except RuntimeError as exc:
        return str(exc)


def _spawn_children(n, marker):
    import subprocess
    import sys
    import time

    for _ in range(n):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=True)
    time.sleep(10)
    return "not stopped"


def test_memory_cap_makes_a_10_gb_allocation_fail_inside_the_rank():
    with options.rank_setup("distlab.grade.boundary.limits", "apply", when="start", memory_mb=3072):
        results = distlab.run(_allocate_and_report, 10, nprocs=2, timeout=90)
    assert all("can't allocate memory" in r for r in results), results


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(REPEAT_UNDER_LOAD))
def test_process_cap_holds_for_root_and_leaves_no_child_behind_under_load(cpu_load, attempt):
    # The capped rank kills its children and exits at once; they are still dying, no longer
    # below it. The run must not raise before they are gone (it once did, on a loaded machine).
    with options.rank_setup("distlab.grade.boundary.limits", "apply", when="start", processes=4):
        with pytest.raises(distlab.RankError, match="exited with code 125"):
            distlab.run(_spawn_children, 20, f"distlab-test-cap-child-{attempt}", nprocs=2, timeout=90)
    assert not alive_with_marker(f"distlab-test-cap-child-{attempt}")


TREE_SCRIPT = """
import subprocess, threading, time
from distlab.grade.boundary import limits
from distlab.runtime.processes import become_subreaper

become_subreaper()                                                  # orphans below us come back to us
started = [subprocess.Popen(["sleep", "60"]),                       # a child
           subprocess.Popen(["sh", "-c", "sleep 60 & wait"])]       # a child and its grandchild
subprocess.run(["sh", "-c", "sleep 60 &"])                          # an orphan, re-parented to us
zombie = subprocess.Popen(["true"])                                 # ends, never reaped: not live
done = threading.Event()
thread = threading.Thread(target=lambda: (started.append(subprocess.Popen(["sleep", "60"])), done.wait()))
thread.start()                                                      # a child of a thread still running
time.sleep(1.0)                                                     # the sh has started its sleep
print("counts", limits.live_descendant_count(), len(limits.descendants()))
done.set(); thread.join()
limits.kill_descendants()
print("after", limits.live_descendant_count(), len(limits.descendants()))
"""


def test_the_watchdog_counts_its_own_tree_as_a_scan_of_every_process_does():
    """The watchdog counts by walking ``/proc/<pid>/task/<tid>/children`` from its own pid
    (cheap) where :func:`limits.descendants` asks psutil, which reads every process on the
    machine. Both must see the same tree: children, a grandchild, an orphan re-parented to the
    subreaper, a child of another thread; a zombie is not live."""
    out = subprocess.run([sys.executable, "-c", TREE_SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "counts 5 5" in out.stdout and "after 0 0" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
def test_output_and_wall_time_caps():
    def shout():
        print("x" * (32 * 2**20), flush=True)
        return "printed"

    def linger():
        import time
        time.sleep(60)

    with options.rank_setup("distlab.grade.boundary.limits", "apply", when="start", output_mb=8):
        with pytest.raises(distlab.RankError, match="File too large"):
            distlab.run(shout, nprocs=2, timeout=90)
    with options.rank_setup("distlab.grade.boundary.limits", "apply", when="start", wall_s=8):
        with pytest.raises(distlab.RankError, match="exited with code 124"):
            distlab.run(linger, nprocs=2, timeout=90)


def test_rank_ids_check():
    checks.assert_rank_ids([0, 1, 2])
    with pytest.raises(checks.CheckFailed, match="plain int"):
        checks.assert_rank_ids([torch.tensor(0)])
    with pytest.raises(checks.CheckFailed, match="rank 1 returned 0"):
        checks.assert_rank_ids([0, 0])


def test_the_grading_seed_is_fixed_in_a_notebook_and_the_clean_rooms_draw_when_graded():
    """checks.grading_seed() reads the seed the boundary keeps (distlab.grade.boundary.seed): the
    fixed one in a fresh process (a student's notebook), the one the clean room drew after it drew."""
    code = ("from distlab.grade import checks; from distlab.grade.boundary import seed\n"
            "before = checks.grading_seed(); drawn = seed.draw_fresh()\n"
            "print(before, drawn, checks.grading_seed())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, drawn, after = map(int, done.stdout.split())
    assert before == 20240601 and after == drawn and 0 <= drawn < 2**31


def test_hidden_failure_messages_and_redaction():
    from distlab.grade.boundary.cleanroom import GENERIC_HIDDEN_MESSAGE, TestNamespace, _run_test_cell, redact

    source = 'x = 1\nassert x == 1, "visible"\n### BEGIN HIDDEN TESTS\nassert x == 2, "expected 2"\n### END HIDDEN TESTS'
    verdict = _run_test_cell(TestNamespace(), "t", source, timeout=10)
    assert not verdict["passed"]
    assert GENERIC_HIDDEN_MESSAGE in repr(verdict["outputs"]) and "expected 2" not in repr(verdict["outputs"])
    visible = _run_test_cell(TestNamespace(), "v", 'assert 1 == 2, "visible message"', timeout=10)
    assert "visible message" in repr(visible["outputs"])
    shown = redact("Traceback: reference = compute_secret(7)\n", ["    reference = compute_secret(7)"])
    assert "compute_secret" not in shown and "[hidden test code]" in shown


STUDENT_CELLS = ['''
def broadcast_parameters(model):
    return "the student's broken task 1"
''', '''
class Later:
    def run(self):
        return broadcast_parameters(None)
''']


def test_a_later_task_is_checked_with_the_reference_of_the_earlier_one_and_nothing_leaks():
    from distlab.grade.boundary.sandbox import StudentFunction

    def reference(model):
        return "reference"

    # In the grader: a stand-in, defined in a namespace of its own.
    stand_in = StudentFunction(STUDENT_CELLS, "Later")
    with checks.using_references([stand_in], {"broadcast_parameters": reference}) as (later,):
        assert later().run() == "reference"
    assert stand_in.resolve()().run() == "the student's broken task 1", "the plain namespace was changed"
    with checks.using_references([stand_in], None) as (later,):
        assert later().run() == "the student's broken task 1"
    # In a student's notebook: the class's module globals, patched for the call and restored.
    namespace = {"__name__": "notebook"}
    for cell in STUDENT_CELLS:
        exec(cell, namespace)
    own = namespace["Later"]
    with checks.using_references([own], {"broadcast_parameters": reference}) as (later,):
        assert later is own and later().run() == "reference"
    assert own().run() == "the student's broken task 1"
    with checks.using_references([own], {"not_defined_before": reference}):
        assert namespace["not_defined_before"] is reference
    assert "not_defined_before" not in namespace


def test_failures_lists_every_failing_check_and_lets_other_errors_through():
    def failing(message):
        raise checks.CheckFailed(message)

    with pytest.raises(checks.CheckFailed) as caught:
        with checks.Failures() as failures:
            for case in range(3):
                with failures.check():
                    if case != 1:
                        failing(f"case {case}: the values are off")
                with failures.check():
                    failing(f"case {case}: too many bytes")
    assert str(caught.value).splitlines() == [
        "5 checks failed:", "  1. case 0: the values are off", "  2. case 0: too many bytes",
        "  3. case 1: too many bytes", "  4. case 2: the values are off", "  5. case 2: too many bytes"]
    with pytest.raises(checks.CheckFailed, match=r"^only this$"):      # one failure reads as before
        with checks.Failures() as failures:
            with failures.check():
                failing("only this")
            with failures.check():
                pass
    with checks.Failures() as failures:                               # none: passes
        with failures.check():
            pass
    with pytest.raises(ZeroDivisionError):                            # the student's crash stops the test
        with checks.Failures() as failures:
            with failures.check():
                failing("first")
            with failures.check():
                raise ZeroDivisionError("the student's code crashed")
    with pytest.raises(checks.CheckFailed, match=r"12 checks failed:(.|\n)*  8\. 7\n  \.\.\. and 4 more$"):
        with checks.Failures() as failures:
            for n in range(12):
                with failures.check():
                    failing(str(n))


def test_failures_of_several_check_functions_join_into_one_list():
    def check_function(n):
        with checks.Failures() as inner:
            for case in range(n):
                with inner.check():
                    raise checks.CheckFailed(f"function of {n}, case {case}")

    with pytest.raises(checks.CheckFailed) as caught:
        with checks.Failures() as cell:
            with cell.check():
                check_function(2)
            with cell.check():
                check_function(1)
    assert str(caught.value).splitlines() == ["3 checks failed:", "  1. function of 2, case 0",
                                              "  2. function of 2, case 1", "  3. function of 1, case 0"]


def test_a_cell_that_ran_past_the_limit_is_not_run_again_for_the_next_task(monkeypatch):
    """A cell that sleeps at the top level costs the per-cell limit once per rank, not once per run."""
    from distlab.grade.boundary import sandbox

    monkeypatch.setattr(sandbox, "CELL_TIME_LIMIT_S", 0.5)
    monkeypatch.setattr(sandbox, "_namespaces", {})
    monkeypatch.setattr(sandbox, "_timed_out", set())
    sleeps, defines = "import time\ntime.sleep(60)\n", "def f():\n    return 1\n"
    start = time.monotonic()
    namespace, problems = sandbox.run_cells([sleeps, defines])
    assert 0.4 < time.monotonic() - start < 5
    timed_out = "cell 0: distlab.grade.boundary.sandbox.CellTimeout: the cell ran longer than 0.5 s"
    assert namespace["f"]() == 1 and problems == [timed_out]
    start = time.monotonic()
    namespace, problems = sandbox.run_cells([sleeps, defines, "x = 2\n"])    # the next task's run
    # Run again, the sleeping cell alone would take the whole limit (0.5 s); three tiny cells
    # take milliseconds, or a few hundred on a loaded machine, still under it.
    assert time.monotonic() - start < sandbox.CELL_TIME_LIMIT_S
    assert namespace["f"]() == 1 and namespace["x"] == 2
    assert problems == [timed_out + " (in an earlier run of these tests; not run again)"]


def test_a_parameter_mismatch_names_the_case_and_the_rank_it_happened_on():
    reference = {"w": torch.zeros(3)}
    per_rank = [{"w": torch.zeros(3)}, {"w": torch.tensor([0.0, 1.0, 0.0])}]
    with pytest.raises(checks.CheckFailed, match=r"^gpt model, AdamW, 4 ranks: parameter `w` on rank 1"):
        checks.assert_params_match(per_rank, reference, atol=1e-6, what="gpt model, AdamW, 4 ranks")
    with pytest.raises(checks.CheckFailed, match=r"^gpt model, 4 ranks: rank 0: parameter `w` missing"):
        checks.assert_params_match([{}], reference, atol=1e-6, what="gpt model, 4 ranks")
