"""What the machine does while benchmarks/hub_class.py's class works: its memory in use and the hub's
CPU and resident memory, sampled per phase; and afterwards, any process the course left behind."""

from __future__ import annotations

import contextlib
import pwd
import threading
import time
from pathlib import Path

import psutil


class Meter:
    """Samples this machine's memory in use (MemTotal - MemAvailable) and the hub's resident
    memory every ``interval`` seconds, keeping the peak of each per phase of the run."""

    def __init__(self, hub_pid: int, interval: float = 0.5):
        self.hub = psutil.Process(hub_pid)
        self.interval, self.phase = interval, "start"
        self.peak_used: dict[str, int] = {}
        self.hub_rss_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = {k: int(v.split()[0]) for k, v in info.items() if k in ("MemTotal", "MemAvailable")}
        return (kib["MemTotal"] - kib["MemAvailable"]) * 1024

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            used = self.used()
            self.peak_used[self.phase] = max(self.peak_used.get(self.phase, 0), used)
            with contextlib.suppress(psutil.Error):
                self.hub_rss_peak = max(self.hub_rss_peak, self.hub.memory_info().rss)

    def hub_cpu_s(self) -> float:
        times = self.hub.cpu_times()
        return times.user + times.system

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def processes_of(users: list[str]) -> list[psutil.Process]:
    """Live processes run by any of ``users`` (what the course left behind, if anything)."""
    uids = set()
    for user in users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"].real in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def wait_until_gone(users: list[str], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := processes_of(users)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]
