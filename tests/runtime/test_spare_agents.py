"""Spare agents (distlab.runtime.launchers.spares): forked in advance, they must be
indistinguishable, to the ranks, from an agent started as a new Python, and carry nothing of
their parent but the modules it had imported.

:func:`spares.keep` forks the calling process, so each test runs it in a script of its own
(the pytest worker runs threads of its own, and :func:`keep` makes no spare in a threaded process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

LOOK = r'''
import json, os, sys, tempfile
from distlab.runtime.launchers import spares

secret_path = sys.argv[1]
held_before = os.open(secret_path, os.O_RDONLY)   # like the clean room's verdict pipe: open before keep()
os.set_inheritable(held_before, False)
from distlab.runtime.launchers import forked
forked.preload(pool=True)
made = spares.keep(2)
spare_pids = [pid for pid, _ in spares._spares]

import torch.distributed as dist
import distlab


def look():
    import ctypes, os, sys, tempfile
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    print(f"hello from rank {dist.get_rank()}", flush=True)
    return {"fds": sorted(fds.values()), "stdin": sys.stdin.read(), "tmp": tempfile.gettempdir(),
            "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),   # PR_GET_DUMPABLE
            "main": sorted(n for n in vars(sys.modules["__main__"]) if not n.startswith("__")),
            "names": [open(f"/proc/{pid}/comm").read().strip() for pid in (os.getpid(), os.getppid())]}


def fail():
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    dist.barrier()


def error_of(fn):
    try:
        distlab.run(fn, nprocs=2, launcher="fork")
    except distlab.RankError as exc:
        return f"{exc.rank}: {exc}".splitlines()[0]


out = {"made": made, "pools": []}
for _ in range(3):                       # two spares, then a new process
    with distlab.Pool(2, launcher="fork") as pool:
        out["pools"].append({"kind": "spare" if pool.job.agent.pid in spare_pids else "new",
                             "look": distlab.run(look, nprocs=2, launcher="fork"), "error": error_of(fail)})
out["left"] = spares.available()
print("RESULT " + json.dumps(out))
'''


def test_ranks_of_a_spare_agent_see_what_ranks_of_a_new_agent_see(tmp_path):
    secret = tmp_path / "verdict-like-secret"
    secret.write_text("the hidden tests")
    run = subprocess.run([sys.executable, "-c", LOOK, str(secret)], capture_output=True, text=True, timeout=300,
                         input="a job on standard input, read after the spares were made", cwd=tmp_path,
                         env={**_env(), "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert out["made"] == 2 and [p["kind"] for p in out["pools"]] == ["spare", "spare", "new"], out
    assert out["left"] == 0
    new = out["pools"][-1]
    for spare in out["pools"][:2]:
        assert spare["error"] == new["error"] and "rank one says no" in spare["error"], (spare["error"], new["error"])
        _same_view(spare["look"], new["look"], secret, tmp_path)
    assert run.stdout.count("[rank 0] hello from rank 0") == run.stdout.count("[rank 1] hello from rank 1") == 3   # streamed


def _same_view(spare_ranks: list[dict], new_ranks: list[dict], secret, tmp_path) -> None:
    for rank, (ours, theirs) in enumerate(zip(spare_ranks, new_ranks, strict=True)):
        # ps cannot tell them apart by command line (a fork keeps the parent's): by name it can
        assert ours["names"] == [f"distlab-rank{rank}", "distlab-agent"], ours["names"]
        assert theirs["names"][0] == f"distlab-rank{rank}", theirs["names"]
        assert ours["stdin"] == theirs["stdin"] == ""                       # not the parent's job
        assert ours["dumpable"] == theirs["dumpable"] == 1                  # as after an exec
        assert ours["tmp"] == theirs["tmp"] == str(tmp_path)                # the caller's TMPDIR, given back
        assert not any(str(secret) in target for target in ours["fds"]), ours["fds"]   # closed in the spare
        assert len(ours["fds"]) == len(theirs["fds"]), (ours["fds"], theirs["fds"])
        assert ours["main"] == theirs["main"] and "main" in ours["main"], ours["main"]   # the agent's module
        assert not {"LOOK", "secret_path", "spare_pids"} & set(ours["main"]), ours["main"]  # not the parent's script


ORPHAN = r'''
import os, sys
from distlab.runtime.launchers import spares

spares.keep(1)
print(spares._spares[0][0], flush=True)
os._exit(0)
'''


def test_a_spare_dies_with_the_process_that_made_it():
    run = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=120, env=_env())
    assert run.returncode == 0, run.stderr
    spare = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _running(spare) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(spare), f"spare {spare} outlived its parent"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "DISTLAB_LAUNCHER"}
