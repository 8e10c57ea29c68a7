"""Jupyter kernels on Unix sockets in a folder only their owner can enter.

A Jupyter kernel talks to whoever started it over five ZeroMQ sockets. Jupyter's default
transport is TCP on ``127.0.0.1``, and every account on the machine can reach those ports:
``/proc/net/tcp`` lists each listening port with its owner's uid for anyone to read, and a
``SUB`` socket connected to the kernel's IOPub port receives every message the kernel
publishes, the code of each cell and everything it prints (the connection file's key signs
the messages; it does not hide them). ipykernel says so itself at start: "Kernel is running
over TCP without encryption". On a node that several students share, that is a classmate
reading your notebook as you run it, or a student reading the grader's.

Jupyter's other transport, ``ipc``, uses Unix sockets: files, reached through the file
system and its permissions. Their paths are public too (``/proc/net/unix``), but a socket in a
folder of mode 0700 cannot be reached by anyone but the folder's owner (and root).
:func:`use_private_sockets` points a kernel manager at such a folder, fresh for each kernel
(``tempfile.mkdtemp``: a new random name, mode 0700, never one another account could have
made first); the connection file lives there too.

Who uses it: the grading kernel (:class:`distlab.grade.pipeline.grading_kernel.GradingKernelManager`), any
nbgrader command that runs a notebook (:class:`PrivateSocketsKernelManager`, named in the
nbgrader configurations), and the book's build (``book/_ext/forked_kernels.py``). A student's
server on the hub sets ``KernelManager.transport = "ipc"`` instead (hub/jupyter/
jupyter_server_config.py): there Jupyter Server names each kernel's connection file in its
runtime folder, which it keeps at mode 0700.

One more listening socket: ipykernel gathers the output of processes its kernel forks (a
``multiprocessing`` worker's prints) through a ``PULL`` socket that it binds to a random TCP
port of ``127.0.0.1`` whatever the transport. A forked process must prove itself with a random
token before its output is shown, but any account can still connect and fill the kernel's
error log. :func:`subprocess_output_through_private_socket` moves it next to the kernel's
other sockets; ``python -m distlab.grade.boundary.kernel_sockets -f CONNECTION_FILE`` is ipykernel's
own launcher with that change, the command of the hub's Python kernel
(hub/jupyter/course_kernels.py); the grading kernel and the book's kernels make it themselves.

A Unix socket's path may be at most 107 bytes long; the folder is made in the temporary
folder (``$TMPDIR``, else ``/tmp``), whose path is short.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from jupyter_client.manager import AsyncKernelManager

MAX_SOCKET_PATH = 107
"""The longest path a Unix socket may have on Linux (``sockaddr_un.sun_path``, less its final NUL)."""
SOCKET_BASE = "socket"
"""The sockets are ``<folder>/socket-<n>``, one per channel (Jupyter numbers them)."""


def use_private_sockets(km) -> str:
    """Point ``km`` (a jupyter_client kernel manager whose kernel has not started yet) at Unix
    sockets in a new folder only this account can enter; return the folder, which the caller
    removes once the kernel is gone."""
    folder = tempfile.mkdtemp(prefix="distlab-kernel-")
    km.transport = "ipc"
    km.cache_ports = False   # the TCP port cache: nothing to cache for Unix sockets
    km.connection_file = os.path.join(folder, "kernel.json")
    km.ip = os.path.join(folder, SOCKET_BASE)
    return folder


class PrivateSocketsKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, its kernel on Unix sockets in a private folder (see the
    module's docstring); the folder goes when the kernel is cleaned up (not on a restart)."""

    sockets_folder: str | None = None

    async def start_kernel(self, **kw):
        if self.sockets_folder is None:
            self.sockets_folder = use_private_sockets(self)
        return await self._async_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments=None):
        # ipykernel's launcher becomes this module's: its one other socket moves beside these
        return [__name__ if part == "ipykernel_launcher" else part
                for part in super().format_kernel_cmd(extra_arguments)]

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self.sockets_folder and not restart:
            shutil.rmtree(self.sockets_folder, ignore_errors=True)
            self.sockets_folder = None


def _folder_removed_at_exit() -> str:
    """A new private folder in the temporary folder, removed when this process exits (not
    when a process it forked does)."""
    import atexit

    folder, owner = tempfile.mkdtemp(prefix="distlab-kernel-"), os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(folder, ignore_errors=True))
    return folder


def subprocess_output_through_private_socket(argv: list[str]) -> None:
    """In a kernel's process, before ipykernel starts (``argv``: its command line, holding
    ``-f CONNECTION_FILE``): if the kernel's transport is ``ipc``, the socket through which
    its forked processes send their output becomes a Unix socket beside its other sockets
    instead of a TCP port. A kernel on TCP is left as it is."""
    try:
        with open(argv[argv.index("-f") + 1]) as f:
            info = json.load(f)
    except (ValueError, IndexError, OSError):
        return
    if info.get("transport") != "ipc":
        return
    import zmq
    from ipykernel import iostream
    from zmq.eventloop.zmqstream import ZMQStream

    path = f"{info['ip']}-out"
    if len(path.encode()) > MAX_SOCKET_PATH:   # a long folder: a private one of its own instead
        path = os.path.join(_folder_removed_at_exit(), "out")
    endpoint = f"ipc://{path}"

    def setup_pipe_in(thread):   # ipykernel's IOPubThread._setup_pipe_in, on that endpoint
        thread._pipe_uuid = os.urandom(16)
        pipe_in = thread.socket.context.socket(zmq.PULL)
        pipe_in.linger = 0
        pipe_in.bind(endpoint)
        thread._pipe_in = ZMQStream(pipe_in, thread.io_loop)
        thread._pipe_in.on_recv(thread._handle_pipe_msg)

    def setup_pipe_out(thread):  # ... and _setup_pipe_out, in a forked process
        context = zmq.Context()
        pipe_out = context.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(endpoint)
        return context, pipe_out

    iostream.IOPubThread._setup_pipe_in = setup_pipe_in
    iostream.IOPubThread._setup_pipe_out = setup_pipe_out


def main() -> None:
    """``python -m distlab.grade.boundary.kernel_sockets -f CONNECTION_FILE``: ipykernel's launcher."""
    subprocess_output_through_private_socket(sys.argv)
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
