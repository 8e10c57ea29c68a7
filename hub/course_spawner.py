"""The course's spawner: batchspawner's SlurmSpawner with a spawn form of named profiles and a
clear message when a job cannot start.

What it adds to ``batchspawner.SlurmSpawner``, and why:

* **Profiles.** The spawn page offers a few whole shapes of allocation ("1 node, 2 tasks",
  "2 nodes, 1 task each") and a time limit, instead of free fields a student can get wrong.
  The chosen profile's values become the job script's ``{{nodes}}``, ``{{tasks_per_node}}``,
  ``{{cpus_per_task}}`` and ``{{runtime}}`` (hub/slurm-job.sh).
* **A queue timeout that says why.** A job that is still pending after ``queue_timeout``
  seconds is cancelled, and the spawn page shows Slurm's reason (``PartitionDown``,
  ``Resources``, ...) instead of JupyterHub's generic "Spawn failed: timeout", with advice
  the student can follow: every profile that would start on the cores free now. While the
  job waits, the progress bar shows the reason and the job's place in the queue.
"""

from __future__ import annotations

import asyncio
import html
import time
from urllib.parse import urlsplit, urlunsplit

from batchspawner import SlurmSpawner
from jupyterhub.spawner import SpawnException
from traitlets import Dict, Integer, Unicode, default

