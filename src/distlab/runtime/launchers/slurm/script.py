"""The shell that starts ranks on a cluster: the ``srun`` line and the batch job script.

Both are built from the same pieces, so what ``distlab.run(..., launcher="sbatch")`` submits
and what ``distlab-slurm script -- train.py`` prints for your own
training script are the same recipe: the environment of every node, the rendezvous on the
first node, one torchrun per node.
"""

from __future__ import annotations

import shlex

from distlab.runtime.launchers.slurm.commands import PORT_RANGE
from distlab.runtime.launchers.slurm.config import SlurmConfig

INTERCONNECT = "distlab.runtime.launchers.slurm.interconnect"

OFFLINE_VARIABLES = {
    "HF_HUB_OFFLINE": "1",          # huggingface_hub: never try to download
    "HF_DATASETS_OFFLINE": "1",     # datasets: use the local cache only
    "TRANSFORMERS_OFFLINE": "1",    # transformers (older releases read this one)
    "HF_EVALUATE_OFFLINE": "1",     # evaluate
    "WANDB_MODE": "offline",        # Weights & Biases: log locally, `wandb sync` later
}
"""Compute nodes have no internet: libraries that would download must use their caches."""

def torchrun_on_each_node(python: str, nnodes: str, nproc_per_node: int, endpoint: str,
                          rdzv_id: str, target: list[str], extra: list[str] = (),
                          private_network_folder: str | None = None, private_network_on_one_node: bool = False) -> str:
    """The shell line that ``srun`` runs once on every node: torchrun, joining the rendezvous.

    ``nnodes``, ``endpoint`` and ``rdzv_id`` may be shell variables (``"$SLURM_NNODES"``):
    they are expanded on the node. ``is_host`` is 1 on the step's first node only. Before
    torchrun starts, the node asks the kernel which of its interfaces reaches the rendezvous
    host (:mod:`.interconnect`): gloo and NCCL use that one, and torchrun tells the other nodes
    this node's address on it. ``private_network_folder`` (a step on one node): torchrun and
    its ranks start in a network of their own there (:mod:`distlab.runtime.private_network`,
    its hosts file in that folder), whose loopback the rendezvous is on.
    ``private_network_on_one_node`` (a batch job's script): the same, decided on the node, where
    the step turns out to run on one node.
    """
    host = endpoint.rsplit(":", 1)[0]
    host = f'"{host}"' if "$" in host else shlex.quote(host)
    args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", *extra]
    route = [f"route=\"$({shlex.quote(python)} -m {INTERCONNECT} {host})\" || exit 1",
             'read -r interface address <<< "$route"',
             '# gloo and NCCL talk over the interface that reaches the rendezvous (unless you chose one).',
             'export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$interface}" '
             'NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$interface}"']
    torchrun = f"{shlex.quote(python)} -m torch.distributed.run"
    if private_network_folder:
        torchrun = (f"{shlex.quote(python)} -m distlab.runtime.private_network "
                    f"{shlex.quote(private_network_folder)} -- {torchrun}")
    elif private_network_on_one_node:
        route.append("# On one node, torchrun and its ranks start in a network of their own (see step 2).")
        torchrun = f"{shlex.quote(python)} -m distlab.runtime.private_network --one-node -- {torchrun}"
    parts = [f"exec {torchrun}"]
    parts += [a if "$" in a else shlex.quote(a) for a in args]
    parts += ['--local-addr="$address"', "--rdzv-conf=is_host=$(( SLURM_NODEID == 0 ))", shlex.join(target)]
    return "\n" + "\n".join(route) + "\n" + " \\\n    ".join(parts)  # one option per line: readable in a job script


def srun_command(nodes: list[str], step_name: str, shell_line: str, cpus: int | None = None) -> list[str]:
    """``srun``: one task per node, on exactly these nodes, running ``shell_line``."""
    cmd = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
           f"--nodelist={','.join(nodes)}", f"--job-name={step_name}",
           "--kill-on-bad-exit=1",  # a node whose torchrun fails takes the step down with it
           "--overlap"]             # share the allocation with the step the notebook may run in
    if cpus:
        cmd.append(f"--cpus-per-task={cpus}")
    return cmd + ["bash", "-c", shell_line]


def environment_lines(config: SlurmConfig, exports: dict[str, str] | None = None) -> list[str]:
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


def free_port_lines(python: str, ports: tuple[int, int] = PORT_RANGE) -> list[str]:
    """Shell lines that set ``MASTER_PORT`` to a port free on this node, for the rendezvous.

    The port comes from :data:`~distlab.runtime.launchers.slurm.commands.PORT_RANGE`, below the
    ports Linux hands out by itself (32768 and up, to every outgoing connection and to every
    ``bind`` to port 0). A port asked of the kernel with ``bind(("", 0))`` and let go again is
    one of those: on a busy node another process was once given it in the seconds before
    torchrun listened on it, and the job failed with EADDRINUSE.
    """
    low, high = ports
    return [
        f"# A port free on the first node (this script runs there), from {low}-{high - 1}: below the",
        "# ports Linux gives out by itself (32768 and up), so nothing takes it before torchrun listens.",
        f"MASTER_PORT=\"$({shlex.quote(python)} - <<'EOF'",
        "import random, socket",
        f"for port in random.SystemRandom().sample(range({low}, {high}), {min(100, high - low)}):",
        "    try:",
        '        socket.socket().bind(("", port))',
        "    except OSError:",
        "        continue  # in use: draw another",
        "    print(port)",
        "    break",
        "EOF",
        ')"',
    ]


def job_script(config: SlurmConfig, *, nodes: int, nproc_per_node: int,
               target: list[str], job_name: str, time_limit: str, output: str,
               exports: dict[str, str] | None = None, torchrun_extra: list[str] = ()) -> str:
    """A complete sbatch script: ``#SBATCH`` options, environment, rendezvous, srun + torchrun.

    ``target`` is what torchrun runs on every rank: ``["train.py", "--epochs", "3"]``, or
    ``["--module", "distlab.runtime.worker", RUNDIR]`` for ``distlab.run``.
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
    torchrun = torchrun_on_each_node(python, "$SLURM_NNODES", nproc_per_node,
                                     "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID", target,
                                     ["--max-restarts=0", *torchrun_extra], private_network_on_one_node=True)
    lines = ["#!/bin/bash", "# Written by distlab. Submit it with: sbatch <this file>"]
    lines += [f"#SBATCH {option}" for option in sbatch]
    lines += ["", "# 1. The software environment of every node.", *environment_lines(config, exports)]
    lines += [
        "",
        "# 2. Where the ranks meet.",
        'if [ "$SLURM_NNODES" -eq 1 ]; then',
        "    # One node: on its loopback, in a network of the job's own that no other account on",
        "    # this node can reach (torchrun and its ranks start in it, in step 3).",
        "    MASTER_ADDR=127.0.0.1",
        "else",
        "    # Several nodes: on the first node of the allocation"
        + (f", reached through the fast network (suffix {config.hostname_suffix!r})." if config.hostname_suffix else "."),
        f'    MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1){config.hostname_suffix}"',
        "fi",
        *free_port_lines(python),
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
