"""The course's contents manager: a notebook opens unmodified, whatever Python released it.

Why it exists. When a notebook's kernel connects, JupyterLab writes what the kernel reports
into the notebook's metadata: ``kernelspec`` (name, display name, language) and
``language_info`` (the kernel's Python version among them). Its document model skips only a
value deep-equal to the one already there; any other marks the notebook modified. A released
notebook records what the instructor's nbgrader wrote (``language_info`` with or without a
version, a display name of another kernel install), never what the student's kernel on the hub
reports (the hub's Python, 3.11.2 on the demo machine, against 3.11.7 for the release), so
every notebook showed as modified the moment it opened, before the student typed anything.

What it does. When the server hands a notebook to JupyterLab (``GET /api/contents/...``), its
``kernelspec`` and ``language_info`` are already what the kernel will report: the kernel the
notebook names (or the server's default kernel if that one is not installed here, the rule
``course_sessions`` starts kernels by), and, for an IPython kernel run by this server's own
Python (the course's kernel: ``python`` in its spec is this interpreter, jupyter_client's
rule), that kernel's ``language_info``, read from ipykernel itself. The file on disk is not
touched; JupyterLab saves these values the next time the student saves, as it would have.
Any other kernel (another interpreter, another language) is left as it is.

Set as the server's contents manager in ``jupyter_server_config.py`` beside this file.
"""

from __future__ import annotations

import copy
import functools
import sys

import course_kernels
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


@functools.cache
def this_pythons_language_info() -> dict | None:
    """What an IPython kernel run by this interpreter answers as ``language_info``."""
    try:
        from ipykernel.ipkernel import IPythonKernel
    except ImportError:
        return None
    return copy.deepcopy(IPythonKernel.language_info)


def runs_ipykernel_here(argv: list[str]) -> bool:
    """Is a kernel spec's command ipykernel in this interpreter? jupyter_client runs ``python``,
    ``python3`` and ``python3.N`` as ``sys.executable`` (KernelManager.format_kernel_cmd); the
    course's launcher (course_kernels) is ipykernel's with one socket moved."""
    launchers = (["-m", "ipykernel_launcher"], ["-m", "ipykernel"], ["-m", course_kernels.LAUNCHER])
    if len(argv) < 3 or argv[1:3] not in launchers:
        return False
    major, minor = sys.version_info[:2]
    return argv[0] in ("python", f"python{major}", f"python{major}.{minor}", sys.executable)


class CourseContentsManager(AsyncLargeFileManager):
    """Jupyter Server's default contents manager; notebooks carry their kernel's metadata."""

    async def get(self, path, content=True, type=None, format=None, require_hash=False):
        model = await super().get(path, content=content, type=type, format=format, require_hash=require_hash)
        if model.get("type") == "notebook" and model.get("content"):
            self.as_its_kernel_will_report(model["content"].setdefault("metadata", {}))
        return model

    def as_its_kernel_will_report(self, metadata: dict) -> None:
        server = self.parent
        specs = getattr(server, "kernel_spec_manager", None)
        if specs is None:
            return
        wanted = (metadata.get("kernelspec") or {}).get("name")
        installed = specs.find_kernel_specs()
        name = wanted if wanted in installed else server.kernel_manager.default_kernel_name
        try:
            spec = specs.get_kernel_spec(name)
        except Exception:  # noqa: BLE001 (no such kernel after all: leave the notebook as it is)
            return
        metadata["kernelspec"] = {"name": name, "display_name": spec.display_name, "language": spec.language}
        info = this_pythons_language_info() if runs_ipykernel_here(spec.argv) else None
        if info is not None:
            metadata["language_info"] = copy.deepcopy(info)
