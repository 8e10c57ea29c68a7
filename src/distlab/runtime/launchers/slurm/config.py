"""Where distlab's Slurm settings come from: one ``[slurm]`` table in ``distlab.toml``, and
environment variables that override it key by key.

Every cluster differs in a few details: the account a course bills to, the partition with
GPUs, the modules to load, how to activate the course environment, and sometimes a hostname
suffix for the fast network. They live in one file::

    # distlab.toml (in the repository root, or see "which file" below)
    [slurm]
    account = "training2609"
    partition = "booster"
    gpus_per_node = 4
    modules = ["Stages/2025", "GCC", "Python"]
    activate = "source $HOME/course/venv/bin/activate"
    hostname_suffix = "i"
    run_root = "$HOME/distlab-runs"

**Which file**: ``$DISTLAB_CONFIG`` if set; otherwise the first ``distlab.toml`` found in the
current directory or one of its parents (a notebook in ``book/01-...`` finds the one at the
repository root); otherwise ``~/.config/distlab/distlab.toml``. No file at all is fine: every
key has a default.

**Environment variables** win over the file: ``DISTLAB_SLURM_<KEY>``, e.g.
``DISTLAB_SLURM_PARTITION=booster`` or ``DISTLAB_SLURM_MODULES="GCC Python"`` (lists are
split like a shell splits words).

``distlab-slurm config`` prints the settings in effect and where each came from.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

ENV_PREFIX = "DISTLAB_SLURM_"


@dataclasses.dataclass
class SlurmConfig:
    """The settings of the Slurm launchers. Every field is one key of ``[slurm]``."""

    account: str = ""
    """``--account``: the project the job's hours are billed to (empty: your default)."""
    partition: str = ""
    """``--partition``: the queue, e.g. the one with GPUs (empty: the cluster's default)."""
    time: str = ""
    """``--time`` of a batch job, in Slurm's format ("30", "1:00:00"). Empty: the run's
    ``timeout`` rounded up to whole minutes, plus two (to start and to leave)."""
    nodes: int = 1
    """Nodes of a batch job started by ``distlab.run(..., launcher="sbatch")``; the ranks are
    spread evenly, so ``nprocs`` must be a multiple of it."""
    gpus_per_node: int = 0
    """GPUs to ask for on each node (``--gres=gpu:N``); 0: none."""
    cpus_per_task: int = 0
    """CPU cores for the ranks of one node (``--cpus-per-task`` of the one task per node that
    runs torchrun); 0: Slurm's default."""
    modules: list = dataclasses.field(default_factory=list)
    """Environment modules to load first (``module load ...``), in order."""
    activate: str = ""
    """Shell line(s) that activate the course environment on a compute node, e.g.
    ``source $HOME/course/venv/bin/activate``."""
    python: str = ""
    """The Python to run on the compute nodes. Empty: ``python`` when ``activate`` is set,
    otherwise the interpreter running this notebook (right when it lives on a shared
    filesystem, as a course environment does)."""
    hostname_suffix: str = ""
    """Appended to the first node's name to reach it over the fast network (JSC: "i")."""
    run_root: str = "~/.distlab/runs"
    """Where run directories go. It must be visible from every node (home or project
    directory, never /tmp)."""
    sbatch_options: list = dataclasses.field(default_factory=list)
    """More ``#SBATCH`` options, e.g. ``["--reservation=course", "--qos=normal"]``."""
    offline: bool = True
    """Tell Hugging Face and friends not to use the internet: compute nodes have none."""
    queue_timeout: float = 3600.0
    """Seconds a batch job may wait in the queue before distlab cancels it (0: no limit)."""
    poll_seconds: float = 2.0
    """How often to ask the controller about a batch job (be gentle with a shared one)."""

    @property
    def python_on_nodes(self) -> str:
        if self.python:
            return self.python
        return "python" if self.activate else sys.executable

    @property
    def run_root_path(self) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(self.run_root)))


FIELDS = {f.name: f for f in dataclasses.fields(SlurmConfig)}


def config_file(start: Path | None = None) -> Path | None:
    """The distlab.toml in effect (see the module docstring), or None."""
    explicit = os.environ.get("DISTLAB_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ValueError(f"DISTLAB_CONFIG={explicit!r}: no such file")
        return path
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        if (folder / "distlab.toml").is_file():
            return folder / "distlab.toml"
    user = Path.home() / ".config" / "distlab" / "distlab.toml"
    return user if user.is_file() else None


def load(start: Path | None = None) -> SlurmConfig:
    """The settings in effect: defaults, then the file's ``[slurm]`` table, then the environment."""
    return load_with_sources(start)[0]


def load_with_sources(start: Path | None = None) -> tuple[SlurmConfig, dict[str, str]]:
    """Like :func:`load`, and for each key where its value came from."""
    values: dict = {}
    sources = {name: "default" for name in FIELDS}
    path = config_file(start)
    if path is not None:
        for key, value in _read_table(path).items():
            values[key] = _check(key, value, f"{path} [slurm] {key}")
            sources[key] = str(path)
    for key in FIELDS:
        env = ENV_PREFIX + key.upper()
        if env in os.environ:
            values[key] = _from_env(key, os.environ[env], env)
            sources[key] = f"${env}"
    for name in os.environ:
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):].lower() not in FIELDS:
            raise ValueError(f"unknown setting ${name}; known: "
                             + ", ".join(ENV_PREFIX + k.upper() for k in FIELDS))
    return SlurmConfig(**values), sources


def _read_table(path: Path) -> dict:
    if tomllib is None:
        raise ValueError(f"reading {path} needs Python 3.11 or the `tomli` package")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    table = data.get("slurm", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: `slurm` must be a table ([slurm]), got {type(table).__name__}")
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown} in [slurm]; known keys: {sorted(FIELDS)}")
    return table


def _expected_type(key: str) -> type:
    return type(FIELDS[key].default) if FIELDS[key].default is not dataclasses.MISSING else list


def _check(key: str, value, where: str):
    """A value from the file, checked against the type of the key's default."""
    kind = _expected_type(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: expected a list of strings, got {value!r}")
        return list(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {kind.__name__}, got {value!r}")
    return _check_range(key, value, where)


def _from_env(key: str, text: str, where: str):
    """A value from an environment variable, converted to the key's type."""
    kind = _expected_type(key)
    try:
        if kind is list:
            return shlex.split(text)
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError
            return lowered in ("1", "true", "yes")
        value = kind(text)
    except ValueError:
        raise ValueError(f"${where}={text!r}: expected {kind.__name__}") from None
    return _check_range(key, value, f"${where}")


def _check_range(key: str, value, where: str):
    if key == "nodes" and value < 1:
        raise ValueError(f"{where}: nodes must be at least 1, got {value}")
    if key in ("gpus_per_node", "cpus_per_task", "queue_timeout") and value < 0:
        raise ValueError(f"{where}: {key} cannot be negative, got {value}")
    if key == "poll_seconds" and value <= 0:
        raise ValueError(f"{where}: poll_seconds must be positive, got {value}")
    return value
