"""Running ``distlab.run`` on a Slurm cluster: inside an allocation (srun) or as a batch job (sbatch).

On a laptop, ``distlab.run(fn, nprocs=4)`` starts one ``torchrun`` that starts 4 ranks. On a
cluster the ranks are spread over the nodes Slurm gave you, and the recipe is the one every
HPC centre teaches:

1. **One torchrun per node**, started by ``srun --ntasks-per-node=1``. Each torchrun starts
   the ranks of its own node (``--nproc-per-node``) and numbers them.
2. **A rendezvous on the first node.** ``scontrol show hostnames $SLURM_JOB_NODELIST`` lists
   the allocation's nodes; the first one hosts the c10d rendezvous
   (``--rdzv-backend=c10d --rdzv-endpoint=<first node>:<port>``), and every torchrun connects
   to it to learn how many nodes there are and which ranks are whose. Some clusters reach a
   node over the fast network under another name (JSC appends ``i``): that is
   ``hostname_suffix``. The first node is told it is the host (``is_host``), because with a
   suffixed name it cannot recognise itself.
3. **Files on a shared filesystem.** The function, the results and what the ranks print travel
   through the run directory, exactly as on a laptop; it just has to be on a filesystem every
   node sees (``run_root``: home or project directory, never ``/tmp``).

Two launchers use this recipe:

* :class:`SrunJob` (``launcher="srun"``, and what ``"auto"`` picks inside an allocation, e.g.
  a notebook server started by JupyterHub as a Slurm job, or a shell from ``salloc``): runs
  ``srun ... torchrun ...`` as a new job step, right now, on the allocation's nodes.
* :class:`SbatchJob` (``launcher="sbatch"``, from a login node or a JupyterHub server outside
  any allocation): writes a job script, submits it, shows the job's state while it waits
  (pending, running, done), and streams the ranks' output once they run.

Both behave like the local launcher: results in rank order, :class:`~distlab.RankError` when
a rank raises, :class:`~distlab.DistTimeout` when time is up (for a batch job, time in the
queue does not count), and every Slurm job or step we started is cancelled on error,
timeout or Ctrl-C. When Slurm itself ends the job (``scancel``, the ``--time`` limit, a node
failure) the error is a :class:`SlurmJobError` that says so. Success is judged by the result
files, never by Slurm's exit codes, and Slurm's state is read with ``scontrol`` (``sacct``
needs an accounting database that not every cluster, nor our test cluster, has).

Every Slurm command runs with a timeout: when the controller is down, Slurm clients otherwise
block for minutes. Settings (account, partition, modules, ...) come from
:mod:`distlab.slurm_config`. ``python -m distlab.slurm_cli script -- train.py`` prints a job
script for a training script of your own, built by the same functions.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from distlab import rundir as files
from distlab import slurm_config
from distlab.errors import LaunchError, RankError
from distlab.local import (LocalJob, _exit_code_from_torchrun_log, _first_failure, _signal_name, _tail,
                           worker_environment)
from distlab.output import OutputEcho

CLIENT_TIMEOUT = 30.0
"""Seconds any Slurm command may take (a healthy controller answers in well under one)."""

PORT_RANGE = (20000, 32000)
"""Rendezvous ports are drawn from here: above the well-known services, below Linux's
ephemeral ports (32768+), which the kernel hands out for outgoing connections."""

END_GRACE_SECONDS = 3.0
"""After Slurm says the ranks ended, wait this long for their last files to show up: on a
shared filesystem another node's writes can take a moment to become visible here."""

OFFLINE_VARIABLES = {
    "HF_HUB_OFFLINE": "1",          # huggingface_hub: never try to download
    "HF_DATASETS_OFFLINE": "1",     # datasets: use the local cache only
    "TRANSFORMERS_OFFLINE": "1",    # transformers (older releases read this one)
    "HF_EVALUATE_OFFLINE": "1",     # evaluate
    "WANDB_MODE": "offline",        # Weights & Biases: log locally, `wandb sync` later
}
"""Compute nodes have no internet: libraries that would download must use their caches."""

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                 "RESV_DEL_HOLD"}
"""Job states in which a job is still queued or running."""

