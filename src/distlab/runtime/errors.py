"""The exceptions :func:`distlab.run` raises in the notebook when something goes wrong on a rank."""

from __future__ import annotations


class RankError(RuntimeError):
    """A rank raised an exception (or its process died) before returning a result.

    Attributes:
        rank: the global rank that failed first.
        exc_type: the name of the remote exception's class, e.g. ``"ValueError"``.
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the traceback as the rank printed it.
        remote_exception: the exception object itself when it could be sent back, else ``None``.
        others: ``{rank: one-line summary}`` of ranks that failed afterwards (usually as a
            consequence: a peer that vanished makes the others' collectives fail).
    """

    def __init__(self, rank, exc_type, remote_message, remote_traceback="",
                 remote_exception=None, others=None):
        self.rank = rank
        self.exc_type = exc_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.remote_exception = remote_exception
        self.others = dict(others or {})
        lines = [f"rank {rank} raised {exc_type}: {remote_message}"]
        if remote_traceback:
            lines += ["", f"Traceback on rank {rank}:", remote_traceback.rstrip()]
        for other, summary in sorted(self.others.items()):
            lines.append(f"(rank {other} failed afterwards: {summary})")
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.rank, self.exc_type, self.remote_message,
                             self.remote_traceback, None, self.others))


class DistTimeout(TimeoutError):
    """The run did not finish within its timeout (or its ranks did not start within the start limit).

    Attributes:
        timeout: the limit in seconds.
        waiting_for: ``"finish"`` (the function ran past ``timeout``) or ``"start"`` (the
            ranks did not join the process group within the start limit).
        rank_states: ``{rank: description}`` of what every rank was doing when time ran out,
            e.g. ``"blocked in recv(float32[4] from rank 1) for 9.9 s"``.
        hint: one line saying how to give the run more time; the caller knows best how
            (``%%distributed`` names its ``--timeout``, :func:`distlab.run` its ``timeout=``).

    In a notebook the error shows as its message alone (IPython's ``_render_traceback_``):
    the frames it would list are the runtime's own, waiting on the ranks, and say nothing
    about the student's code; what each rank was doing is in the message.
    """

    def __init__(self, timeout, rank_states, waiting_for: str = "finish", hint: str | None = None):
        self.timeout = timeout
        self.rank_states = dict(rank_states)
        self.waiting_for = waiting_for
        self.hint = hint if hint is not None else default_hint(timeout, waiting_for)
        super().__init__(self._message())

    def _message(self) -> str:
        what = "the ranks did not start" if self.waiting_for == "start" else "the run did not finish"
        lines = [f"{what} within {self.timeout:g} s. {self.hint}", "What each rank was doing:"]
        lines += [f"  rank {r}: {s}" for r, s in sorted(self.rank_states.items())]
        return "\n".join(lines)

    def with_hint(self, hint: str) -> DistTimeout:
        """This error, saying ``hint`` instead of the default (the same traceback)."""
        self.hint = hint
        self.args = (self._message(),)
        return self

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error in a notebook: the message, no frames."""
        name = f"\x1b[0;31m{type(self).__name__}\x1b[0m"
        first, *rest = str(self).split("\n")
        return [f"{name}: {first}", *rest]

    def __reduce__(self):
        return (type(self), (self.timeout, self.rank_states, self.waiting_for, self.hint))


def more_time(timeout: float) -> float:
    """A larger limit to suggest in a hint: twice the one that ran out, in whole seconds."""
    return max(60, int(2 * timeout))


def default_hint(timeout: float, waiting_for: str) -> str:
    """How to give a :func:`distlab.run` call more time, in one line."""
    if waiting_for == "start":
        return ("A busy node starts ranks slowly: give them longer with the environment variable "
                f"DISTLAB_START_TIMEOUT={more_time(timeout):g} (seconds), set before distlab is imported.")
    return f"To give it more time: distlab.run(..., timeout={more_time(timeout):g})."


class LaunchError(RuntimeError):
    """The ranks could not be started, or the launcher failed before any rank reported."""
