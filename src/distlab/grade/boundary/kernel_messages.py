"""The grader's ends of a grading kernel's channels: every message capped before it is read.

nbgrader talks to the grading kernel over ZeroMQ sockets (:mod:`distlab.grade.boundary.kernel_sockets`).
ZeroMQ hands a message to its reader only once the whole of it has arrived, and jupyter_client
then decodes it: a kernel that prints 100 MB in one go sends one message of 100 MB, and it is
all in the nbgrader process's memory, several times over while it is decoded, before
:class:`distlab.grade.boundary.student_output.CappedCellOutputs` keeps its first MiB. That process runs
outside the submission's control group; the kernel decides how big its messages are.

So the grader's sockets refuse a message part over :data:`MAX_MESSAGE_BYTES` as it arrives
(ZeroMQ's ``ZMQ_MAXMSGSIZE``: the length is read from the part's header, and the bytes are
never kept), and hold at most :data:`QUEUED_MESSAGES` messages not yet read (``ZMQ_RCVHWM``;
past that the kernel's side waits, and its own memory holds the rest). No message the cell's
output cap could keep is refused: the cap keeps :data:`~distlab.grade.boundary.student_output.MAX_CELL_OUTPUT_CHARS`
characters, at most 4 bytes each in UTF-8.

That cap is per part, and a message may have many parts, all kept by ZeroMQ until the last
one is in: the grader's kernel manager therefore puts :mod:`distlab.grade.boundary.kernel_proxy`
between the kernel and these sockets, which drops a message whose parts come to more than
:data:`MAX_MESSAGE_BYTES` together before any of it reaches them, and counts it for
:func:`explain`; the cap here stays as a second line.

ZeroMQ answers an oversized message by dropping the connection for good. :class:`CappedChannel`
watches for that (a socket monitor), connects again, and counts it; :func:`explain` then adds
:data:`NOTE` to the cell that sent it. Whatever the kernel published while the connection was
down is lost, its "idle" status included: nbclient waits its ``iopub_timeout`` (4 s) for it and
moves on to the next cell (nbgrader's ``Execute`` raises instead: :func:`only_output_lost` tells
that apart from a kernel that stopped answering).
"""

from __future__ import annotations

import time

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type, default
from zmq.utils.monitor import recv_monitor_message

from distlab.grade.boundary.student_output import MAX_CELL_OUTPUT_CHARS

MAX_MESSAGE_BYTES = 4 * MAX_CELL_OUTPUT_CHARS + 2**20
"""Largest part of a kernel message the grader reads (5 MiB): a cell's whole output cap in
UTF-8, plus a MiB for the message's own fields."""
QUEUED_MESSAGES = 16
"""Messages a socket holds before the grader reads them; with :data:`MAX_MESSAGE_BYTES`, what
one socket can make the grader keep (80 MiB)."""
CHECK_SECONDS = 0.25
"""How often a channel that is waiting for a message looks whether its connection was dropped."""
RECONNECT_SECONDS = 10.0
"""How long a channel waits for its connection to be made again."""
LATE_REFUSAL_SECONDS = 30.0
"""How long the grader waits for a refused message when a cell's output stopped short."""
NOTE = (f"\n[distlab.grade: the kernel sent a message over {MAX_MESSAGE_BYTES // 2**20} MiB, more than the "
        "grader reads in one message; it was refused unread, so this cell's output is incomplete]\n")
"""What the grader adds to a cell during which the kernel sent a message over the cap."""


def capped_context(context=None):
    """A ZeroMQ context (``context``, or a new asyncio one) whose new sockets carry the caps."""
    context = zmq.asyncio.Context() if context is None else context
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
    return context


