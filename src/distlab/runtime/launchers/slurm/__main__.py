"""``distlab-slurm`` (or ``python -m distlab.runtime.launchers.slurm``): distlab's Slurm helpers, from a shell.

    distlab-slurm config
        the settings in effect (distlab.toml, DISTLAB_SLURM_*) and where each came from
    distlab-slurm script --nodes 2 --ranks-per-node 4 -- train.py --epochs 3
        a job script that runs train.py on 2 nodes x 4 ranks (srun + torchrun, rendezvous on
        the first node, offline caches); save it and submit it with sbatch

The job script comes from :func:`.script.job_script`, the very function that writes
the job scripts of ``distlab.run(..., launcher="sbatch")``.
"""

from __future__ import annotations

import argparse
import sys

from distlab.runtime.launchers.slurm import config as slurm_config
from distlab.runtime.launchers.slurm.script import job_script


def _print_config() -> int:
    config, sources = slurm_config.load_with_sources()
    print(f"# distlab Slurm settings (file: {slurm_config.config_file() or 'none'})")
    for name in slurm_config.FIELDS:
        print(f"{name:16s} = {getattr(config, name)!r:40s} # {sources[name]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distlab-slurm",
        description="Slurm helpers of distlab; settings come from distlab.toml (see `config`).")
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("config", help="print the settings in effect and where each came from")
    script = sub.add_parser(
        "script", help="print a job script that runs a training script on several nodes",
        description="Print an sbatch script that runs SCRIPT on every rank through srun + torchrun, "
                    "e.g.: distlab-slurm script --nodes 2 --ranks-per-node 4 -- train.py --epochs 3 "
                    "> train.sbatch && sbatch train.sbatch")
    script.add_argument("--nodes", type=int, help="nodes (default: `nodes` of distlab.toml)")
    script.add_argument("--ranks-per-node", type=int,
                        help="ranks on each node (default: gpus_per_node, or 1 without GPUs)")
    script.add_argument("--time", help="--time limit (default: `time` of distlab.toml, or 30)")
    script.add_argument("--job-name", default="train")
    script.add_argument("--output", default="slurm-%x-%j.out", help="sbatch --output pattern")
    script.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args(argv)
    if args.what == "config":
        return _print_config()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("say what to run: ... script -- train.py [ARGS]")
    config = slurm_config.load()
    nodes = args.nodes or config.nodes
    per_node = args.ranks_per_node or config.gpus_per_node or 1
    print(job_script(config, nodes=nodes, nproc_per_node=per_node, target=command,
                     job_name=args.job_name, time_limit=args.time or config.time or "30",
                     output=args.output), end="")
    return 0


def cli() -> None:
    """The ``distlab-slurm`` command: :func:`main`, with a bad setting said in one line, not a traceback."""
    try:
        sys.exit(main())
    except ValueError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    cli()