WHY_IT_ENDED = {
    "CANCELLED": "was cancelled (scancel, by you, a script or an administrator)",
    "TIMEOUT": "reached its time limit (--time; raise `time` in distlab.toml)",
    "PREEMPTED": "was preempted by a job of higher priority",
    "NODE_FAIL": "lost a node (node failure)",
    "BOOT_FAIL": "could not boot its nodes",
    "OUT_OF_MEMORY": "ran out of memory on a node (ask for more with --mem)",
    "DEADLINE": "passed its deadline",
    "FAILED": "failed",
}
"""What the end states of a job mean, for error messages."""

_STEP_ENDINGS = [  # what slurmstepd writes when it ends a step: (pattern, state)
    (r"DUE TO TIME LIMIT", "TIMEOUT"),
    (r"DUE TO PREEMPTION", "PREEMPTED"),
    (r"DUE TO NODE FAILURE", "NODE_FAIL"),
    (r"CANCELLED AT", "CANCELLED"),
    (r"oom[-_ ]kill", "OUT_OF_MEMORY"),
]


class SlurmJobError(LaunchError):
    """Slurm ended the job (or step) before every rank returned, or refused it.

    Attributes:
        job_id: the Slurm job id ("12", or "12.3" for a step), or None if never submitted.
        state: Slurm's word for how it ended: ``CANCELLED``, ``TIMEOUT``, ``FAILED``, ...
    """

    def __init__(self, message: str, job_id: str | None = None, state: str | None = None):
        super().__init__(message)
        self.job_id, self.state = job_id, state

    def __reduce__(self):
        return (type(self), (str(self), self.job_id, self.state))


# -- talking to Slurm -----------------------------------------------------------------------------

