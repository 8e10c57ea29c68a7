"""The Python kernel of a student's server, started by distlab's launcher for private sockets.

jupyter_server_config.py puts every kernel of a student's server on Unix sockets in Jupyter's
runtime folder, which only the student can enter (``KernelManager.transport = "ipc"``): no other
account on the node can listen to the student's cells and their output, as it could over TCP.
ipykernel binds one more socket of its own, to a TCP port of ``127.0.0.1`` whatever the
transport: the one through which the processes a kernel forks send their output.
``python -m distlab.grade.boundary.kernel_sockets`` is ipykernel's launcher with that socket moved
beside the others (see that module). This kernel spec class swaps it in for
``ipykernel_launcher`` in a kernel's command line; the kernel's name, display name and
language stay as they are, so notebooks match their kernel as before (course_contents).
"""

from __future__ import annotations

from jupyter_client.kernelspec import KernelSpec

LAUNCHER = "distlab.grade.boundary.kernel_sockets"


class CourseKernelSpec(KernelSpec):
    """A kernel spec whose ipykernel starts through :data:`LAUNCHER`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.argv[1:3] == ["-m", "ipykernel_launcher"]:
            self.argv = [self.argv[0], "-m", LAUNCHER, *self.argv[3:]]