class CappedChannel(AsyncZMQSocketChannel):
    """jupyter_client's channel, connecting again when ZeroMQ drops the connection over a
    message past the cap (see the module's docstring); :attr:`refused` counts those."""

    def __init__(self, socket, session, loop=None):
        super().__init__(socket, session, loop)
        self.refused = 0
        address = f"inproc://distlab-monitor-{id(self)}"
        socket.monitor(address, zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED)
        # a socket of the client's context (which closes it with the rest), read without asyncio
        self._monitor_socket = socket.context.socket(zmq.PAIR)
        self._monitor_socket.linger = 0
        self._monitor_socket.connect(address)
        self._monitor = zmq.Socket.shadow(self._monitor_socket.underlying)

    def reconnect_if_dropped(self) -> None:
        while self.socket is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._connect_again(event.get("endpoint", b"").decode())

    def _connect_again(self, endpoint: str) -> None:
        """Connect again and wait until the connection is made (a SUB socket's subscription
        leaves right after; what the kernel publishes before that is lost, the next cell's
        output included), at most :data:`RECONNECT_SECONDS`; each connection dropped counts in
        :attr:`refused`. Nothing listening at the endpoint (ZeroMQ retries) means the kernel is
        gone, and the proxy in front of it with it: its connections ended with it, nothing was
        refused, and there is nothing to wait for (it was :data:`RECONNECT_SECONDS` per channel,
        after every cell, once a kernel had been killed, and a note of a refused message)."""
        deadline = time.monotonic() + RECONNECT_SECONDS
        dropped = 0
        while True:
            dropped += 1
            try:
                self.socket.disconnect(endpoint)
            except zmq.ZMQError:
                pass   # ZeroMQ forgot the endpoint already
            self.socket.connect(endpoint)
            while time.monotonic() < deadline:
                if not self._monitor.poll(int(CHECK_SECONDS * 1000)):
                    continue
                event = recv_monitor_message(self._monitor)
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    time.sleep(CHECK_SECONDS)   # the subscription, on its way to the kernel
                    self.refused += dropped
                    return
                if event["event"] == zmq.EVENT_DISCONNECTED:   # refused again, or the kernel is gone
                    break
                if event["event"] == zmq.EVENT_CONNECT_RETRIED:   # no one listens there: the kernel is gone
                    return
            else:
                self.refused += dropped
                return

    async def get_msg(self, timeout: float | None = None):
        """A message, as jupyter_client's; while waiting, a dropped connection is made again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = CHECK_SECONDS if deadline is None else min(CHECK_SECONDS, deadline - time.monotonic())
            if await self.socket.poll(max(0, int(left * 1000))):
                return await self._recv()
            self.reconnect_if_dropped()
            if deadline is not None and time.monotonic() >= deadline:
                return await super().get_msg(0)   # raises Empty, as jupyter_client's does

    def close(self) -> None:
        if self.socket is not None:
            try:
                self.socket.disable_monitor()
            except zmq.ZMQError:
                pass
        self._monitor_socket.close(linger=0)
        super().close()


class CappedKernelClient(AsyncKernelClient):
    """The client nbclient uses to run a graded notebook: its channels' sockets capped."""

    shell_channel_class = Type(CappedChannel)
    iopub_channel_class = Type(CappedChannel)
    stdin_channel_class = Type(CappedChannel)
    control_channel_class = Type(CappedChannel)

    @default("context")
    def _context_default(self):
        self._created_context = True
        return capped_context()

    def refused_within(self, seconds: float) -> int:
        """:meth:`take_refused`, waiting up to ``seconds`` for a refusal: on a busy machine a
        message of 100 MB reaches the grader seconds after the kernel's reply to its cell."""
        deadline = time.monotonic() + seconds
        while not (refused := self.take_refused()) and time.monotonic() < deadline:
            time.sleep(CHECK_SECONDS)
        return refused

    def take_refused(self) -> int:
        """Messages refused since the last call (connections that were dropped are made again),
        those the proxy in front of the kernel dropped included (:mod:`distlab.grade.boundary.kernel_proxy`)."""
        proxy = getattr(self.parent, "message_cap", None)   # set by kernel_proxy.interpose
        count = proxy.take_refused() if proxy is not None else 0
        for channel in (self._shell_channel, self._iopub_channel, self._stdin_channel, self._control_channel):
            if channel is not None:
                channel.reconnect_if_dropped()
                count, channel.refused = count + channel.refused, 0
        return count


def explain(cell, client) -> None:
    """Add :data:`NOTE` to ``cell`` if the kernel sent a message over the cap while it ran."""
    if isinstance(client, CappedKernelClient) and client.take_refused():
        from nbformat.notebooknode import NotebookNode

        cell.setdefault("outputs", []).append(NotebookNode({"output_type": "stream", "name": "stderr", "text": NOTE}))


def only_output_lost(exc: Exception, cell, client, answered: bool = True) -> bool:
    """Whether ``exc``, raised while ``cell`` ran, means only that the cell's last messages were
    lost with a refused one: the kernel answered, but its "idle" status never came. Then
    :func:`explain` has noted it in ``cell``, and the kernel is fine for the next cell.

    ``answered``: whether the kernel answered the cell at all. Past the cell's time limit
    nbclient makes an error reply up itself (nbgrader's ``interrupt_on_timeout``) and then waits
    for the output as if the kernel had answered; a refusal then had the whole time limit to
    arrive, so it is looked for without waiting :data:`LATE_REFUSAL_SECONDS` more (a kernel
    that cannot reply, builtins replaced, cost 30 s more than its time limit)."""
    from nbclient.exceptions import CellTimeoutError

    if not isinstance(exc, CellTimeoutError) or "Timeout waiting for IOPub output" not in str(exc):
        return False
    if not isinstance(client, CappedKernelClient):
        return False
    if not (client.refused_within(LATE_REFUSAL_SECONDS) if answered else client.take_refused()):
        return False
    from nbformat.notebooknode import NotebookNode

    cell.setdefault("outputs", []).append(NotebookNode({"output_type": "stream", "name": "stderr", "text": NOTE}))
    return True
