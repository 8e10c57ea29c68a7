"""Kernels for the book's pages, forked from a process that has already imported torch.

Every executed page runs in a fresh kernel, and each fresh kernel spends about two seconds of
CPU before its first line of the page: starting Python and ipykernel, then ``import torch``,
matplotlib and distlab. With 37 pages that is more than a minute of every build. Here one
*template* process imports all of that once, at the start of the build; each page's kernel is
a ``fork()`` of it, which starts in a few milliseconds with those modules already loaded.

A page sees what a fresh kernel would: a new process, in a session of its own, with the
environment, working directory and connection file that Jupyter asked for. The template
never runs a line of any page, and starts no thread before it forks (a fork copies only the
thread that calls it). What differs: modules the template imported are not imported again, so
a page cannot change how they initialise through environment variables set in its cells (no
page does; ranks are new processes and read their environment as usual).

Two pieces:

* the template, ``python forked_kernels.py SOCKET``: imports, then forks a kernel for each
  request on its Unix socket and reports each kernel's end on the request's connection;
* :class:`ForkedProvisioner`, the Jupyter kernel provisioner the build uses instead of
  ``local-provisioner``: it asks the template for a kernel and signals it by process id, as
  the local provisioner signals the process it started.

``DISTLAB_BOOK_FORKED_KERNELS=0`` turns this off (for comparing build times).

Either way, each page's kernel talks over Unix sockets in a folder of its own, mode 0700
(:class:`PrivateSocketsProvisioner`, with :mod:`distlab.grade.boundary.kernel_sockets`), not over TCP
ports of ``127.0.0.1`` that any account on the machine could listen to.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOAD = ["torch", "torch.distributed", "torch.nn.functional", "numpy", "matplotlib.pyplot",
           "distlab", "distlab.models", "distlab.figures.plots", "IPython.display", "ipykernel.kernelapp"]
"""What every page imports (or ipykernel imports for it), loaded once in the template."""

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to end this process when its parent ends (the build, or the template)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# --------------------------------------------------------------------------------- template

def _run_kernel(request: dict, inherited: list[socket.socket]) -> None:
    """In the forked child: become the kernel Jupyter asked for; never return."""
    code = 1
    try:
        for connection in inherited:     # the template's sockets are none of the kernel's business
            connection.close()
        os.setsid()                      # its own process group, as the local provisioner's kernels
        _die_with_parent()
        # The signal handlers a new Python starts with, whatever the build inherited (a build
        # started in the background of a script ignores SIGINT): interrupts must reach the page.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        from distlab.grade.boundary.kernel_sockets import subprocess_output_through_private_socket

        subprocess_output_through_private_socket(request["argv"])
        # ipykernel read JPY_PARENT_PID when the template imported it: say who the parent is now
        # (it then ends the kernel if the template goes, and prints no banner for humans).
        sys.argv = ["ipykernel_launcher", *request["argv"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        import atexit

        atexit._run_exitfuncs()          # what a normal interpreter exit runs (a page's pools stop)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(socket_path: str) -> None:
    """The template's life: import, say so, then fork one kernel per connection."""
    _die_with_parent()
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # as ipykernel sets it
    for name in PRELOAD:
        __import__(name)
    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path)
    server.listen()
    Path(socket_path + ".ready").touch()
    waiting: dict[int, socket.socket] = {}     # kernel pid -> the connection that asked for it
    while True:
        server.settimeout(0.05)
        try:
            connection, _ = server.accept()
        except TimeoutError:
            connection = None
        if connection is not None:
            connection.settimeout(None)
            request = json.loads(connection.makefile().readline())
            pid = os.fork()
            if pid == 0:
                _run_kernel(request, [server, connection, *waiting.values()])
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection
        while waiting:                        # report every kernel that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                try:
                    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                connection.close()


class Template:
    """The template process, for the length of a build (see the module's docstring)."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="distlab-kernels-"))
        self.socket_path = str(self.folder / "template.sock")
        # Its output is the build's, as a kernel started by Jupyter would have it.
        self.process = subprocess.Popen([sys.executable, __file__, self.socket_path], stdin=subprocess.DEVNULL)
        ready = Path(self.socket_path + ".ready")
        while not ready.exists():
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError("the kernel template did not start (see its output above)")
            time.sleep(0.02)

    def fork(self, argv: list[str], env: dict, cwd: str) -> tuple[int, socket.socket]:
        """A new kernel: its pid, and the connection on which its exit code will arrive."""
        connection = socket.socket(socket.AF_UNIX)
        connection.connect(self.socket_path)
        connection.sendall((json.dumps({"argv": argv, "env": env, "cwd": cwd}) + "\n").encode())
        line = b""
        while not line.endswith(b"\n"):
            chunk = connection.recv(64)
            if not chunk:
                raise RuntimeError("the kernel template ended")
            line += chunk
        return int(line), connection

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()


TEMPLATE: Template | None = None
"""The build's template, while it runs (set by :func:`start`)."""


