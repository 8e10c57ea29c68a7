"""Starting and ending the demo's own processes: wait until a piece answers, end what we started,
and end what the hub leaves behind (its proxy, its idle culler) when it does not stop cleanly.

Part of the demo course (hub/demo.py). :class:`HubError` is what every piece of it raises when
the course cannot come up; its message says why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil

from distlab.runtime.processes import alive


class HubError(RuntimeError):
    """The hub could not be brought up; the message says why."""


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(ready, seconds: float, what: str, proc: subprocess.Popen, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            state = f"exited with code {proc.returncode}" if proc.poll() is not None else f"not within {seconds:g} s"
            raise HubError(f"{what} ({state}).\n{tail}")
        time.sleep(0.2)


def _end(proc: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left of it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def end_proxy(pid_file: Path, api_port: int, grace: float = 10) -> None:
    """End the configurable-http-proxy our hub started, if the hub left it running.

    JupyterHub starts its proxy in a session of its own (so ending the hub's process group
    misses it) and stops it only on a clean shutdown: a hub killed, or ended while still
    starting on a loaded machine, leaves it behind. It wrote the proxy's pid to ``pid_file``;
    the process is ended only if it is still that proxy (its command line names the API port
    we gave it), never a process that took the number since.
    """
    try:
        proxy = psutil.Process(int(pid_file.read_text().strip()))
        cmdline = proxy.cmdline()
    except (OSError, ValueError, psutil.Error):
        return
    if not any("configurable-http-proxy" in arg for arg in cmdline) or str(api_port) not in cmdline:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proxy.pid, sig)  # its own session: the group is the proxy and its children
        deadline = time.monotonic() + wait
        while alive([proxy]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive([proxy]):   # a zombie has ended too: it only waits to be reaped
            return


def end_culler(hub_api_url: str, grace: float = 10) -> None:
    """End the idle culler our hub started, if the hub left it running.

    JupyterHub stops its managed services when it shuts down, giving each up to 20 s; a hub
    ended sooner (a loaded machine, a killed test) leaves the culler running in a session of
    its own. It is ended only if its command line names our hub's API (``--url=...``).
    """
    ours = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any("jupyterhub_idle_culler" in arg for arg in cmdline) and f"--url={hub_api_url}" in cmdline:
            ours.append(proc)
    for proc in ours:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, left = psutil.wait_procs(ours, timeout=grace)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=5)


def _hub_ready(log: Path, url: str) -> bool:
    """Has the hub said it runs (its proxy has the hub's route), and does it answer?

    Asking its login page through the proxy before then made the proxy log a "404 GET
    /hub/login" error every 0.2 s while the hub started: errors no person caused."""
    try:
        started = b"JupyterHub is now running" in log.read_bytes()
    except OSError:
        return False
    return started and _hub_answers(url)


def _hub_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/hub/login", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
