"""Bytes on the wire, counted outside the ranks (src/distlab/grade/boundary/wire.py).

Inside the grader's sandbox (bubblewrap: a network namespace whose only interface is a
private loopback), three ways of computing a global mean over 1 MiB per rank on 4 ranks go
through ``checks.run_ranks`` and ``checks.assert_comm(max_bytes_sent=<an all-reduce's>)``:

* an all-reduce: passes, and the wire holds what the rule counts plus the stated allowance;
* an all-gather through the unwrapped function the recorder keeps (nothing recorded);
* an all-gather whose record the rank then empties.

The last two put twice the bytes on the wire. With metering on (as the clean room has it)
both fail and the message says the record and the network disagree; with it off, the
recorder alone passes them, which is what this check adds. The end-to-end case, a hostile
submission graded by the real grader, is grader/hostile/send_around_the_recorder.py
(tests/grade/test_hostile.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distlab.grade.boundary import bubblewrap, wire

PROGRAM = r'''
import json, sys
import torch, torch.distributed as dist
import distlab
from distlab.grade import checks
from distlab.grade.boundary import wire
from distlab.tools import comm, comm_bytes

def all_reduce_mean(t):
    total = t.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()

def gather_around_the_recorder(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    comm.original("all_gather")(parts, t)
    return torch.stack(parts).mean(0)

def gather_then_empty_the_record(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    for log in comm._recorders:
        log.clear()
    return torch.stack(parts).mean(0)

torch.set_num_threads(1)
inputs = [torch.randn(1 << 18, generator=torch.Generator().manual_seed(r)) for r in range(4)]
limit = comm_bytes.all_reduce_bytes((1 << 18) * 4, 4)
found = {"metering": wire.start_metering(), "limit": limit}
with distlab.Pool(4, launcher="fork"):
    for fn in (all_reduce_mean, gather_around_the_recorder, gather_then_empty_the_record, "unmetered"):
        if fn == "unmetered":
            wire.stop_metering()
            name, fn = "unmetered", gather_around_the_recorder
        else:
            name = fn.__name__
        run = checks.run_ranks(fn, nprocs=4, per_rank_args=[(x,) for x in inputs], timeout=120)
        checks.assert_tensor_close(run.results[0], torch.stack(inputs).mean(0))
        try:
            checks.assert_comm(run.comm, max_bytes_sent=limit)
            verdict = None
        except checks.CheckFailed as failed:
            verdict = str(failed)
        found[name] = {"verdict": verdict, "wire": run.comm.wire.sent, "seconds": run.comm.wire.seconds,
                       "recorded": sum(c["sent"] for log in run.comm for c in log),
                       "calls": max(len(log) for log in run.comm)}
print("FOUND " + json.dumps(found))
'''


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wire")
    bubblewrap.hand_over(str(folder))
    argv = bubblewrap.command([sys.executable, "-c", PROGRAM], writable=[str(folder)], cwd=str(folder))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("FOUND "))
    return json.loads(line[len("FOUND "):])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_all_reduce_fits_the_rule_and_the_allowance(found):
    assert found["metering"], "the sandbox's namespace should hold loopback alone"
    honest = found["all_reduce_mean"]
    assert honest["verdict"] is None, honest
    assert honest["recorded"] == 4 * found["limit"] and honest["calls"] == 1
    # The wire holds at least the payload, and the allowance is what separates it from the limit.
    allowed = wire.allowance(4, found["limit"], honest["calls"], honest["seconds"])
    assert 4 * found["limit"] <= honest["wire"] <= allowed, (honest, allowed)
    print(f"all-reduce of 1 MiB on 4 ranks: {honest['wire']} bytes on the wire, "
          f"{honest['wire'] / (4 * found['limit']):.4f} x the rule; allowed {allowed}")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("cheat", ["gather_around_the_recorder", "gather_then_empty_the_record"])
def test_bytes_sent_around_the_record_fail_when_metered_and_pass_the_recorder_alone(found, cheat):
    caught = found[cheat]
    assert caught["recorded"] == 0, caught             # the record shows nothing ...
    assert caught["wire"] > 1.9 * found["all_reduce_mean"]["wire"], caught   # ... the wire twice the ring
    assert caught["verdict"] and "counted by the operating system" in caught["verdict"], caught
    assert "says 0 bytes in all" in caught["verdict"], caught
    unmetered = found["unmetered"]
    assert unmetered["wire"] is None and unmetered["verdict"] is None, (
        "without the wire count the recorder alone passes the cheat: this test shows what metering adds")
