"""The rank's end of the relay: one descriptor, one reader thread, the mailboxes.

:mod:`distlab.relay.backend` turns every operation of a process group into a frame written
here; the router answers on the same descriptor. What arrives is sorted by the reader
thread: a message for a receive already posted completes it, one that came first waits in a
mailbox keyed by sender and tag until its receive is posted, and the router's answer to a
collective completes the :class:`Work` that waits for it.

A send completes when its receiver has taken it, as gloo's does: the moment a message meets
its receive (on arrival, or later when the receive is posted), this end tells the router,
which tells the sender (frames ``taken``). So two ranks that each block in ``dist.send`` to
the other wait for ever here too (and the run's timeout names the call), instead of passing
on the relay a schedule that deadlocks on gloo. The descriptor comes from the
rank's launch, its number in ``$DISTLAB_RELAY_FD`` (the contract is in
:mod:`distlab.relay.backend`'s docstring).
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections import deque

import torch
import torch.distributed as dist

from distlab.relay import frames

RELAY_FD = "DISTLAB_RELAY_FD"


class RelayError(RuntimeError):
    """The router refused an operation, or the link to it is gone."""


class Work(dist.Work):
    """One operation in flight; finished by the link's reader thread when the router answers."""

    def __init__(self, what: str, on_arrival=None, done: bool = False):
        super().__init__()
        self.what, self._on_arrival = what, on_arrival
        self._event, self._error = threading.Event(), None
        self._future = torch.futures.Future()
        if done:
            self._future.set_result([])
            self._event.set()

    def complete(self, parts, payload) -> None:
        try:
            result = self._on_arrival(frames.decode(parts, payload)) if self._on_arrival else []
        except Exception as exc:  # noqa: BLE001 - reported by wait(), on the rank's own thread
            self.fail(str(exc))
            return
        self._future.set_result(result)
        self._event.set()

    def fail(self, message: str) -> None:
        if self._event.is_set():
            return
        self._error = RelayError(f"{self.what}: {message}")
        self._future.set_exception(self._error)
        self._event.set()

    def wait(self, timeout=None) -> bool:
        self._event.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def get_future(self):
        return self._future


class _Link:
    """This process's end of the relay: one writer lock, one reader thread, the mailboxes."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self._send_lock, self._lock = threading.Lock(), threading.Lock()
        self._arrived: dict[tuple, deque] = {}    # (src, tag) -> messages not yet received
        self._posted: dict[tuple, deque] = {}     # (src, tag) -> receives waiting for a message
        self._replies: dict[tuple, Work] = {}    # (group, seq) -> collective waiting for its share
        self._sends: dict[int, Work] = {}        # our number for a send -> its work, until it is taken
        self._sent = 0
        self._broken: str | None = None
        self._wake_r, self._wake_w = os.pipe()    # tells the reader to stop between two frames
        self._reader = self._start_reader()

    def _start_reader(self) -> threading.Thread:
        reader = threading.Thread(target=self._read_loop, name="distlab-relay-reader", daemon=True)
        reader.start()
        return reader

    def pause_reader(self) -> None:
        """End the reader thread between two frames; :meth:`resume_reader` starts a new one.

        A thread keeps the namespaces it was started in, so a rank that moves into its private
        room (:mod:`distlab.grade.boundary.rank_room`) stops its reader first and starts it again from
        inside: code a student makes the reader run (by replacing a function it calls) then
        runs in the room too. Nothing is in flight at that moment (the room is entered between
        joining and the first call), and a frame the router sends meanwhile waits in the socket.
        """
        os.write(self._wake_w, b"x")
        self._reader.join()
        os.read(self._wake_r, 1)

    def resume_reader(self) -> None:
        if not self._reader.is_alive():
            self._reader = self._start_reader()

    def send(self, header: dict, payload: list) -> None:
        if self._broken:
            raise RelayError(self._broken)
        with self._send_lock:
            frames.write(self.sock, header, payload)

    def send_message(self, work: Work, header: dict, payload: list) -> None:
        """Send a point-to-point message; ``work`` completes when the receiver has taken it."""
        with self._lock:
            self._sent += 1
            number = self._sent
            self._sends[number] = work
        try:
            self.send(dict(header, id=number), payload)
        except RelayError as exc:
            with self._lock:
                self._sends.pop(number, None)
            work.fail(str(exc))

    def post_receive(self, work: Work, src: int, tag: int) -> None:
        with self._lock:
            waiting = self._arrived.get((src, tag))
            message = waiting.popleft() if waiting else None
            if message is None:
                self._posted.setdefault((src, tag), deque()).append(work)
            broken = self._broken
        if message is not None:
            parts, payload, ref = message
            self._taken(ref)
            work.complete(parts, payload)
        elif broken:
            work.fail(broken)

    def _taken(self, ref) -> None:
        """Tell the router that the message it numbered ``ref`` met its receive (its sender waits)."""
        try:
            self.send({"k": "taken", "ref": ref}, [])
        except (RelayError, OSError):
            pass   # the link is gone: every waiting operation fails with that reason anyway

    def expect_reply(self, key: tuple, work: Work) -> None:
        with self._lock:
            self._replies[key] = work

    def _read_loop(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.sock, self._wake_r], [], [])
                if self._wake_r in ready:
                    return   # paused (see pause_reader)
                header, payload = frames.read(self.sock)
                self._dispatch(header, payload)
        except (OSError, frames.BrokenFrame) as exc:
            self._break(f"the link to the grader's network is gone ({exc})")

    def _dispatch(self, header: dict, payload) -> None:
        kind = header.get("k")
        if kind == "msg":
            key = (header["src"], header["tag"])
            with self._lock:
                waiting = self._posted.get(key)
                work = waiting.popleft() if waiting else None
                if work is None:
                    self._arrived.setdefault(key, deque()).append((header["parts"], payload, header.get("ref")))
            if work is not None:
                self._taken(header.get("ref"))
                work.complete(header["parts"], payload)
        elif kind == "taken":
            with self._lock:
                work = self._sends.pop(header.get("id"), None)
            if work is not None:
                work.complete([], b"")
        elif kind in ("done", "error"):
            with self._lock:
                work = self._replies.pop((header.get("group"), header.get("seq")), None)
            if work is not None and kind == "done":
                work.complete(header.get("parts", []), payload)
            elif work is not None:
                work.fail(header.get("message", "refused"))
            elif kind == "error":
                self._break(f"the router refused an operation: {header.get('message')}")

    def _break(self, reason: str) -> None:
        with self._lock:
            self._broken = reason
            works = ([w for q in self._posted.values() for w in q] + list(self._replies.values())
                     + list(self._sends.values()))
            self._posted.clear()
            self._replies.clear()
            self._sends.clear()
        for work in works:
            work.fail(reason)


_link: _Link | None = None


def link() -> _Link:
    """This process's link to the router, made from ``DISTLAB_RELAY_FD`` on first use."""
    global _link
    if _link is None:
        fd = os.environ.get(RELAY_FD)
        if not fd:
            raise RelayError(f"backend 'relay' needs the descriptor named by ${RELAY_FD}, which this process "
                             "was not given (the relay's ranks are started by distlab.run(..., backend='relay'))")
        _link = _Link(int(fd))
    return _link


def paused_reader() -> "_Link | None":
    """Pause this process's reader thread, if it has a link (see :meth:`_Link.pause_reader`);
    the link to pass to :func:`resume_reader` afterwards."""
    if _link is not None:
        _link.pause_reader()
    return _link


def resume_reader(paused: "_Link | None") -> None:
    if paused is not None:
        paused.resume_reader()