PROFILES = {
    "1x2": {"title": "1 node, 2 tasks", "nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1},
    "2x1": {"title": "2 nodes, 1 task each", "nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1},
    # For a full cluster: a notebook's ranks share one core (slower, and it still runs every exercise).
    "1x1": {"title": "1 node, 1 task", "nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1},
}
"""The first is the default. A class of N fits when the partition has N times the default's
cores free (hub/demo.py sizes the demo's cluster so: ``make hub STUDENTS=N``)."""


def cores(profile: dict) -> int:
    """The cores a profile's job holds."""
    return int(profile["nodes"]) * int(profile["tasks_per_node"]) * int(profile["cpus_per_task"])
RUNTIMES = {"00:30:00": "30 minutes", "01:00:00": "1 hour", "02:00:00": "2 hours", "03:00:00": "3 hours"}
# A lab session (90 minutes to 2 hours) fits in the default. JupyterLab warns 5 minutes before
# the limit (hub/jupyter/course_clock.py); the idle culler ends a server nobody uses long before.
DEFAULT_RUNTIME = "02:00:00"
# Where each job's log goes: a hidden folder of the student's home (JupyterLab's file browser
# does not show it), made by the student's own sbatch command (the hub never creates or chmods
# anything in a student's home). `sbatch --output` into a folder that is missing loses the log.
JOB_LOG_FOLDER = ".jupyterhub-slurm"


def squeue_format(user_width: int = 32) -> str:
    """``squeue``'s default columns, with the user's name whole (``SQUEUE_FORMAT``).

    squeue cuts every field to its width, and its default gives the user 8 characters: a class's
    accounts ("dlc-student1", "dlc-student2", ...) all read "dlc-stud", and a student could not
    tell which job is theirs. 32 is the longest name Debian's useradd makes; the demo passes its
    course's longest."""
    return f"%.18i %.9P %.8j %.{max(8, user_width)}u %.2t %.10M %.6D %R"


def fits(profile: dict, idle_per_node: list[int]) -> bool:
    """Would a job of ``profile`` start on nodes with these free cores (one number a node)?"""
    per_node = int(profile["tasks_per_node"]) * int(profile["cpus_per_task"])
    return sum(idle >= per_node for idle in idle_per_node) >= int(profile["nodes"])


def refusal_advice(reason: str, held_cores: int, profiles: dict, idle_per_node: list[int] | None = None) -> str:
    """What a student whose job waited too long can actually do: every profile that would start
    now, from the cores each node has free (``idle_per_node``; None when Slurm did not say, then
    the smaller profiles); the instructor when the partition is down.

    Free cores, not a profile's size, decide: with one core free on each of two nodes, "2
    nodes, 1 task each" starts and "1 node, 2 tasks" (the same two cores) does not."""
    if reason.startswith("Partition"):
        return "The partition is down: try again later or ask your instructor."
    if idle_per_node is None:
        could = [p["title"] for p in profiles.values() if cores(p) < held_cores]
        if could:
            return f"The cluster is busy: try again later, or pick a smaller profile ({'; '.join(could)})."
    else:
        could = [p["title"] for p in profiles.values() if fits(p, idle_per_node)]
        if could:
            return f"The cluster is busy: these profiles would start now: {'; '.join(could)}."
    return "The cluster is busy: try again in a few minutes, or ask your instructor how busy it is."


def idle_cores(sinfo_output: str) -> list[int]:
    """Free cores per node from ``sinfo -h -N -o '%N %C'`` (``%C``: allocated/idle/other/total;
    a node that is down or drained counts its cores as "other", never idle). ``%N``, the node's
    name, not ``%n``, its host's: the demo's nodes all run on localhost."""
    idle = {}
    for line in sinfo_output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].count("/") == 3:
            idle[parts[0]] = int(parts[1].split("/")[1])   # a node in two partitions is listed twice
    return list(idle.values())


async def slurm_answer(cmd: list[str], timeout: float = 10) -> str | None:
    """What a Slurm query the hub makes as itself (``sinfo``, ``squeue``) printed, or None when it
    did not answer: it could not start, failed, or took longer than ``timeout`` seconds (then it
    is killed, not left running beside the hub). The spawn page's advice and progress fall back
    to what they can say without it."""
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    return out.decode() if proc.returncode == 0 else None


class SpawnRefused(SpawnException):
    """A refusal meant for the student: JupyterHub shows ``message`` on the spawn page as it
    is, and logs it as one line ("Not starting ...'s server"), the way it logs every
    ``SpawnException``: an expected refusal (a full or closed queue, a form filled in by hand),
    not a crash that needs a traceback. ``reason`` labels it in JupyterHub's metrics."""

    def __init__(self, message: str, reason: str):
        super().__init__(message, reason=reason)
        self.jupyterhub_message = message  # shown without the "400 SpawnRefused(...)" prefix


class CourseSlurmSpawner(SlurmSpawner):
    profiles = Dict(PROFILES, help="name -> {title, nodes, tasks_per_node, cpus_per_task[, options]}").tag(config=True)
    queue_timeout = Integer(120, help="seconds a job may wait in the queue before it is cancelled").tag(config=True)
    listen_ip = Unicode("0.0.0.0", help="the address a server listens on, on its node").tag(config=True)

    # %r: why a pending job waits; %B: the node the batch script (and so the server) runs on.
    batch_query_cmd = "squeue -h -j {job_id} -o '%T %r %B'"
    # Run as the student (exec_prefix): the log folder is theirs, made before sbatch reads the
    # script from standard input (hub/slurm-job.sh writes its log there).
    batch_submit_cmd = f"sh -c 'mkdir -p -m 700 \"$HOME/{JOB_LOG_FOLDER}\" && exec sbatch --parsable'"

    def _options_form_default(self) -> str:
        rows = [
            f'<label class="form-check"><input class="form-check-input" type="radio" name="profile" '
            f'value="{html.escape(name)}"{" checked" if i == 0 else ""}> {html.escape(p["title"])}'
            f' <small class="text-muted">({cores(p)} {"core" if cores(p) == 1 else "cores"})</small></label>'
            for i, (name, p) in enumerate(self.profiles.items())
        ]
        times = "".join(f'<option value="{value}"{" selected" if value == DEFAULT_RUNTIME else ""}>{label}</option>'
                        for value, label in RUNTIMES.items())
        return (
            '<fieldset class="mb-3"><legend class="form-label">Resources (a Slurm job of yours)</legend>'
            + "".join(rows) + "</fieldset>"
            f'<label class="form-label" for="runtime">Time limit</label>'
            f'<select class="form-select" id="runtime" name="runtime">{times}</select>'
        )

    def options_from_form(self, formdata: dict) -> dict:
        return {"profile": (formdata.get("profile") or [""])[0],
                "runtime": (formdata.get("runtime") or [DEFAULT_RUNTIME])[0]}

    def job_options(self, user_options: dict) -> dict:
        """The job script's fields for a profile and a time limit, checked against the lists.

        ``user_options`` may also arrive through the hub's REST API, not the form: nothing but
        these two names, with these values, ever reaches the job script.
        """
        profile, runtime = user_options.get("profile"), user_options.get("runtime", DEFAULT_RUNTIME)
        if profile not in self.profiles:
            raise SpawnRefused(f"unknown profile {profile!r}: pick one of {', '.join(self.profiles)}", "options")
        if runtime not in RUNTIMES:
            raise SpawnRefused(f"unknown time limit {runtime!r}: pick one of {', '.join(RUNTIMES)}", "options")
        chosen = self.profiles[profile]
        return {"runtime": runtime, "nodes": str(chosen["nodes"]), "tasks_per_node": str(chosen["tasks_per_node"]),
                "cpus_per_task": str(chosen["cpus_per_task"]), "profile_options": chosen.get("options", "")}

    @default("db")
    def _shared_db_session(self):
        """The hub's database session, handed over without JupyterHub's deprecation warning.

        batchspawner 1.3 commits the server's address through ``Spawner.db`` once the job runs;
        JupyterHub 5+ still provides that session but warns, in the hub's log, at every spawn.
        The warning is addressed to batchspawner's authors, not to whoever reads the log.
        """
        return self._deprecated_db_session

    @default("apply_user_options")
    def _check_user_options(self):
        return lambda spawner, user_options: spawner.job_options(user_options)

    def _commit_server_port(self) -> None:
        """Commit the port batchspawner's ``start`` has just reset on the server's record.

        batchspawner 1.3 sets ``server.port`` at the start of every spawn and commits it only
        once the job runs. Meanwhile the spawn request's handler, or any other request's,
        finishes with that change uncommitted, and JupyterHub rolls it back with a warning
        ("Rolling back dirty objects") in the hub's log, once per spawn: a warning about
        batchspawner's code, which nobody reading the log can act on.
        """
        if self.server is not None and self.db.dirty:
            self.db.commit()

    async def cancel_batch_job(self):
        if self.job_id:  # nothing to cancel once a refused job has been cancelled and forgotten
            await super().cancel_batch_job()

    def get_env(self) -> dict:
        """The job's environment, with the server told to listen on ``listen_ip``.

        batchspawner resets the spawner's ``ip`` to ``0.0.0.0`` before each start (it cannot
        know the node in advance), and the server listens where JUPYTERHUB_SERVICE_URL says.
        """
        env = super().get_env()
        if "JUPYTERHUB_SERVICE_URL" in env:
            url = urlsplit(env["JUPYTERHUB_SERVICE_URL"])
            env["JUPYTERHUB_SERVICE_URL"] = urlunsplit(url._replace(netloc=f"{self.listen_ip}:{url.port}"))
        return env

    def state_gethost(self) -> str:
        """The node the server's job runs on, by name (what the progress bar shows)."""
        return self.job_status.split()[-1]

    async def node_address(self, node: str) -> str:
        """Where the hub reaches ``node``: Slurm's ``NodeAddr`` for it, the address slurmctld
        itself uses. A node's name need not resolve on the hub's host to that address (or at
        all); the name itself if Slurm does not say."""
        out = await slurm_answer(["sinfo", "-h", "-N", "-n", node, "-o", "%o"])
        addresses = (out or "").split()
        return addresses[0] if addresses else node

    def pending_reason(self) -> str:
        parts = self.job_status.split()
        return parts[1] if len(parts) >= 2 and parts[0] == "PENDING" else ""

    async def start(self):
        """Submit, and give up with Slurm's reason if the job is still queued after queue_timeout."""
        self.user_options = self.job_options(self.user_options or {"profile": next(iter(self.profiles))})
        task = asyncio.ensure_future(super().start())
        await asyncio.sleep(0)  # batchspawner's start runs up to its first wait (sbatch) ...
        self._commit_server_port()
        deadline = time.monotonic() + self.queue_timeout
        while not task.done():
            await asyncio.sleep(0.5)
            if time.monotonic() > deadline and self.job_id and self.state_ispending():
                task.cancel()
                reason, job = self.pending_reason() or "unknown", self.job_id
                await self.cancel_batch_job()
                self.clear_state()
                idle = await self.idle_cores_per_node()
                raise SpawnRefused(
                    f"Your server could not start: its Slurm job {job} waited {self.queue_timeout} s in "
                    f"the queue (Slurm's reason: {reason}) and has been cancelled. "
                    + refusal_advice(reason, cores(self.user_options), self.profiles, idle), "queue")
        node, port = task.result()
        self.ip = await self.node_address(node)
        return self.ip, port

    async def idle_cores_per_node(self) -> list[int] | None:
        """Free cores on each node of the partition, as Slurm counts them now; None if sinfo
        does not answer (the refusal then falls back to the smaller profiles)."""
        cmd = ["sinfo", "-h", "-N", "-o", "%N %C"] + (["-p", self.req_partition] if self.req_partition else [])
        out = await slurm_answer(cmd)
        return None if out is None else idle_cores(out)

    async def queue_position(self) -> tuple[int, int] | None:
        """(this job's place, jobs waiting) in its partition's queue, in Slurm's order (priority,
        then submission); None if squeue does not answer. The hub asks as itself: squeue shows
        every user's jobs to everyone unless the site hides them (PrivateData=jobs)."""
        cmd = ["squeue", "-h", "-t", "PENDING", "-o", "%i", "--sort=-p,i"]
        if self.req_partition:
            cmd += ["-p", self.req_partition]
        out = await slurm_answer(cmd)
        if out is None:
            return None
        waiting = out.split()
        return (waiting.index(str(self.job_id)) + 1, len(waiting)) if str(self.job_id) in waiting else None

    async def progress(self):
        """Events for the spawn page: each new state of the job once, with Slurm's reason and the
        job's place in the queue while it waits; the bar moves with the state (submitted 10%,
        waiting 30%, running and waiting for the server 70%: JupyterHub fills the rest)."""
        last = None
        while True:
            if self.state_ispending():
                reason, place = self.pending_reason(), await self.queue_position()
                message = f"Slurm job {self.job_id} pending in the queue" + (f" (reason: {reason})" if reason else "")
                if place:
                    message += f": {place[0]} of {place[1]} waiting"
                event = {"progress": 30, "message": message}
            elif self.state_isrunning():
                yield {"progress": 70, "message": f"Slurm job {self.job_id} running on {self.state_gethost()}: "
                                                  "waiting for the server to answer"}
                return
            else:
                event = {"progress": 10, "message": "Submitting the Slurm job..."}
            if event["message"] != last:
                yield event
                last = event["message"]
            await asyncio.sleep(1)
