"""Between the grading kernel and the grader: whole messages counted and capped before ZeroMQ holds them.

The grader's ZeroMQ sockets refuse a message *part* over
:data:`~distlab.grade.boundary.kernel_messages.MAX_MESSAGE_BYTES` (``ZMQ_MAXMSGSIZE`` is per part), but a
ZeroMQ message may have any number of parts, and ZeroMQ hands a message over only once all of
its parts have arrived: until then it keeps them, in the reader's process. Student code in the
kernel can send on the kernel's own sockets (``get_ipython().kernel.session.send(...,
buffers=[...])``), so 25 parts of 4 MiB each were 100 MB held, then decoded, in the nbgrader
process, past every per-part cap.

So the grader does not connect to the kernel's sockets. :class:`MessageCapProxy` listens on
Unix sockets of its own, in a new folder of mode 0700, one per channel; the grader's client
connects there, and for each connection the proxy connects to the kernel's socket and passes
the bytes on. Towards the kernel they pass as they are. From the kernel it reads ZeroMQ's wire
protocol (ZMTP 3: a 64-byte greeting, then frames, each a flags byte, its length in 1 or 8
bytes, and its body; a message is frames up to one without the MORE flag) and keeps the frames
of one message until its last one: a message whose frames come to more than
:data:`~distlab.grade.boundary.kernel_messages.MAX_MESSAGE_BYTES` in all is dropped as it arrives (what
is kept of it goes, the rest is read and thrown away), counted in :attr:`refused`, and never
reaches the grader; the connection stays up, so nothing after it is lost. The proxy keeps at
most one capped message per connection; ZeroMQ's own high-water mark then bounds what the
grader's sockets hold. A kernel that speaks anything but ZMTP 3 is cut off.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tempfile
import threading
import time

from distlab.grade.boundary.kernel_messages import MAX_MESSAGE_BYTES

GREETING_BYTES = 64
"""A ZMTP 3 greeting: signature (10 bytes), version (2), mechanism (20), as-server (1), filler (31)."""
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
"""A frame's flags: more frames of this message follow; its length takes 8 bytes; a command, not a message."""
MAX_COMMAND_BYTES = 2**16
"""The largest ZMTP command passed on (READY, PING, SUBSCRIBE... are a few bytes)."""
CHUNK = 2**20
KERNEL_START_SECONDS = 120.0
"""How long a connection waits for the kernel's socket to appear (a kernel starts in seconds)."""
CONNECT_RETRY_SECONDS = 0.05


class KernelCutOff(Exception):
    """The kernel broke ZMTP, or a connection ended: that connection is closed."""


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        got = sock.recv(min(CHUNK, size - len(data)))
        if not got:
            raise KernelCutOff("the connection ended")
        data += got
    return bytes(data)


def _skip(sock: socket.socket, size: int) -> None:
    buffer = bytearray(min(CHUNK, max(size, 1)))
    while size:
        got = sock.recv_into(buffer, min(len(buffer), size))
        if not got:
            raise KernelCutOff("the connection ended")
        size -= got


def _frame_header(sock: socket.socket) -> tuple[int, int, bytes]:
    """``(flags, body length, the header's bytes)`` of the next frame."""
    first = _read_exactly(sock, 1)
    flags = first[0]
    raw = _read_exactly(sock, 8 if flags & LONG else 1)
    size = struct.unpack(">Q", raw)[0] if flags & LONG else raw[0]
    return flags, size, first + raw


def pass_capped_messages(kernel: socket.socket, grader: socket.socket, cap: int, on_refused) -> None:
    """Pass ZMTP from ``kernel`` to ``grader``, every message over ``cap`` bytes in all dropped
    (``on_refused()`` once for each); return when a side closes or the kernel breaks ZMTP."""
    # the greeting in its steps, each passed on at once: ZeroMQ sends the next one only once the
    # other side's came (the signature, then the major version, then the rest)
    signature = _read_exactly(kernel, 10)
    if signature[0] != 0xFF or signature[9] != 0x7F:
        raise KernelCutOff("not a ZMTP greeting")
    grader.sendall(signature)
    major = _read_exactly(kernel, 1)
    if major[0] < 3:
        raise KernelCutOff(f"ZMTP version {major[0]}, not 3")
    grader.sendall(major)
    grader.sendall(_read_exactly(kernel, GREETING_BYTES - 11))
    kept, size_kept, refusing = [], 0, False
    while True:
        flags, size, header = _frame_header(kernel)
        if flags & COMMAND:
            if size > MAX_COMMAND_BYTES:
                raise KernelCutOff(f"a ZMTP command of {size} bytes")
            grader.sendall(header + _read_exactly(kernel, size))
            continue
        if not refusing and size_kept + len(header) + size > cap:
            kept, size_kept, refusing = [], 0, True
            on_refused()
        if refusing:
            _skip(kernel, size)
        else:
            kept.append(header + _read_exactly(kernel, size))
            size_kept += len(kept[-1])
        if not flags & MORE:   # the message's last frame
            if not refusing:
                grader.sendall(b"".join(kept))
            kept, size_kept, refusing = [], 0, False


