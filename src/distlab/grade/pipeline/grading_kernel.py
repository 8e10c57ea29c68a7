"""The kernel a graded notebook runs in, as nbgrader's ``Execute`` starts it.

:class:`GradingKernelManager` is a jupyter_client ``KernelManager`` that starts
``<this python> -m distlab.grade.boundary.kernel`` inside the grading sandbox, behind its keeper,
with its output drained to the grader's log and its messages capped. Each of those is a piece of
the trust boundary in :mod:`distlab.grade.boundary`; this module only puts them in the order a
kernel start needs. :class:`distlab.grade.pipeline.nbplugins.KernelExecute` uses it.
"""

from __future__ import annotations

import os
import sys

from distlab.grade.boundary import (
    bubblewrap,
    kernel_messages,
    kernel_proxy,
    sandbox_keeper,
    scratch,
    student_output,
    submission_caps,
)
from distlab.grade.boundary.kernel_sockets import PrivateSocketsKernelManager, use_private_sockets


class GradingKernelManager(PrivateSocketsKernelManager):
    """Starts the kernel as ``<this python> -m distlab.grade.boundary.kernel``: the project's .venv, capped.

    It talks to nbgrader through Unix sockets in a private folder
    (:mod:`distlab.grade.boundary.kernel_sockets`): no other account on the grading host can listen to
    it. Inside the operating-system boundary (:mod:`distlab.grade.boundary.bubblewrap`) the kernel has a
    network of its own anyway, so it could not listen on the grader's ``127.0.0.1``. That
    folder, which the kernel must write, is a capped memory file system of its own there
    (:mod:`distlab.grade.boundary.scratch`), reached through the sandbox's mounts. Interrupting a cell
    that runs too long is a message (``interrupt_request``): a signal to the kernel's process
    group would reach ``bwrap`` instead.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sandboxed = bubblewrap.enabled()
        self.kernel_cwd = os.getcwd()
        self.drain = None            # the kernel's stdout and stderr, on their way to the log
        self.leash = None            # the kernel's keeper ends it when nbgrader lets go or dies
        # its messages, capped before they are read (no setting may swap the client out)
        self.client_factory = kernel_messages.CappedKernelClient
        self.context = kernel_messages.capped_context(self.context)

    async def start_kernel(self, **kw):
        self.kernel_cwd = kw.get("cwd") or os.getcwd()
        if self.sockets_folder is None:   # removed by the base class's cleanup
            self.sockets_folder = use_private_sockets(self)
        # Its standard output (and ipykernel's saved copy of it) is never nbgrader's own.
        self.drain = student_output.Drain("the kernel")
        self.leash = sandbox_keeper.Leash()
        try:
            return await self._async_start_kernel(**kw, stdout=self.drain.write_fd, stderr=self.drain.write_fd,
                                                  **self.leash.popen_options())
        finally:
            self.drain.started()
            self.leash.started()

    def format_kernel_cmd(self, extra_arguments=None):
        argv = [sys.executable, "-m", "distlab.grade.boundary.kernel", "-f", self.connection_file] + list(extra_arguments or [])
        if not self.sandboxed:
            return submission_caps.wrap_for_current(sandbox_keeper.wrap(argv, self.leash.read_fd))
        for folder in (self.sockets_folder, self.kernel_cwd):
            bubblewrap.hand_over(folder)
        # JPY_PARENT_PID=1: no parent polling (inside, the parent is the sandbox's init; the
        # sandbox's keeper ends the kernel with the grader), and no "Ctrl-C will not work" banner.
        sandboxed = bubblewrap.command(argv, writable=[self.sockets_folder, self.kernel_cwd], cwd=self.kernel_cwd,
                                       env={"JPY_PARENT_PID": "1"})
        # its keeper ends it when nbgrader dies (inside the capped folders, where the sockets are reached)
        kept = sandbox_keeper.wrap(sandboxed, self.leash.read_fd)
        # its folder and its sockets' folder: memory file systems of their own, capped in bytes and files
        return submission_caps.wrap_for_current(scratch.wrap(kept, [self.kernel_cwd], sockets=self.sockets_folder))

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        await super()._async_launch_kernel(kernel_cmd, **kw)
        if self.sandboxed:   # its sockets are in its capped folder: reached through its process's mounts
            self.ip = scratch.seen_from_outside(self.provisioner.process.pid, self.ip)
        kernel_proxy.interpose(self)   # whole messages capped before the grader's sockets hold them

    async def interrupt_kernel(self):
        if not self.sandboxed:
            return await self._async_interrupt_kernel()
        self._connect_control_socket()
        self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        kernel_proxy.remove(self)
        if self.leash:   # the kernel is gone: its keeper ends whatever it left and exits
            self.leash, leash = None, self.leash
            leash.close()
        if self.drain:   # the kernel is gone: its last lines, then the pipe
            self.drain, drain = None, self.drain
            drain.close()
