"""A graded rank as the first process of a process-id namespace of its own, and its keeper.

Each graded rank gets its own namespaces (:mod:`distlab.grade.boundary.rank_room`); the process-id one
is the odd one out. ``unshare(CLONE_NEWPID)`` does not move the caller: only its next child is
born in the new namespace, as its process 1. So the rank, once its user namespace is made,
forks (:func:`split_off`): the child goes on as the rank; the parent stays behind as its
*keeper* and runs nothing else. Why keep it:

* The launcher knows the rank by its pid (the pid file, the agent's ``waitpid``, the process
  group it signals): that is the keeper's. The keeper ends as the rank ended, with its exit code
  or by its signal, so the launcher's messages (``exitcode : -9``, 125 for too many processes)
  do not change.
* A namespace's process 1 ignores every signal it has no handler for, unless the sender is
  outside and the signal is SIGKILL or SIGSTOP. The launcher sends SIGTERM first: to the
  keeper, whose death takes the rank with it (the rank's parent-death signal is SIGKILL).
* The rank starts a session of its own: ``kill(0, sig)`` reaches the caller's process group
  wherever its members are, and the launcher's group holds the other ranks and their agent.

The keeper holds none of the rank's descriptors (it closes them all, the rank's end of the
relay among them) and is not dumpable: the other ranks see it in ``/proc`` but cannot read it
or take a descriptor from it, and being outside their namespaces they cannot signal it.
"""

from __future__ import annotations

import os


def wanted() -> bool:
    """Whether this rank gets process ids of its own: not where it may join an NCCL group (asked
    for, or chosen because every rank has a GPU, :func:`distlab.runtime.devices.choose_backend`;
    told from the environment and ``/dev``, before torch looks at the GPUs). NCCL's ranks keep
    the sandbox's process ids, as they keep its network: NCCL hands GPU memory from one process
    to another, and its ways of doing so have not been tried across namespaces here."""
    backend = os.environ.get("DISTLAB_BACKEND", "")
    if backend in ("gloo", "relay"):
        return True
    if backend == "nccl":
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = len([d for d in visible.split(",") if d.strip()]) if visible is not None else \
        len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
    return not gpus or gpus < int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def split_off() -> None:
    """Fork: the child, process 1 of the namespace made for its children, returns and is the rank
    from now on; this process becomes its keeper and never returns (:func:`_keep`)."""
    from distlab.runtime import processes

    alive_read, alive_write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_write)
        processes.die_with_parent()
        os.set_blocking(alive_read, False)
        try:
            if os.read(alive_read, 1) == b"":   # the keeper ended before we asked to die with it
                os._exit(1)
        except BlockingIOError:
            pass
        os.close(alive_read)
        os.setsid()
        return
    os.close(alive_read)
    _keep(child, alive_write)


def _keep(rank_pid: int, keep_fd: int) -> None:
    """Hold nothing of the rank's, wait for it, and end as it ended (the same exit code, or the
    same signal), which the launcher reads as the rank's."""
    import signal

    from distlab.grade.boundary.sandbox_keeper import close_all_but, end_as
    from distlab.runtime import processes

    processes.set_name(f"distlab-keep{os.environ.get('RANK', '')}"[:15])
    processes.set_dumpable(False)
    close_all_but(keep_fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    status = None
    while status is None:
        try:
            pid, found = os.waitpid(-1, 0)     # also reaps what the rank's namespace leaves us
        except ChildProcessError:
            os._exit(1)
        if pid == rank_pid:
            status = found
    end_as(os.waitstatus_to_exitcode(status))   # never returns: the caller's code is the rank's, not the keeper's