def pass_everything(source: socket.socket, target: socket.socket) -> None:
    while data := source.recv(CHUNK):
        target.sendall(data)


class MessageCapProxy:
    """Unix sockets ``<folder>/socket-<port>``, each passing a channel of the kernel at
    ``<kernel_base>-<port>`` on, its messages capped at ``cap`` bytes (see the module's docstring)."""

    def __init__(self, kernel_base: str, ports: list[int], cap: int = MAX_MESSAGE_BYTES):
        self.kernel_base, self.cap = kernel_base, cap
        self.folder = tempfile.mkdtemp(prefix="distlab-grader-")   # mode 0700
        self.base = os.path.join(self.folder, "socket")
        self.refused = 0
        self._reached: set[int] = set()   # ports whose kernel socket took a connection once
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        for port in ports:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(f"{self.base}-{port}")
            listener.listen(8)
            self._sockets.append(listener)
            threading.Thread(target=self._accept, args=(listener, port), daemon=True,
                             name=f"distlab-kernel-proxy-{port}").start()

    def take_refused(self) -> int:
        """Messages dropped since the last call."""
        with self._lock:
            count, self.refused = self.refused, 0
        return count

    def _count_refusal(self) -> None:
        with self._lock:
            self.refused += 1

    def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            try:
                grader, _ = listener.accept()
            except OSError:   # closed
                return
            with self._lock:
                if self._closed:
                    grader.close()
                    return
                self._sockets.append(grader)
            threading.Thread(target=self._connect, args=(grader, port), daemon=True,
                             name=f"distlab-kernel-proxy-{port}").start()

    def _connect(self, grader: socket.socket, port: int) -> None:
        """Connect ``grader``'s connection to the kernel's socket (which may not be there yet: the
        grader connects as soon as the kernel is started, and its sockets come seconds later).
        A socket that took a connection before and refuses one now belongs to a kernel that is
        gone (killed, or its sockets closed): the proxy then closes, so that the grader's
        channels, which connect again after a dropped connection, find no listener and stop at
        once (:class:`distlab.grade.boundary.kernel_messages.CappedChannel`) instead of waiting
        for a kernel that will not come back."""
        deadline = time.monotonic() + KERNEL_START_SECONDS
        while True:
            kernel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                kernel.connect(f"{self.kernel_base}-{port}")
                break
            except OSError:
                kernel.close()
                if port in self._reached:   # it was there, and is no more: the kernel is gone
                    _close_both(grader)
                    self.close()   # the grader's channels find nothing to connect to, and stop trying
                    return
                if self._closed or time.monotonic() > deadline:
                    _close_both(grader)
                    return
                time.sleep(CONNECT_RETRY_SECONDS)
        with self._lock:
            self._reached.add(port)
            self._sockets.append(kernel)
        threading.Thread(target=self._to_kernel, args=(grader, kernel), daemon=True,
                         name=f"distlab-kernel-proxy-{port}").start()
        self._from_kernel(kernel, grader)

    def _from_kernel(self, kernel: socket.socket, grader: socket.socket) -> None:
        try:
            pass_capped_messages(kernel, grader, self.cap, self._count_refusal)
        except (KernelCutOff, OSError):
            pass
        finally:
            _close_both(kernel, grader)

    def _to_kernel(self, grader: socket.socket, kernel: socket.socket) -> None:
        try:
            pass_everything(grader, kernel)
        except OSError:
            pass
        finally:
            _close_both(kernel, grader)

    def close(self) -> None:
        """Stop listening, end every connection, remove the folder."""
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close_both(sock)
        shutil.rmtree(self.folder, ignore_errors=True)


def _close_both(*sockets: socket.socket) -> None:
    """Shut down and close: a thread blocked reading the socket wakes up."""
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def interpose(km) -> MessageCapProxy:
    """Start a :class:`MessageCapProxy` in front of the kernel ``km`` has just launched and point
    ``km`` (its control socket, the clients it makes) at it; :func:`remove` ends it."""
    proxy = MessageCapProxy(km.ip, [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port])
    km.ip, km.message_cap = proxy.base, proxy
    return proxy


def remove(km) -> None:
    proxy = getattr(km, "message_cap", None)
    if proxy is not None:
        km.message_cap = None
        proxy.close()
