"""The router: the one place the relay's ranks send to, which delivers, performs and records.

A :class:`Router` is made by whoever launches ranks on the relay (the fork launcher's job,
:class:`distlab.runtime.launchers.forked.ForkedJob`), in the process that asked for the run:
the grader's clean room, or a student's kernel. It makes one ``socketpair`` per rank; the
rank's end travels to the rank through the launch (inherited, never a path), the router keeps
the other. A thread of this process then serves every descriptor:

* a ``send`` frame from rank ``s`` to ``d``: recorded as a :class:`~distlab.relay.record.Message`
  with ``src = s`` (the descriptor it came in on, not anything the rank wrote) and queued for
  rank ``d``, whose backend keeps it until a matching ``recv`` takes it. What ``d`` gets is the
  dtype, the number of elements and the bytes, under a number the router chose: not the
  shape, nor the sender's own number for it, which would carry data the record does not count;
* a ``taken`` frame from ``d``: that message met its receive, and the router tells ``s``,
  whose send then completes (a send waits for its receiver, as gloo's does);
* a ``coll`` frame: held until every rank of the group has handed in the same collective, then
  performed here (:mod:`distlab.relay.collectives`), recorded as one
  :class:`~distlab.relay.record.Collective`, and each rank's share sent back.

Nothing here ever blocks on one rank: descriptors are non-blocking, reads are parsed as they
come, and each rank has a queue of frames waiting to be written to it. A rank that is slow to
read (busy in its own code) only makes its queue longer; the others go on. Messages are
delivered at once and in the order each sender sent them, as gloo does (or, with a seed,
late and out of order between different pairs of ranks: :mod:`distlab.relay.schedule`).

The router runs in the process that owns the record, the grader's undumpable clean room
(:func:`distlab.grade.boundary.limits.make_undumpable`): a rank, running as the same user, can neither
read nor write its memory, nor take its descriptors through ``/proc``.

What the router holds for the ranks is capped, because that memory is the grader's
(:mod:`distlab.relay.holdings` counts it). A frame is checked on its header, before its
payload is read, so a header that announces gigabytes costs nothing. Past a cap the router
*stops the run*: every rank's link breaks with one message that
names the rank and the operation (``rank 1 sent more than 256 MiB that rank 0 has not received
yet ...``), so the run fails with it; what the ranks write from then on is read and dropped.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from collections import deque

from distlab.relay import collectives, frames, holdings, record, schedule

SETTLE_TIMEOUT_S = 5.0
_DISCARD = bytearray(1 << 16)


class _Inbound:
    """What a rank has written so far: the frame being read, piece by piece."""

    def __init__(self):
        self.prefix = bytearray()
        self.header: dict | None = None
        self.header_length = self.payload_length = 0
        self.buffer: bytearray | None = bytearray()   # None: the payload is read and dropped
        self.got = 0

    @property
    def frame_bytes(self) -> int:
        """The whole frame's bytes, prefix and header included (known once the header is read)."""
        return len(self.prefix) + self.payload_length


