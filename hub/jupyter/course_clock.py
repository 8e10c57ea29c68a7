"""A Jupyter server extension: how long the server's Slurm job has left, for JupyterLab's warning.

Why it exists. A student's server is a Slurm job with a ``--time`` limit; when the limit is
reached Slurm ends the job, and with it every kernel (its variables, a training run in
progress). Nothing in JupyterLab knows about that limit. This extension answers
``GET <base>/course/time-left`` with ``{"seconds_left": ..., "warn_seconds": ..., "job": ...}``;
the course's JupyterLab plugin (``labextensions/distlab-course``) asks every 30 s and shows a
notification once the job has less than ``warn_seconds`` left. It asks Slurm
(``squeue -j $SLURM_JOB_ID -o %L``, the time left) rather than computing the end once, because
the limit can change while the job runs (``scontrol update JobId=... TimeLimit=...``).

A server outside Slurm (no ``SLURM_JOB_ID``) answers ``seconds_left: null``: no warning.
``DISTLAB_HUB_TIME_WARNING`` (seconds, from the hub's job environment) sets when to warn.

Loaded through ``jupyter_server_config.py`` beside this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

WARN_SECONDS = 300
CACHE_SECONDS = 15   # several open tabs ask once between them, not once each


def parse_time_left(text: str) -> int | None:
    """Seconds in squeue's ``%L`` (``[days-]hours:minutes:seconds``, ``minutes:seconds``);
    None for ``UNLIMITED``, ``NOT_SET``, ``INVALID`` or anything else."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts) or not (days == "" or days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + 86400 * int(days or 0)


class TimeLeft(APIHandler):
    """``GET /course/time-left``: the job's time left, as Slurm knows it now."""

    _track_activity = False   # a page's poll is not a person's activity (the idle culler reads it)
    _cache: dict[str, tuple[float, int | None]] = {}

    auth_resource = "contents"

    @web.authenticated
    @authorized
    async def get(self):
        job = os.environ.get("SLURM_JOB_ID")
        warn = int(os.environ.get("DISTLAB_HUB_TIME_WARNING", WARN_SECONDS))
        left = await self.time_left(job) if job else None
        self.finish(json.dumps({"job": job, "seconds_left": left, "warn_seconds": warn}))

    async def time_left(self, job: str) -> int | None:
        asked, left = self._cache.get(job, (0.0, None))
        if time.monotonic() - asked < CACHE_SECONDS:
            return None if left is None else max(0, left - int(time.monotonic() - asked))
        try:
            proc = await asyncio.create_subprocess_exec(
                "squeue", "-h", "-j", job, "-o", "%L", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
        except (OSError, asyncio.TimeoutError) as exc:
            self.log.info("course_clock: squeue did not answer (%s)", exc)
            return None
        left = parse_time_left(out.decode(errors="replace"))
        self._cache[job] = (time.monotonic(), left)
        return left


def _load_jupyter_server_extension(serverapp) -> None:
    route = url_path_join(serverapp.base_url, r"/course/time-left")
    serverapp.web_app.add_handlers(".*$", [(route, TimeLeft)])
