"""``distlab.run``: call a function on N ranks and get one result per rank back.

    >>> import distlab, torch.distributed as dist
    >>> distlab.run(lambda: dist.get_rank() * 10, nprocs=4)
    [0, 10, 20, 30]

What happens, step by step:

1. The arguments are checked before anything starts (a bad ``nprocs``, something that
   cannot be pickled, NCCL without GPUs: each fails at once with a clear message).
2. The function and its arguments are pickled into a fresh run directory
   (:mod:`distlab.runtime.rundir`); cloudpickle sends notebook functions by value.
3. ``torchrun --standalone`` starts N workers (:mod:`distlab.runtime.worker`). Each joins the
   process group, runs the function and writes its result or its exception.
4. Meanwhile we stream every line the ranks print, prefixed ``[rank k]``, and watch for
   three ways to finish: every rank delivered a result (return them); a rank failed
   (raise :class:`~distlab.RankError` and stop the others at once); time is up (raise
   :class:`~distlab.DistTimeout`, saying which call each rank is stuck in).
5. Whatever happened, including Ctrl-C, every process we started is ended
   (:mod:`distlab.runtime.processes`) and the run directory is deleted.

Success is judged by the results the ranks delivered, not by torchrun's exit code.
"""

from __future__ import annotations

import shutil

from distlab.runtime import launchers, options, serialize
from distlab.runtime import rundir as files
from distlab.runtime.pool import active_pool


def run(fn, *args, nprocs: int = 2, timeout: float = 60.0, backend: str | None = None,
        threads: int | None = None, seed: int = 0, launcher: str = "auto", **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` ranks and return their results in rank order.

    Args:
        fn: any callable; a function defined in the notebook travels by value.
        nprocs: number of ranks (1 to ``MAX_NPROCS``).
        timeout: seconds the function may run, counted from the moment every rank has
            joined the process group. Past it: :class:`DistTimeout`. Starting the ranks is not
            counted (a cold start costs ~4 s for 2 ranks and ~7 s for 4 on 2 CPU cores); it
            has its own limit, ``DISTLAB_START_TIMEOUT`` (default 180 s).
        backend: ``None`` picks NCCL when every rank can have its own GPU, gloo otherwise;
            or ``"gloo"`` / ``"nccl"`` explicitly; or ``"relay"``: every message and collective goes
            through a router in this process, which records it (:mod:`distlab.relay`; what the
            exercises' tests use, on the fork launcher).
        threads: torch threads per rank; default ``max(1, cores // ranks on the node)``,
            decided on the node each rank runs on.
        seed: every rank seeds ``random``, ``torch`` (and ``numpy`` if loaded) with it.
        launcher: ``"local"`` (torchrun on this machine), ``"fork"`` (this machine, ranks forked
            from one process that imported torch once: faster to start, see
            :mod:`~distlab.runtime.launchers.forked`), ``"srun"`` (inside a Slurm allocation),
            ``"sbatch"`` (a Slurm batch job) or ``"auto"`` (srun inside an allocation, else local).

    The names ``nprocs, timeout, backend, threads, seed, launcher`` are taken by ``run``;
    pass arguments of ``fn`` with those names positionally.

    When a :class:`distlab.Pool` of ``nprocs`` ranks is active (``%distributed start``), the
    call runs on its warm ranks instead of new ones, with the same behaviour and errors.

    Every other keyword argument goes to ``fn``. The process group is ready when ``fn``
    starts; ``torch.distributed.get_rank()`` tells a rank who it is.

    Raises:
        RankError: a rank raised (or died); the other ranks are stopped at once.
        DistTimeout: ``timeout`` passed; the message says what every rank was doing.
        ValueError, TypeError: bad arguments, before any process starts.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame from tracebacks
    pool = active_pool(nprocs, backend, threads, launcher)
    if pool is not None:
        return pool.run(fn, *args, timeout=timeout, seed=seed, **kwargs)
    options.check_arguments(fn, nprocs, timeout, backend, threads)
    job_class = launchers.choose(launcher, backend)
    blob = serialize.dumps_call(fn, args, kwargs)
    run_dir = files.new_run_dir("run")
    try:
        (run_dir / files.PAYLOAD).write_bytes(blob)
        options.write_options(run_dir, seed, options.current_rank_setup())
        job = job_class(run_dir, nprocs, timeout, backend, threads)
        try:
            return job.wait()
        finally:
            job.stop()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