def slurm_command(cmd: list[str], timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """Run a Slurm client command with a timeout; a missing command or a silent controller
    becomes a :class:`SlurmJobError` that says so."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmJobError(f"`{cmd[0]}` was not found: this machine has no Slurm client tools "
                            "(use launcher='local', or run on the cluster's login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmJobError(f"`{shlex.join(cmd)}` got no answer within {timeout:g} s: is the "
                            "Slurm controller down? (`sinfo` tells)") from None


def in_allocation(env=os.environ) -> bool:
    """Are we inside a Slurm allocation (``salloc``, ``sbatch``, a Slurm-spawned notebook)?"""
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


def node_names(nodelist: str) -> list[str]:
    """``distlab-n[1-2]`` -> ``["distlab-n1", "distlab-n2"]``, as ``scontrol show hostnames`` says."""
    out = slurm_command(["scontrol", "show", "hostnames", nodelist])
    names = out.stdout.split()
    if out.returncode != 0 or not names:
        raise SlurmJobError(f"`scontrol show hostnames {nodelist}` failed: {out.stderr.strip()}")
    return names


def rendezvous_host(first_node: str, suffix: str = "") -> str:
    """The name under which the other nodes reach the first one (JSC: ``jwb0001`` + ``i``)."""
    return first_node + suffix


def pick_port(first_node: str) -> int:
    """A port for the rendezvous on the first node that no concurrent run is likely to use.

    Drawn at random from :data:`PORT_RANGE` (two concurrent runs on one node collide with
    probability 1/12000); when the first node is this machine we also check it is free.
    """
    rng = random.SystemRandom()
    for _ in range(50):
        port = rng.randrange(*PORT_RANGE)
        if not _is_this_machine(first_node) or _free_here(port):
            return port
    raise SlurmJobError(f"found no free port in {PORT_RANGE} on this machine")


def _is_this_machine(node: str) -> bool:
    names = {socket.gethostname(), socket.gethostname().split(".")[0], os.environ.get("SLURMD_NODENAME")}
    return node in names


def _free_here(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def ranks_per_node(nprocs: int, nodes: int) -> int:
    """Spread ``nprocs`` ranks evenly over ``nodes`` nodes (torchrun starts the same number on each)."""
    if nprocs % nodes:
        raise ValueError(f"{nprocs} ranks cannot be spread evenly over {nodes} nodes; use a multiple "
                         f"of {nodes} (nodes come from the allocation, or `nodes` in distlab.toml)")
    return nprocs // nodes


def cpus_per_node(job_cpus_per_node: str) -> int | None:
    """The fewest CPUs any node of the allocation has: ``"36(x2),72"`` -> 36 (``SLURM_JOB_CPUS_PER_NODE``)."""
    counts = [int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", job_cpus_per_node or "")]
    return min(counts) if counts else None


# -- building the commands ------------------------------------------------------------------------

def torchrun_on_each_node(python: str, nnodes: str, nproc_per_node: int, endpoint: str,
                          rdzv_id: str, target: list[str], extra: list[str] = ()) -> str:
    """The shell line that ``srun`` runs once on every node: torchrun, joining the rendezvous.

    ``nnodes``, ``endpoint`` and ``rdzv_id`` may be shell variables (``"$SLURM_NNODES"``):
    they are expanded on the node. ``is_host`` is 1 on the step's first node only.
    """
    args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", *extra]
    parts = [f"exec {shlex.quote(python)} -m torch.distributed.run"]
    parts += [a if "$" in a else shlex.quote(a) for a in args]
    parts += ["--rdzv-conf=is_host=$(( SLURM_NODEID == 0 ))", shlex.join(target)]
    return "\n" + " \\\n    ".join(parts)  # one option per line: readable in a job script


def srun_command(nodes: list[str], step_name: str, shell_line: str, cpus: int | None = None) -> list[str]:
    """``srun``: one task per node, on exactly these nodes, running ``shell_line``."""
    cmd = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
           f"--nodelist={','.join(nodes)}", f"--job-name={step_name}",
           "--kill-on-bad-exit=1",  # a node whose torchrun fails takes the step down with it
           "--overlap"]             # share the allocation with the step the notebook may run in
    if cpus:
        cmd.append(f"--cpus-per-task={cpus}")
    return cmd + ["bash", "-c", shell_line]


def environment_lines(config: slurm_config.SlurmConfig, exports: dict[str, str] | None = None) -> list[str]:
    """Shell lines that prepare a compute node: modules, the course environment, offline mode."""
    lines = []
    if config.modules:
        lines.append("module load " + " ".join(shlex.quote(m) for m in config.modules))
    if config.activate:
        lines.extend(config.activate.strip().splitlines())
    if config.offline:
        lines.append("# Compute nodes have no internet: use the caches filled on a login node.")
        lines.extend(f"export {k}={v}" for k, v in OFFLINE_VARIABLES.items())
    for key, value in (exports or {}).items():
        lines.append(f"export {key}={shlex.quote(value)}")
    return lines


def job_script(config: slurm_config.SlurmConfig, *, nodes: int, nproc_per_node: int,
               target: list[str], job_name: str, time_limit: str, output: str,
               exports: dict[str, str] | None = None, torchrun_extra: list[str] = ()) -> str:
    """A complete sbatch script: ``#SBATCH`` options, environment, rendezvous, srun + torchrun.

    ``target`` is what torchrun runs on every rank: ``["train.py", "--epochs", "3"]``, or
    ``["--module", "distlab.worker", RUNDIR]`` for ``distlab.run``.
    """
    sbatch = [f"--job-name={job_name}", f"--nodes={nodes}",
              "--ntasks-per-node=1  # one torchrun per node; it starts the node's ranks",
              f"--time={time_limit}", f"--output={output}"]
    if config.cpus_per_task:
        sbatch.append(f"--cpus-per-task={config.cpus_per_task}")
    if config.gpus_per_node:
        sbatch.append(f"--gres=gpu:{config.gpus_per_node}")
    if config.account:
        sbatch.append(f"--account={config.account}")
    if config.partition:
        sbatch.append(f"--partition={config.partition}")
    sbatch += list(config.sbatch_options)
    python = config.python_on_nodes
    probe = "import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])"
    torchrun = torchrun_on_each_node(python, "$SLURM_NNODES", nproc_per_node,
                                     "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID", target,
                                     ["--max-restarts=0", *torchrun_extra])
    lines = ["#!/bin/bash", "# Written by distlab. Submit it with: sbatch <this file>"]
    lines += [f"#SBATCH {option}" for option in sbatch]
    lines += ["", "# 1. The software environment of every node.", *environment_lines(config, exports)]
    lines += [
        "",
        "# 2. Where the ranks meet: the first node of the allocation"
        + (f", reached through the fast network (suffix {config.hostname_suffix!r})." if config.hostname_suffix else "."),
        f'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1){config.hostname_suffix}"',
        "# A port that is free on the first node (this script runs there).",
        f"MASTER_PORT=\"$({shlex.quote(python)} -c '{probe}')\"",
        "export MASTER_ADDR MASTER_PORT",
    ]
    if config.cpus_per_task:
        lines += ["# Since Slurm 22.05 srun does not inherit --cpus-per-task from the job by itself.",
                  'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"']
    lines += [
        'echo "distlab: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) ($SLURM_JOB_NODELIST), '
        f'{nproc_per_node} rank(s) per node, rendezvous at $MASTER_ADDR:$MASTER_PORT"',
        "",
        "# 3. One torchrun per node (srun), each starting its node's ranks.",
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c " + shlex.quote(torchrun),
        "",
    ]
    return "\n".join(lines)


def minutes_for(timeout: float) -> str:
    """A batch job's ``--time`` for a run with this timeout: whole minutes, two to spare.

    The run's ``timeout`` starts once every rank has joined the process group; the spare
    minutes are for starting (Python and torch imported on every rank) and for leaving.
    """
    return str(int(-(-timeout // 60)) + 2)


# -- the shared run directory ------------------------------------------------------------------

def shared_run_dir(local_run_dir: Path, config: slurm_config.SlurmConfig) -> Path:
    """A fresh run directory under ``run_root`` holding a copy of the call's files.

    :func:`distlab.run` wrote the function and its options into a private temporary
    directory on this machine; the other nodes cannot see it, so the files move here.
    """
    root = config.run_root_path
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create run_root {root} ({exc}); set `run_root` in distlab.toml "
                         "to a directory on a filesystem every node sees") from None
    shared = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    for name in (files.PAYLOAD, files.OPTIONS):
        if (local_run_dir / name).exists():
            shutil.copy2(local_run_dir / name, shared / name)
    return shared


def _remove_run_dir(path: Path, succeeded: bool) -> None:
    """Delete a finished run's directory; after a failure keep it, its logs tell what happened."""
    if succeeded:
        shutil.rmtree(path, ignore_errors=True)


# -- what both Slurm jobs share --------------------------------------------------------------

class _RemoteRanks:
    """Ranks that may run on other machines: never judge (or signal) them by local pids.

    :class:`~distlab.local.LocalJob` watches its workers' process ids. On a cluster those
    ids belong to other nodes, and here they could name an unrelated process, so the Slurm
    jobs rely on the ranks' files and on Slurm's word instead.
    """

    poll_seconds = 0.1  # the run directory is on a shared filesystem: look less often

    def _note_workers(self) -> None:
        pass

    def _dead_without_report(self) -> list[int]:
        return []

    def _explain_end(self, what: str, state: str | None, log: str, log_name: str):
        """The exception for ranks that ended (by Slurm's word) without all delivering results."""
        reports = self._reports()
        if reports:  # a rank raised: that is the story, whatever Slurm did afterwards
            return _first_failure(reports)
        missing = [r for r in range(self.nprocs) if not files.result_file(self.call_dir, r).exists()]
        started = [r for r in range(self.nprocs) if files.read_state(self.run_dir, r) is not None]
        doing = "\n".join(f"  rank {r}: {s}" for r, s in sorted(self._rank_states().items()))
        output = f"Last lines of {log_name}:\n{_tail(log, 20)}" if log.strip() else f"({log_name} is empty)"
        if state in WHY_IT_ENDED:
            said = _slurm_lines(log)  # Slurm's own words; torchrun's traceback of the signal is noise
            output = f"What Slurm said (in {log_name}):\n{said}" if said else output
            return SlurmJobError(
                f"{what} {WHY_IT_ENDED[state]} before ranks {missing} returned.\n"
                f"What each rank was doing:\n{doing}\n{output}", getattr(self, "job_id", None), state)
        if not started:
            return LaunchError(f"{what} ended before any rank started. {output}")
        codes = {r: _exit_code_from_torchrun_log(log, r) for r in missing}
        culprits = [r for r in missing if codes[r] not in (None, -15, -9)] or missing
        rank, code = culprits[0], codes[culprits[0]]
        if code is None:
            how = "ended"
        elif code >= 0:
            how = f"exited with code {code}"
        else:
            how = f"was killed by signal {-code} ({_signal_name(-code)})"
        return RankError(rank, "ProcessExited",
                         f"the process of rank {rank} {how} before returning a result or raising "
                         f"({what} ended). {output}", "", None,
                         {r: "did not finish (stopped)" for r in missing if r != rank})


def _slurm_lines(log: str, most: int = 8) -> str:
    """The lines Slurm's own tools wrote into a job's output (``srun: ...``, ``slurmstepd...``)."""
    lines = [line for line in log.splitlines()
             if re.match(r"(srun|slurmstepd\S*|salloc|sbatch): ", line) or "***" in line]
    return "\n".join(lines[-most:])


def _state_from_step_log(log: str) -> str | None:
    """How Slurm ended a step, from what srun printed (``... CANCELLED AT ...``)."""
    for pattern, state in _STEP_ENDINGS:
        if re.search(pattern, log, flags=re.I):
            return state
    return None


def _show(message: str) -> None:
    print(f"[slurm] {message}", flush=True)


# -- srun: inside an allocation -------------------------------------------------------------------

class SrunJob(_RemoteRanks, LocalJob):
    """``srun`` + one torchrun per node, as a job step of the allocation we are in.

    It is a :class:`~distlab.local.LocalJob` whose command is ``srun`` instead of torchrun:
    srun runs here (so Ctrl-C and the notebook's death reach it like they reach torchrun on a
    laptop), the ranks run on the allocation's nodes.
    """

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int,
                 pool: bool = False):
        self.config = slurm_config.load()
        self.job_id = os.environ.get("SLURM_JOB_ID")
        if not self.job_id:
            raise ValueError("launcher='srun' needs a Slurm allocation (salloc, or a notebook started "
                             "as a Slurm job); from a login node use launcher='sbatch'")
        hosts = node_names(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", ""))
        self.hosts = hosts[:min(len(hosts), nprocs)]  # 2 ranks in a 4-node allocation: 2 nodes
        self.nproc_per_node = ranks_per_node(nprocs, len(self.hosts))
        self.endpoint = f"{rendezvous_host(self.hosts[0], self.config.hostname_suffix)}:{pick_port(self.hosts[0])}"
        self.cpus = cpus_per_node(os.environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
        self.shared_dir = shared_run_dir(run_dir, self.config)
        self.step_name = f"distlab-{self.shared_dir.name}"
        super().__init__(self.shared_dir, nprocs, timeout, backend, threads, **({"pool": True} if pool else {}))

    def command(self) -> list[str]:
        """``srun [one task per node] bash -c 'exec python -m torch.distributed.run ...'``."""
        local = super().command()  # [python, -m, torch.distributed.run, --standalone, ..., worker args]
        start = local.index("torch.distributed.run") + 1
        keep = [a for a in local[start:] if a != "--standalone" and not a.startswith("--nproc-per-node")]
        python = self.config.python or local[0]
        line = torchrun_on_each_node(python, str(len(self.hosts)), self.nproc_per_node,
                                     self.endpoint, self.step_name, keep)
        return srun_command(self.hosts, self.step_name, line, self.cpus)

    def wait(self, call_dir: Path | None = None, timeout: float | None = None) -> list:
        """Watch the call (see :meth:`LocalJob.wait`). A :class:`~distlab.Pool` writes each call
        into its own folder on this machine: the call moves to the shared directory first."""
        __tracebackhide__ = True  # noqa: F841
        if call_dir is not None and Path(call_dir).parent != self.shared_dir:
            call_dir = self._share_call(Path(call_dir))
        return super().wait(call_dir, timeout)

    def _share_call(self, local: Path) -> Path:
        shared = self.shared_dir / local.name
        shared.mkdir()
        shutil.copy2(local / files.PAYLOAD, shared / files.PAYLOAD)
        # The options file tells the waiting ranks to go: it comes last, in one piece.
        files.write_atomically(shared / files.OPTIONS, (local / files.OPTIONS).read_bytes())
        return shared

    def _ended_early(self, dead: list[int]) -> Exception:
        """srun exited before every rank delivered: say why, from its output."""
        try:  # the last lines may still be on their way
            self.agent.wait(timeout=END_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(END_GRACE_SECONDS if self.agent.returncode == 0 else 0.2)
        self.echo.pump()
        log = (self.run_dir / files.AGENT_LOG).read_text(errors="replace")
        state = _state_from_step_log(log)
        what = f"the srun step {self.step_name!r} of job {self.job_id}"
        if state is None:
            what += f" (srun exit code {self.agent.returncode})"
        return self._explain_end(what, state, log, "srun's output")

    def stop(self) -> None:
        """Cancel our step in Slurm (the ranks on every node), then end srun itself."""
        if not self.succeeded:
            self._cancel_step()
        try:
            super().stop()
        finally:
            _remove_run_dir(self.shared_dir, self.succeeded)

    def _cancel_step(self) -> None:
        try:
            out = slurm_command(["squeue", "--steps", f"--jobs={self.job_id}", "--noheader",
                                 "--format=%i %j"], timeout=10)
        except SlurmJobError:
            return  # srun's own end (below) still ends the step
        for line in out.stdout.splitlines():
            step_id, _, name = line.strip().partition(" ")
            if name == self.step_name:
                try:
                    slurm_command(["scancel", "--quiet", step_id], timeout=10)
                except SlurmJobError:
                    pass


# -- sbatch: a batch job from outside any allocation ---------------------------------------------

class QueuedJob:
    """A submitted batch job, seen through ``scontrol show job``.

    It answers ``poll()`` like a :class:`subprocess.Popen` does (None while the job is queued
    or running), so the waiting loop of :class:`~distlab.local.LocalJob` can watch it, and it
    reports every change of state (PENDING, RUNNING, COMPLETED, ...) as it sees it. The
    controller is asked at most every ``poll_seconds``.
    """

    def __init__(self, job_id: str, poll_seconds: float, on_change=None):
        self.job_id, self.poll_seconds, self.on_change = job_id, poll_seconds, on_change
        self.state, self.reason, self.nodes, self.exit_code = "PENDING", "", "", None
        self.time_limit = ""
        self.asked = float("-inf")
        self.ended_at: float | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.asked < self.poll_seconds:
            return
        self.asked = now
        try:
            out = slurm_command(["scontrol", "--oneliner", "show", "job", self.job_id], timeout=15)
        except SlurmJobError:
            return  # the controller is busy or down: keep the last state, ask again later
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:  # finished long ago and forgotten by the controller
                self._update("GONE", "no longer known to the controller", self.nodes, None)
            return
        fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
        code = fields.get("ExitCode", "")
        self.time_limit = fields.get("TimeLimit", self.time_limit)
        self._update(fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                     fields.get("NodeList", ""), int(code.split(":")[0]) if code[:1].isdigit() else None)

    def _update(self, state, reason, nodes, exit_code) -> None:
        changed = state != self.state or (state == "PENDING" and reason != self.reason)
        self.state, self.reason, self.nodes, self.exit_code = state, reason, nodes, exit_code
        if not self.active and self.ended_at is None:
            self.ended_at = time.monotonic()
        if changed and self.on_change:
            self.on_change(self)

    def describe(self) -> str:
        if self.state == "PENDING":
            return f"PENDING ({self.reason})" if self.reason and self.reason != "None" else "PENDING"
        if self.state == "RUNNING":
            return f"RUNNING on {self.nodes}"
        return self.state

    # -- what LocalJob's loop asks of its "agent" ---------------------------------------------

    def poll(self) -> int | None:
        """None while the job is queued or running (or ended less than a moment ago)."""
        self.refresh()
        if self.active or time.monotonic() - self.ended_at < END_GRACE_SECONDS:
            return None
        return self.returncode

    @property
    def returncode(self) -> int | None:
        if self.active:
            return None
        return self.exit_code if self.exit_code is not None else 1


class SbatchJob(_RemoteRanks, LocalJob):
    """A batch job: write a job script, ``sbatch`` it, watch it, collect the results.

    Nothing runs on this machine but us: the "agent" that :class:`~distlab.local.LocalJob`'s
    loop polls is a :class:`QueuedJob`. The run's ``timeout`` does not include the wait in the
    queue, which has its own limit, ``queue_timeout``.
    """

    def __init__(self, run_dir: Path, nprocs: int, timeout: float, backend, threads: int,
                 pool: bool = False):
        if pool:
            raise ValueError("a Pool keeps its ranks between calls; it needs an allocation "
                             "(salloc, or a notebook started as a Slurm job), not a batch job")
        self.config = slurm_config.load()
        self.nodes = self.config.nodes
        self.nproc_per_node = ranks_per_node(nprocs, self.nodes)
        self.shared_dir = shared_run_dir(run_dir, self.config)
        # The attributes LocalJob's waiting loop and error reports read (there is no local process).
        self.run_dir = self.call_dir = self.shared_dir
        self.nprocs, self.timeout, self.pool = nprocs, timeout, False
        self.echo = OutputEcho(self.shared_dir, nprocs)
        self.succeeded = False
        self.workers = {}
        self.started = time.monotonic()
        self.job_id = None
        self.output = self.shared_dir / "slurm-job.out"
        self.script = self.shared_dir / "job.sbatch"
        self.script.write_text(self._job_script(timeout, backend, threads))
        self.job_id = self._submit()
        self.agent = QueuedJob(self.job_id, self.config.poll_seconds,
                               on_change=lambda job: _show(f"job {job.job_id}: {job.describe()}"))

    def _job_script(self, timeout: float, backend, threads: int | None) -> str:
        exports = worker_environment(backend, threads)  # the same variables LocalJob gives torchrun
        return job_script(self.config, nodes=self.nodes, nproc_per_node=self.nproc_per_node,
                          target=["--module", "distlab.worker", str(self.shared_dir)],
                          job_name="distlab", time_limit=self.config.time or minutes_for(timeout),
                          output=str(self.output), exports=exports,
                          torchrun_extra=["--monitor-interval=0.5"])

    def _submit(self) -> str:
        try:
            out = slurm_command(["sbatch", "--parsable", str(self.script)])
        except SlurmJobError:
            _remove_run_dir(self.shared_dir, succeeded=True)  # nothing ran: nothing to look at
            raise
        if out.returncode != 0:
            _remove_run_dir(self.shared_dir, succeeded=True)
            raise SlurmJobError(f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}\n"
                                f"(settings from distlab.toml / DISTLAB_SLURM_*: account={self.config.account!r}, "
                                f"partition={self.config.partition!r}, nodes={self.nodes}; "
                                "`python -m distlab.slurm_cli config` shows where each comes from)")
        job_id = out.stdout.strip().split(";")[0]  # "12" or "12;cluster"
        _show(f"job {job_id} submitted: {self.nodes} node(s) x {self.nproc_per_node} rank(s); "
              f"output in {self.shared_dir}")
        return job_id

    def wait(self, *args, **kwargs) -> list:
        __tracebackhide__ = True  # noqa: F841
        self._wait_until_running()
        self.started = time.monotonic()  # the ranks start now, not when we submitted
        return super().wait(*args, **kwargs)

    def _wait_until_running(self) -> None:
        limit = self.config.queue_timeout
        queued = time.monotonic()
        self.agent.refresh(force=True)
        while self.agent.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD"):
            if limit and time.monotonic() - queued > limit:
                raise SlurmJobError(
                    f"job {self.job_id} waited {limit:g} s in the queue ({self.agent.describe()}) and "
                    "was cancelled. Raise `queue_timeout` in distlab.toml, or pick a less busy "
                    "partition (`sinfo` shows them).", self.job_id, "PENDING")
            time.sleep(min(self.config.poll_seconds, 0.2))
            self.agent.refresh()

    def _ended_early(self, dead: list[int]) -> Exception:
        self.echo.pump()
        log = self.output.read_text(errors="replace") if self.output.exists() else ""
        what = f"Slurm job {self.job_id}"
        if self.agent.state not in WHY_IT_ENDED:
            what += f" (state {self.agent.state}, exit code {self.agent.exit_code})"
        return self._explain_end(what, self.agent.state, log, f"the job's output {self.output}")

    def stop(self) -> None:
        """Cancel the job unless it is already over; show how it ended."""
        try:
            if self.job_id is not None:
                self._end_job()
            self.echo.pump(final=True)
        finally:
            _remove_run_dir(self.shared_dir, self.succeeded)

    def _end_job(self, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        if self.succeeded:  # the ranks are leaving by themselves: give the job a moment
            while self.agent.active and time.monotonic() < deadline - seconds / 2:
                time.sleep(0.2)
                self.agent.refresh(force=True)
        if self.agent.active:
            try:
                slurm_command(["scancel", "--quiet", self.job_id], timeout=15)
            except SlurmJobError as exc:
                _show(f"could not cancel job {self.job_id}: {exc}; run `scancel {self.job_id}`")
                return
            while self.agent.active and time.monotonic() < deadline:
                time.sleep(0.2)
                self.agent.refresh(force=True)
