"""A test that reports every failing check, not only the first.

The exercises' test cells check several independent things per case (the values, the bytes
sent, the calls made, the memory held). Stopping at the first failure hides the others: the
student fixes one message, runs the test again, and only then meets the next. :class:`Failures`
collects them and reports them together. Part of :mod:`distlab.grade.checks`'s API
(``checks.Failures``).
"""

from __future__ import annotations

from contextlib import contextmanager


class CheckFailed(AssertionError):
    """A check failed; the message is safe to show to the student (``checks.CheckFailed``)."""


class Failures:
    """Every failing check of one test, reported together.

    A test that stops at its first failing check hides the others: the student fixes one
    message, runs the test again, and only then meets the next. A test written as ::

        with checks.Failures() as failures:
            for case in cases:
                with failures.check():
                    ...the values are right...
                with failures.check():
                    ...the bytes sent are right...

    goes on after a failing check and, at the end of the ``with`` block, raises one
    `CheckFailed` that lists them all (or passes). A test cell that
    calls several such functions wraps each call in a check of its own ``Failures``: the lists
    are joined. Only ``CheckFailed`` is collected: any other error (the student's code raised,
    a rank timed out) stops the test at once, as it should, since what follows would only
    repeat it.
    """

    SHOWN = 8   # more than this many messages are counted, not listed: they repeat one mistake

    def __init__(self):
        self.messages: list[str] = []

    @contextmanager
    def check(self):
        """One check: a failure is written down, and the test goes on after the block."""
        try:
            yield
        except CheckFailed as failure:   # a nested Failures' list joins this one, unnumbered twice
            self.messages.extend(getattr(failure, "failures", None) or [str(failure)])

    def report(self) -> None:
        """Raise one CheckFailed naming every failing check, if any failed."""
        if not self.messages:
            return
        if len(self.messages) == 1:
            failure = CheckFailed(self.messages[0])
        else:
            listed = [f"  {n}. {message}" for n, message in enumerate(self.messages[:self.SHOWN], start=1)]
            if len(self.messages) > self.SHOWN:
                listed.append(f"  ... and {len(self.messages) - self.SHOWN} more")
            failure = CheckFailed(f"{len(self.messages)} checks failed:\n" + "\n".join(listed))
        failure.failures = list(self.messages)
        raise failure

    def __enter__(self) -> Failures:
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            self.report()
        return False