# ------------------------------------------------------------------------------ provisioner

try:
    from jupyter_client.provisioning import LocalProvisioner

    from distlab.grade.boundary import kernel_sockets
except ImportError:  # the template process itself needs none of this
    LocalProvisioner = object


class PrivateSocketsProvisioner(LocalProvisioner):
    """``local-provisioner``, the kernel on Unix sockets in a folder only this account can
    enter (:func:`distlab.grade.boundary.kernel_sockets.use_private_sockets`), kept across a restart."""

    sockets_folder: str | None = None

    async def pre_launch(self, **kwargs):
        if self.sockets_folder is None:
            self.sockets_folder = kernel_sockets.use_private_sockets(self.parent)
        return await super().pre_launch(**kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs):
        # ipykernel's launcher, with its one other socket moved beside these (see kernel_sockets)
        cmd = [kernel_sockets.__name__ if part == "ipykernel_launcher" else part for part in cmd]
        return await super().launch_kernel(cmd, **kwargs)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if self.sockets_folder and not restart:
            shutil.rmtree(self.sockets_folder, ignore_errors=True)
            self.sockets_folder = None


class ForkedProvisioner(PrivateSocketsProvisioner):
    """``local-provisioner``, except that the kernel is a fork of the template, not a new Python."""

    pid: int | None = None
    exit_code: int | None = None
    connection: socket.socket | None = None

    @property
    def has_process(self) -> bool:
        return self.pid is not None

    async def launch_kernel(self, cmd: list[str], **kwargs):
        # cmd is the kernelspec's argv: [python, -m, ipykernel_launcher, -f, CONNECTION_FILE]
        arguments = cmd[cmd.index("ipykernel_launcher") + 1:]
        env = kwargs.get("env") or dict(os.environ)
        cwd = str(kwargs.get("cwd") or os.getcwd())
        self.pid, self.connection = TEMPLATE.fork(arguments, env, cwd)
        self.pgid, self.cwd, self.exit_code = self.pid, cwd, None
        self.connection.setblocking(False)
        return self.connection_info

    async def poll(self) -> int | None:
        if self.pid is None:
            return 0
        if self.exit_code is None:
            try:
                said = self.connection.recv(64)
            except BlockingIOError:
                return None
            self.exit_code = int(said) if said.strip() else -signal.SIGKILL   # template gone: so is the kernel
        return self.exit_code

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.02)
        code = self.exit_code
        if self.connection is not None:
            self.connection.close()
        self.pid = self.connection = None
        return code

    async def send_signal(self, signum: int) -> None:
        if self.pid is not None and await self.poll() is None:
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def get_provisioner_info(self) -> dict:
        info = await super().get_provisioner_info()
        info.update(pid=self.pid, pgid=self.pid)
        return info


NAME = "distlab-forked-kernel"
PRIVATE_NAME = "distlab-private-kernel"


def start() -> int | None:
    """Start the template and make it the way kernels start in this process; its pid.
    ``None`` when switched off: kernels start as new Pythons (on private sockets all the same)."""
    global TEMPLATE
    from importlib.metadata import EntryPoint

    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    for name, provisioner in ((NAME, "ForkedProvisioner"), (PRIVATE_NAME, "PrivateSocketsProvisioner")):
        factory.provisioners[name] = EntryPoint(name, f"{__name__}:{provisioner}", factory.GROUP_NAME)
    if os.environ.get("DISTLAB_BOOK_FORKED_KERNELS", "1") == "0":
        factory.default_provisioner_name = PRIVATE_NAME
        return None
    TEMPLATE = Template()
    factory.default_provisioner_name = NAME
    return TEMPLATE.process.pid


def stop() -> None:
    global TEMPLATE
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    KernelProvisionerFactory.instance().default_provisioner_name = "local-provisioner"
    if TEMPLATE is not None:
        TEMPLATE.stop()
        TEMPLATE = None


if __name__ == "__main__":
    serve(sys.argv[1])
