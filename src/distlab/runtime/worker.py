"""What runs in every rank: ``python -m distlab.runtime.worker RUNDIR``, started by torchrun.

In order:

1. Note our pid, arrange to die with torchrun (before anything slow can fail), and become
   the subreaper of whatever this rank starts (see :mod:`distlab.runtime.processes`).
2. Send everything we print (file descriptors 1 and 2, so C libraries and subprocesses
   too) to ``out-<rank>`` and ``err-<rank>``, which the notebook streams live.
3. Import torch, set the number of threads, pick the backend and device, and join the
   process group (torchrun already told us RANK, WORLD_SIZE, MASTER_ADDR/PORT).
4. Install the call recorder (:mod:`distlab.tools.comm`) and keep ``state-<rank>.json`` up to
   date (:mod:`distlab.runtime.rank_state`), so that on a timeout the notebook can say which
   call we are stuck in. Then run the ``joined`` setup steps (the grader's private room,
   :mod:`distlab.grade.boundary.rank_room`, entered here: after the process group, before any call).
5. Load the function, seed the random generators, run it, and write the result, or the
   exception with its traceback. In pool mode (``--pool``, see :mod:`distlab.runtime.pool`), do this
   for each call that appears in ``call-<k>/`` until told to stop, and undo between calls
   what :mod:`distlab.runtime.isolation` can undo (patched torch functions, RNG state).
6. Leave cleanly: wait for the others, destroy the process group and ``os._exit(0)``
   (a normal interpreter exit after DDP sometimes aborts in a C++ destructor).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from distlab.runtime import rundir as files
from distlab.runtime.processes import become_subreaper, die_with_parent
from distlab.runtime.rank_state import RankState


def _leash_and_redirect(run_dir: Path, rank: int) -> None:
    files.write_atomically(files.pid_file(run_dir, rank), str(os.getpid()).encode())
    die_with_parent()
    if os.getppid() == 1:  # torchrun died before we could ask to die with it
        os._exit(1)
    become_subreaper()   # what this rank starts stays below it, even in a session of its own
    for fd, path in ((1, files.out_file(run_dir, rank)), (2, files.err_file(run_dir, rank))):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    # torchrun's temporary files live in the run directory; the user's code gets its own TMPDIR back.
    user_tmp = os.environ.pop("DISTLAB_USER_TMPDIR", None)
    if user_tmp:
        os.environ["TMPDIR"] = user_tmp
    else:
        os.environ.pop("TMPDIR", None)
    # A rank forked from an agent (the fork launcher) inherits the folder its agent's imports
    # found from the run's TMPDIR; forget it, so that tempfile looks at the user's TMPDIR again.
    tempfile.tempdir = None


def _watch_calls(state: RankState) -> None:
    """Keep state-<rank>.json saying what this rank is doing (read only on a timeout)."""
    from distlab.tools import comm

    def pending():
        return [c.describe() for c in comm.pending_async()]

    def observe(event, call):
        if event == "enter":
            state.soon(lambda: {"phase": "call", "call": call.describe(), "since": call.start, "pending": pending()})
        else:
            since = time.time()
            state.soon(lambda: {"phase": "user", "last": call.describe(), "since": since, "pending": pending()})

    comm.install()
    comm.set_observer(observe)


def _report_exception(run_dir: Path, rank: int, exc: BaseException, serving_on: bool = False) -> None:
    import traceback

    from distlab.runtime import serialize

    # Drop our own frame so the traceback starts in the user's code.
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        exc_bytes = serialize.dumps_result(exc)
    except Exception:
        exc_bytes = None
    message = str(exc)
    if isinstance(exc, SystemExit):
        message = f"the function called sys.exit({exc.code!r}) on this rank"
    report = {"rank": rank, "type": type(exc).__name__, "message": message,
              "traceback": text, "time": time.time(), "exception": exc_bytes, "serving_on": serving_on}
    files.write_atomically(files.error_file(run_dir, rank), serialize.dumps_result(report))


def _run_setup(options: dict, when: str, **context) -> list:
    """Run the setup steps the caller asked for at this point (see :func:`distlab.runtime.options.rank_setup`),
    each with its own arguments and ``context`` (the run folder and rank, for ``joined`` steps).

    A step may return a function that undoes it; those are returned, to be called after the call.
    """
    import importlib

    undo = []
    for step in options["setup"]:
        if step["when"] == when:
            function = getattr(importlib.import_module(step["module"]), step["function"])
            result = function(**step["kwargs"], **context)
            if callable(result):
                undo.append(result)
    return undo


def _read_options(folder: Path) -> dict:
    options = json.loads((folder / files.OPTIONS).read_text())
    for entry in options["sys_path"]:  # the caller's import path, before unpickling needs it
        if entry not in sys.path:
            sys.path.append(entry)
    return options


def _enter_callers_folder(cwd: str | None) -> None:
    """Run the call where its caller is, when the caller says where (ranks borrowed from the
    book build's shared pool, which started in another folder; see :mod:`.launchers.shared`)."""
    if cwd:
        os.chdir(cwd)


def _failed_cleanly(exc: BaseException) -> bool:
    """Did the call fail in the user's own code, with no distributed call cut short?

    An exception raised between collectives (``NotImplementedError``, a wrong shape caught
    before the all-reduce, an assert) leaves the process group as a successful call leaves
    it, so a pool's rank can take the next call. One raised *inside* a collective, or with an
    async op still in flight, may have left half a message on a connection: that rank stays
    put until it is stopped, and its pool starts fresh ranks.
    """
    from distlab.tools import comm

    return isinstance(exc, Exception) and not comm.calls_that_raised() and not comm.pending_async()


def _run_call(state: RankState, call_dir: Path, rank: int, pool: bool = False) -> bool:
    """Run the call whose files are in ``call_dir``; write its result or error.

    True if the rank can go on: the call returned, or (in a pool) it failed cleanly."""
    from distlab.runtime import isolation, processes, serialize
    from distlab.tools import comm

    state.now({"phase": "user", "since": time.time()})
    saved = isolation.snapshot()
    children_before = processes.children()
    undo = []
    try:
        options = _read_options(call_dir)
        _enter_callers_folder(options.get("cwd"))
        # The guard goes in before the call is unpickled: unpickling looks up every class and
        # function the call refers to, and one looked up before ``guard.forbid`` would be the
        # real one (``from torch.nn.parallel import DistributedDataParallel`` in a notebook).
        undo = _run_setup(options, "call")
        fn, args, kwargs = serialize.loads((call_dir / files.PAYLOAD).read_bytes())
        _seed(options["seed"])
        result = fn(*args, **kwargs)
        data = serialize.dumps_result(result)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        data = None
        serving_on = pool and _failed_cleanly(exc)
        _report_exception(call_dir, rank, exc, serving_on)
        if not serving_on:
            return False
    finally:
        for step in reversed(undo):
            step()
        isolation.restore(saved)
        comm.forget_pending()
    processes.end_children_started_since(children_before)   # the call ends with what it started
    if data is None:
        state.now({"phase": "raised", "since": time.time()})
        return True
    files.write_atomically(files.result_file(call_dir, rank), data)
    state.now({"phase": "returned", "since": time.time()})
    return True


def _serve_calls(run_dir: Path, state: RankState, rank: int) -> bool:
    """Pool mode: run call-0, call-1, ... as they appear, until told to stop or a call fails
    in a way that leaves the process group in doubt (see :func:`_failed_cleanly`)."""
    state.now({"phase": "ready", "since": time.time()})
    index = 0
    while True:
        call_dir = files.call_dir(run_dir, index)
        idle_since = time.monotonic()
        while not (call_dir / files.OPTIONS).exists():  # written last by the caller
            if (run_dir / files.STOP).exists():
                return True
            # Poll fast right after a call (the next cell usually follows), slower when idle, and
            # slowly after a minute without work (a pool nobody uses for now). Each step trades
            # CPU for the delay of the next call: up to 0.25 s after a long idle spell.
            idle = time.monotonic() - idle_since
            time.sleep(0.002 if idle < 1 else 0.05 if idle < 60 else 0.25)
        if not _run_call(state, call_dir, rank, pool=True):
            return False
        index += 1


def main() -> None:
    run_dir = Path(sys.argv[1])
    pool = "--pool" in sys.argv[2:]
    rank = int(os.environ["RANK"])
    _leash_and_redirect(run_dir, rank)
    options = {"setup": []}
    try:
        options = _read_options(run_dir)
        _run_setup(options, "start")
    except BaseException as exc:  # noqa: BLE001
        _report_exception(run_dir, rank, exc)
        _leave(None, ok=False)

    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    threads = int(os.environ.get("DISTLAB_THREADS") or max(1, len(os.sched_getaffinity(0)) // local_world_size))
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read when torch is imported

    import datetime

    import torch
    import torch.distributed as dist

    from distlab.runtime import devices

    torch.set_num_threads(threads)
    backend = devices.choose_backend(os.environ.get("DISTLAB_BACKEND"), local_world_size)
    timeout = datetime.timedelta(seconds=float(os.environ.get("DISTLAB_PG_TIMEOUT", "1800")))
    state = RankState(run_dir, rank)
    state.now({"phase": "starting", "since": time.time()})
    try:
        device_id = None
        if backend == "nccl":
            device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device_id)
        if backend == "relay":   # every message through the router of whoever launched us
            from distlab.relay import backend as relay

            relay.init_process_group(timeout)
        else:
            dist.init_process_group(backend, timeout=timeout, device_id=device_id)
        _watch_calls(state)
    except BaseException as exc:  # noqa: BLE001
        _report_exception(run_dir, rank, exc)
        _leave(dist, ok=False)
    if pool:
        from distlab.runtime import isolation

        isolation.preload()
    try:   # last, before any call: e.g. the grader's private room (distlab.grade.boundary.rank_room)
        _run_setup(options, "joined", run_dir=str(run_dir), rank=rank)
    except BaseException as exc:  # noqa: BLE001 - reported as far as the half-made step lets us
        try:
            _report_exception(run_dir, rank, exc)
            state.now({"phase": "raised", "since": time.time()})
        except OSError:
            pass
        _leave(dist, ok=False)
    ok = _serve_calls(run_dir, state, rank) if pool else _run_call(state, run_dir, rank)
    _leave(dist, ok)


def _seed(seed: int) -> None:
    """The same seed on every rank: models built on each rank start identical."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)


def _leave(dist, ok: bool) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if not ok:
        # Stay put until the notebook, which has our report, stops everyone. Exiting now would
        # make torchrun kill our peers and blur which rank failed first.
        time.sleep(30)
        os._exit(1)
    if dist is not None and dist.is_initialized():
        from distlab.tools import comm

        # The state file keeps saying "returned": the barrier below is ours, not the user's
        # (gloo's barrier waits on a Work, which would otherwise show as the rank's last call).
        comm.set_observer(None)
        try:  # nobody leaves while a peer may still be receiving from it (unrecorded barrier);
            # on the relay the router holds what was sent, and a barrier would enter its record
            if dist.get_backend() != "relay":
                comm.original("barrier")()
            dist.destroy_process_group()
        except Exception:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