class Router:
    """One run's relay: ``nprocs`` socket pairs and the thread that serves them."""

    def __init__(self, nprocs: int):
        self.nprocs = nprocs
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(nprocs)]
        self.sockets = [mine for mine, _ in pairs]
        self._rank_ends = [theirs for _, theirs in pairs]
        self._inbound = {rank: _Inbound() for rank in range(nprocs)}
        self._outbound = {rank: deque() for rank in range(nprocs)}
        self._pending: dict[tuple, dict] = {}
        self._untaken: dict[int, tuple] = {}    # a message's number -> (sender, receiver, the sender's number, frame bytes)
        self._order = 0
        self.schedule = schedule.from_environment()                 # None: every message at once
        self._held = holdings.Holdings(nprocs)                       # what is held for whom, and the caps
        self.stopped: str | None = None                              # why the run was stopped, once it is
        self._wake_read, self._wake_write = os.pipe()
        self._selector = selectors.DefaultSelector()
        self._settled = threading.Event()
        self._settle_wanted = False
        self._stopping = False
        for rank, sock in enumerate(self.sockets):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, rank)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="distlab-relay-router", daemon=True)
        self._thread.start()
        record.register_router(self)

    # -- the launcher's side -----------------------------------------------------------------------

    def rank_fds(self) -> list[int]:
        """The descriptors to hand to the ranks, rank 0 first (they are ours until :meth:`launched`)."""
        return [end.fileno() for end in self._rank_ends]

    def launched(self) -> None:
        """The ranks' ends are in the launched processes now: close our copies."""
        for end in self._rank_ends:
            end.close()
        self._rank_ends = []

    def settle(self) -> None:
        """Read and handle everything the ranks have already written, then return."""
        if self._stopping or not self._thread.is_alive():
            return
        self._settled.clear()
        self._settle_wanted = True
        os.write(self._wake_write, b"s")
        self._settled.wait(SETTLE_TIMEOUT_S)

    def stop(self) -> None:
        record.unregister_router(self)
        self.launched()
        if not self._stopping:
            self._stopping = True
            os.write(self._wake_write, b"x")
            self._thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    # -- the thread --------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping:
            for key, events in self._selector.select(self.schedule.timeout() if self.schedule else None):
                if key.data is None:
                    os.read(self._wake_read, 64)
                    continue
                if events & selectors.EVENT_READ:
                    self._read(key.data)
                if events & selectors.EVENT_WRITE:
                    self._flush(key.data)
            for dst, header, payload in (self.schedule.due() if self.schedule else ()):
                if self.stopped is None:
                    self._queue(dst, header, payload)
            if self._settle_wanted:
                self._drain()
                self._settle_wanted = False
                self._settled.set()

    def _drain(self) -> None:
        import time

        ready, deadline = True, time.monotonic() + SETTLE_TIMEOUT_S / 2   # a rank that never stops sending
        while ready and time.monotonic() < deadline:
            ready = False
            for key, events in self._selector.select(timeout=0):
                if key.data is not None and events & selectors.EVENT_READ:
                    ready = self._read(key.data) or ready

    def _read(self, rank: int) -> bool:
        """Read what rank ``rank`` wrote; handle each frame it completes. True if anything came."""
        sock, state = self.sockets[rank], self._inbound[rank]
        head = frames.PREFIX.size
        try:
            if state.header is None:
                target = head if len(state.prefix) < head else head + state.header_length
                chunk = sock.recv(target - len(state.prefix))
                if not chunk:
                    return self._hang_up(rank)
                state.prefix += chunk
                if len(state.prefix) == head:          # the prefix is complete: how long is the rest?
                    state.header_length, state.payload_length = frames.PREFIX.unpack(state.prefix)
                    if not 0 < state.header_length <= frames.MOST_HEADER_BYTES:
                        return self._hang_up(rank)
                if len(state.prefix) < head + state.header_length or len(state.prefix) < head:
                    return True
                state.header = frames.parse_header(state.prefix[head:])
                state.buffer, state.got = self._payload_buffer(rank, state.header, state.payload_length,
                                                               state.frame_bytes), 0
            if state.got < state.payload_length:
                if state.buffer is None:
                    n = sock.recv_into(_DISCARD, min(len(_DISCARD), state.payload_length - state.got))
                else:
                    n = sock.recv_into(memoryview(state.buffer)[state.got:])
                if n == 0:
                    return self._hang_up(rank)
                state.got += n
            if state.header is not None and state.got == state.payload_length:
                header, payload, frame = state.header, state.buffer, state.frame_bytes
                self._inbound[rank] = _Inbound()
                self._held.read(rank)
                if payload is not None and self.stopped is None:
                    try:
                        self._handle(rank, header, payload, frame)
                    except Exception as exc:  # noqa: BLE001 - a rank's odd frame must not end the router
                        self._queue(rank, {"k": "error", "message": f"a frame the router could not use ({exc})"},
                                    b"")
            return True
        except (BlockingIOError, InterruptedError):
            return False
        except (OSError, MemoryError, frames.BrokenFrame):   # gone, or not speaking frames
            return self._hang_up(rank)

    def _payload_buffer(self, rank: int, header: dict, size: int, frame: int) -> bytearray | None:
        """Where the ``size`` bytes of payload of the frame whose header just came go (``frame``: the
        whole frame's bytes): a buffer, or ``None`` (read and dropped) when the run is stopped or
        holding the frame would pass a cap (which stops it)."""
        if self.stopped is not None:
            return None
        why = self._held.refusal(rank, header, frame)
        if why is not None:
            self._stop(why)
            return None
        return bytearray(size)

    def _stop(self, why: str) -> None:
        """Stop the run: drop the collectives held, and tell every rank ``why``, after what is queued
        for it already (a frame half written must be completed; the queue is capped), so that its
        link breaks with that message."""
        self.stopped = why
        self._pending.clear()
        if self.schedule is not None:
            self.schedule.clear()
        for rank in range(self.nprocs):
            self._queue(rank, {"k": "error", "message": why}, b"")

    def _hang_up(self, rank: int) -> bool:
        """A rank closed its end, or wrote garbage: stop listening to it."""
        try:
            self._selector.unregister(self.sockets[rank])
        except (KeyError, ValueError):
            pass
        return False

    def _queue(self, rank: int, header: dict, payload) -> None:
        size = sum(len(p) for p in payload) if isinstance(payload, list) else len(payload)
        pieces = [frames.pack(header, size)] + (payload if isinstance(payload, list) else [payload])
        self._outbound[rank].extend(memoryview(p).cast("B") for p in pieces if len(p))
        self._held.queued[rank] += sum(len(p) for p in pieces)
        self._flush(rank)
        why = self._held.queue_verdict(rank)
        if why is not None and self.stopped is None:
            self._stop(why)

    def _flush(self, rank: int) -> None:
        queue, sock = self._outbound[rank], self.sockets[rank]
        try:
            while queue:
                sent = sock.send(queue[0])
                self._held.queued[rank] -= sent
                if sent < len(queue[0]):
                    queue[0] = queue[0][sent:]
                    break
                queue.popleft()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            queue.clear()
            self._held.queued[rank] = 0
        try:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if queue else 0)
            self._selector.modify(sock, events, rank)
        except (KeyError, ValueError):
            pass

    def _next(self) -> int:
        self._order += 1
        return self._order

    def _handle(self, rank: int, header: dict, payload: bytearray, frame: int) -> None:
        """Act on rank ``rank``'s complete frame (``frame``: its bytes, header and all)."""
        kind = header.get("k")
        if kind == "send":
            dst, tag, parts = header.get("dst"), header.get("tag", 0), header.get("parts", [])
            if not isinstance(dst, int) or not 0 <= dst < self.nprocs or dst == rank:
                self._queue(rank, {"k": "error", "message": f"rank {rank} cannot send to {dst!r}"}, b"")
                return
            wrong = frames.wrong_envelope(tag, parts)
            if wrong is not None:
                self._queue(rank, {"k": "error", "message": f"rank {rank}'s send to rank {dst}: {wrong}"}, b"")
                return
            ref = self._next()
            record.publish(record.Message(rank, dst, len(payload), tag, ref))
            self._untaken[ref] = (rank, dst, header.get("id"), frame)
            self._held.sent(rank, dst, frame)
            message = {"k": "msg", "src": rank, "tag": tag, "parts": frames.flat_parts(parts), "ref": ref}
            if self.schedule is not None:      # seeded delays (distlab.relay.schedule)
                self.schedule.hold(rank, dst, (dst, message, payload))
            else:
                self._queue(dst, message, payload)
        elif kind == "taken":
            sender = self._untaken.get(header.get("ref"))
            if sender is not None and sender[1] == rank:       # only the receiver says it took a message
                del self._untaken[header.get("ref")]
                self._held.took(sender[0], rank, sender[3])     # no longer held for the sender
                self._queue(sender[0], {"k": "taken", "id": sender[2]}, b"")   # its send completes
        elif kind == "coll":
            self._collective(rank, header, payload, frame)
        else:
            self._queue(rank, {"k": "error", "message": f"unknown frame {kind!r}"}, b"")

    def _collective(self, rank: int, header: dict, payload: bytearray, frame: int) -> None:
        ranks = header.get("ranks") or list(range(self.nprocs))
        if not isinstance(ranks, list) or rank not in ranks or len(set(ranks)) != len(ranks) \
                or not all(isinstance(r, int) and 0 <= r < self.nprocs for r in ranks):
            self._queue(rank, {"k": "error", "message": f"rank {rank} is not in the group {ranks!r}"}, b"")
            return
        wrong = collectives.wrong_call(header.get("op"), header.get("reduction", "sum"), header.get("root", 0), ranks)
        if wrong is not None:      # refused here: what reaches the other ranks is one of the relay's names
            self._queue(rank, {"k": "error", "message": f"rank {rank}: {wrong}"}, b"")
            return
        key = (header.get("group"), tuple(ranks), header.get("seq"))
        waiting = self._pending.setdefault(key, {})
        if rank in waiting:                       # the same call twice: the first is replaced
            self._held.waiting[rank] -= waiting[rank][2]
        waiting[rank] = (header, payload, frame)
        self._held.waiting[rank] += frame
        if len(waiting) < len(ranks):
            return
        del self._pending[key]
        for r in ranks:
            self._held.waiting[r] -= waiting[r][2]
        reply = {"k": "done", "group": header.get("group"), "seq": header.get("seq")}
        try:
            first = waiting[ranks[0]][0]
            for r in ranks:
                other = waiting[r][0]
                for field in ("op", "reduction", "root"):
                    if other.get(field) != first.get(field):
                        raise collectives.Mismatch(
                            f"rank {ranks[0]} called {first.get('op')} ({field} {first.get(field)!r}) while rank "
                            f"{r} called {other.get('op')} ({field} {other.get(field)!r}) on the same group")
            contributions = [frames.decode(waiting[r][0].get("parts", []), waiting[r][1]) for r in ranks]
            op, root = first.get("op"), first.get("root", 0)
            outputs = collectives.perform(op, contributions, first.get("reduction", "sum"), root)
        except (collectives.Mismatch, frames.BrokenFrame, RuntimeError, TypeError) as exc:
            for r in ranks:      # the others' shapes, for the student: a few lines, not a channel
                self._queue(r, dict(reply, k="error", message=str(exc)[:collectives.MOST_ERROR_CHARS]), b"")
            return
        sizes = [len(waiting[r][1]) for r in ranks]
        n = len(ranks)
        sent = tuple(collectives.counted_bytes(op, [frames.parts_bytes([p]) for p in waiting[r][0].get("parts", [])],
                                               i, n, root)[0] for i, r in enumerate(ranks))
        record.publish(record.Collective(op, tuple(ranks), sent, tuple(sizes), str(first.get("reduction", "")),
                                         self._next()))
        for r, out in zip(ranks, outputs):
            parts, payload_out = frames.encode(out)
            self._queue(r, dict(reply, parts=parts), payload_out)
