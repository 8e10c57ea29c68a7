"""A real, private, two-node Slurm cluster on this one machine: for the tests of
distlab.runtime.launchers.slurm and tests/hub/test_hub.py, and for the demo course (`make hub`).

    python scripts/slurm_cluster.py DIR     # start it; Ctrl-C (or SIGTERM) tears it down

From Python, ``with running_cluster(DIR) as info:`` starts this file as a supervisor process,
waits until both nodes are idle and stops it (and every job) on leaving the block.

It runs Debian's own daemons (package ``slurm-wlm``, Slurm 22.05, and ``munge``), started by
hand because test machines have no systemd:

* ``munged`` with a fresh key and a socket of its own (never the system's munge),
* ``slurmctld`` (the controller) and two ``slurmd`` (nodes ``distlab-n1``, ``distlab-n2``):
  Debian builds Slurm with "multiple slurmd" support, so both run here, on their own ports.

Everything lives in ``DIR``: ``slurm.conf``, spool and state directories, logs, pid files.
Clients find the cluster through ``SLURM_CONF=DIR/slurm.conf``; nothing in ``/etc/slurm`` is
touched. Ports are picked free at start, so this cluster cannot collide with a real one.

Its network comes in two kinds (:func:`cluster_network.choose_mode` picks; ready.json's
``network`` says which):

* **namespaces** (the default where this runs as root with iproute2): each node's slurmd runs
  in network, host-name and mount namespaces of its own, a host on a private subnet behind a
  bridge, with its own address and an ``/etc/hosts`` of the cluster's; the controller, munge
  and whatever else the tests start stay on this machine, at the subnet's ``.1``
  (scripts/cluster_network.py). Code that binds or dials 127.0.0.1 across nodes fails here as
  it fails at a centre.
* **loopback** (``DISTLAB_CLUSTER_NETWORK=loopback``, or where namespaces are not allowed):
  every node at 127.0.0.1. The node names must then resolve on this machine, so if they do
  not, a line ``127.0.0.1 distlab-n1 distlab-n2 ...`` is appended to ``/etc/hosts`` (and left
  there: a second test session may be relying on it): the one system change, loopback only.

This process is the cluster's supervisor. It marks itself a "child subreaper", so everything
the daemons start and then orphan (``slurmstepd``, job processes) becomes *its* child. On
teardown it cancels every job of this private cluster (whoever submitted it: the hub's
students submit as themselves), ends the daemons by pid, then ends
whatever descendants are left, by pid. It never signals anything by name.

Facts this relies on (measured on Debian 12 with Slurm 22.05): ``cgroup.conf`` only where the
jobs are confined (22.05 breaks on ``CgroupPlugin=disabled``), see :func:`confinement_lines`; spool dirs created
first; ``slurmd`` may ignore SIGTERM while it retries a dead controller (SIGKILL follows);
Slurm client commands block for minutes when the controller is gone (every call here has a
timeout).

Protocol with the test fixture: once both nodes are idle, ``DIR/ready.json`` appears, holding
``{"slurm_conf": ..., "nodes": [...], "partition": ...}``. If starting fails, the reason goes
to ``DIR/failed.txt`` and the process exits with code 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cluster_network
import psutil
from free_port import free_port

NODES = ["distlab-n1", "distlab-n2"]
HOST_ALIASES = NODES + [n + "i" for n in NODES]  # "i": the interconnect-suffix names, as at JSC
PARTITION = "debug"
HOSTS_LINE = "127.0.0.1 " + " ".join(HOST_ALIASES) + "  # distlab private Slurm cluster (scripts/slurm_cluster.py)"
CLIENT_TIMEOUT = 15  # seconds for any Slurm client call
START_TIMEOUT = 60   # seconds for the whole cluster to come up

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """The cluster could not be started; the message says why."""


# -- configuration ----------------------------------------------------------------------------

SPLIT_CORES_VARIABLE = "DISTLAB_CLUSTER_SPLIT_CORES"
"""Set to 1, each node gets its own half of this machine's cores, as real nodes have their own:
it declares half the CPUs and memory, its slurmd (and so every job it starts) is pinned to its
half, and a partition named after the node holds it alone. For benchmarks of 1 node vs 2
(``benchmarks/autograde.py --cluster``); without it both nodes share all the cores."""


def split_cores() -> bool:
    return os.environ.get(SPLIT_CORES_VARIABLE, "") == "1"


DECLARED_CPUS_VARIABLE = "DISTLAB_CLUSTER_CPUS_PER_NODE"
"""Set to N, each node declares N CPUs whatever this machine has, and Slurm believes it
(``SlurmdParameters=config_overrides``, Slurm's way to test a configuration bigger than the
machine). The demo course sizes its cluster so that every student of the class gets a server
(``make hub STUDENTS=30``): the jobs then share this machine's real cores, as many classes'
worth of idle notebooks would share a real node."""


def declared_cpus() -> int | None:
    value = os.environ.get(DECLARED_CPUS_VARIABLE, "")
    return int(value) if value.strip() else None


def _declared(hardware: str, cpus: int) -> str:
    """``slurmd -C``'s line for a node that says it has ``cpus`` single-thread cores on one socket."""
    fields = dict(field.split("=", 1) for field in hardware.split())
    fields.update(CPUs=str(cpus), Boards="1", SocketsPerBoard="1", CoresPerSocket=str(cpus), ThreadsPerCore="1")
    return " ".join(f"{k}={v}" for k, v in fields.items())


def node_cores(index: int) -> set[int]:
    """The cores node ``index`` is pinned to when the cores are split."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // len(NODES))
    return set(cores[index * half:(index + 1) * half]) or {cores[-1]}


def _halved(hardware: str) -> str:
    """``slurmd -C``'s line for a node with half of everything (one socket)."""
    fields = dict(field.split("=", 1) for field in hardware.split())
    cpus = max(1, int(fields["CPUs"]) // len(NODES))
    threads = int(fields.get("ThreadsPerCore", 1))
    fields.update(CPUs=str(cpus), Boards="1", SocketsPerBoard="1", CoresPerSocket=str(max(1, cpus // threads)),
                  RealMemory=str(int(fields.get("RealMemory", 1024)) // len(NODES)))
    return " ".join(f"{k}={v}" for k, v in fields.items())


def node_hardware() -> str:
    """CPUs, sockets, cores, memory of this machine, as ``slurmd -C`` reports them."""
    try:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=CLIENT_TIMEOUT)
    except FileNotFoundError:
        raise ClusterError("slurmd is not installed: `apt-get install slurm-wlm munge` "
                           "(make test does it through scripts/install-system-deps.sh)") from None
    first = (out.stdout.splitlines() or [""])[0]
    if out.returncode != 0 or not first.startswith("NodeName="):
        raise ClusterError(f"`slurmd -C` failed (exit {out.returncode}): {out.stderr.strip()}")
    # "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105": keep everything but the name.
    return " ".join(field for field in first.split() if not field.startswith("NodeName="))


# A Unix socket's path holds at most 107 bytes. slurmstepd makes one per job step in the spool
# directory, "<spool>/<node>_<job>.<step>", and a batch script's step is number 4294967291; a
# longer path makes every task launch fail with nothing better than "Unspecified error". The
# spool directory's name is kept to one letter for this reason.
SOCKET_PATH_LIMIT = 107


def spool_dir(root: Path, node: str) -> Path:
    """``node``'s slurmd spool directory (``%n`` in slurm.conf stands for every node)."""
    return root / "s" / node


def step_socket(root: Path, node: str, job: int, step: int) -> Path:
    """Where slurmstepd puts the socket of step ``job.step`` on ``node``."""
    return spool_dir(root, node) / f"{node}_{job}.{step}"


def check_socket_paths(root: Path) -> None:
    """Refuse a cluster directory so deep that slurmstepd's step sockets could not be created
    (for job ids of up to seven digits)."""
    longest = step_socket(root, max(NODES, key=len), 9_999_999, 4294967291)
    if len(os.fsencode(longest)) > SOCKET_PATH_LIMIT:
        raise ClusterError(f"the cluster directory {root} is too deep: a job step's socket "
                           f"({len(os.fsencode(longest))} bytes) would pass the {SOCKET_PATH_LIMIT}-byte "
                           "limit of a Unix socket path. Use a shorter directory.")


CGROUP_V1_CONTROLLERS = ("freezer", "cpuset", "memory")
"""What Slurm's cgroup/v1 plugin needs mounted (and root able to make groups in)."""


def confinement_lines(root: Path) -> list[str]:
    """slurm.conf's lines on how a job's processes are tracked and confined.

    Where cgroup v1 is mounted with the controllers Slurm needs (this machine, measured: a step
    runs in ``freezer:/slurm_<node>/uid_<uid>/job_<id>/step_0``), each job gets its own control
    groups: Slurm then knows every process of a job (``proctrack/cgroup``: nothing escapes
    ``scancel`` by leaving its session) and caps its memory at what it asked for
    (``ConstrainRAMSpace``). Not its cores: the two "nodes" here are one machine, so a job's core
    numbers are not cores of its own (``ConstrainCores=no``; a real cluster says yes). The
    groups are named by node and job id, and two clusters of this script may run at once on one
    machine with the same node names: each starts its job ids at a number of its own
    (``FirstJobId``). Elsewhere (cgroup v2 only, not tried with this Slurm; or no right to make
    groups) jobs are tracked by process tree as before, ``proctrack/linuxproc`` and ``task/none``,
    with no cgroup.conf at all."""
    base = Path("/sys/fs/cgroup")
    if os.geteuid() == 0 and all(os.access(base / c / "cgroup.procs", os.W_OK) for c in CGROUP_V1_CONTROLLERS):
        (root / "cgroup.conf").write_text("# Written by scripts/slurm_cluster.py\nCgroupPlugin=cgroup/v1\n"
                                          "ConstrainRAMSpace=yes\nConstrainCores=no\n")
        return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup",
                f"FirstJobId={1000 + int.from_bytes(os.urandom(3), 'big')}"]
    return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]


def write_config(root: Path, network: dict | None = None) -> Path:
    """Write ``root/slurm.conf`` for a controller and two nodes, at the addresses ``network``
    describes (:meth:`cluster_network.Network.describe`; None: all on 127.0.0.1); return its path."""
    network = network or cluster_network.loopback_description()
    check_socket_paths(root)
    for sub in ("state", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for node in NODES:
        spool_dir(root, node).mkdir(parents=True, exist_ok=True)
    hardware = node_hardware()
    ctl_port = free_port()
    lines = [
        "# Written by scripts/slurm_cluster.py: a private two-node cluster on this machine.",
        "ClusterName=distlabtest",
        f"SlurmctldHost={socket.gethostname()}({network['controller_address']})",
        f"SlurmctldPort={ctl_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={spool_dir(root, '%n')}",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        *confinement_lines(root),
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/builtin",  # first come, first served: jobs start at once
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        # A user's squeue, sacct, sshare and scontrol show only their own jobs, usage and account:
        # students share the cluster; root and SlurmUser (the hub's queue position) see all.
        "PrivateData=jobs,usage,users",
        "ReturnToService=2",
        "KillWait=5",          # seconds between SIGTERM and SIGKILL when a job is cancelled
        "MinJobAge=300",       # finished jobs stay visible to scontrol for 5 minutes
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "MessageTimeout=10",
    ]
    if split_cores():
        hardware = _halved(hardware)
    declared = declared_cpus()
    if declared:
        hardware = _declared(hardware, declared)
        lines.append("SlurmdParameters=config_overrides")  # the nodes take the CPUs declared here
    for node in NODES:
        # In namespaces a node is a host of its own, named as itself; on loopback all are localhost.
        where = (f"NodeHostname={node} NodeAddr={network['addresses'][node]}" if network["mode"] == "namespaces"
                 else "NodeHostname=localhost NodeAddr=127.0.0.1")
        lines.append(f"NodeName={node} {where} Port={free_port()} {hardware} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    if split_cores():
        lines += [f"PartitionName={node} Nodes={node} MaxTime=INFINITE State=UP" for node in NODES]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def ensure_node_names_resolve() -> None:
    """torch's c10d rendezvous connects to the first node by name: make the names resolve."""
    missing = [name for name in HOST_ALIASES if not _resolves(name)]
    if not missing:
        return
    try:
        ends_with_newline = Path("/etc/hosts").read_text().endswith("\n")
        with open("/etc/hosts", "a") as hosts:
            hosts.write(("" if ends_with_newline else "\n") + HOSTS_LINE + "\n")
    except OSError as exc:
        raise ClusterError(f"the node names {missing} do not resolve and /etc/hosts is not "
                           f"writable ({exc}); add this line to /etc/hosts:\n{HOSTS_LINE}") from None
    still = [name for name in HOST_ALIASES if not _resolves(name)]
    if still:
        raise ClusterError(f"added {HOSTS_LINE!r} to /etc/hosts but {still} still do not resolve")


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


# -- the daemons ------------------------------------------------------------------------------

class Cluster:
    """Start munged, slurmctld and one slurmd per node; stop them (and what they left) by pid."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.daemons: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        self.conf: Path | None = None
        self.network: cluster_network.Network | None = None

    def start(self) -> dict:
        try:
            mode, why = cluster_network.choose_mode()
        except cluster_network.NetworkError as exc:
            raise ClusterError(str(exc)) from None
        description = cluster_network.loopback_description()
        description["addresses"] = {node: "127.0.0.1" for node in NODES}
        if mode == "namespaces":
            aliases = {node: [a for a in HOST_ALIASES if a != node and a.startswith(node)] for node in NODES}
            self.network = cluster_network.Network(self.root, NODES, aliases, socket.gethostname())
            try:
                self.network.start()
            except (cluster_network.NetworkError, OSError, subprocess.SubprocessError) as exc:
                raise ClusterError(f"the nodes' network could not be made ({exc}); "
                                   f"{cluster_network.MODE_VARIABLE}=loopback runs every node on 127.0.0.1") from None
            description = self.network.describe()
        else:
            ensure_node_names_resolve()
        description["why"] = why
        self.conf = write_config(self.root, description)
        self.env["SLURM_CONF"] = str(self.conf)
        self._start_munge()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for index, node in enumerate(NODES):
            cores = node_cores(index) if split_cores() else None
            inside = self.network.run_in(node) if self.network else []
            self._spawn(f"slurmd-{node}", [*inside, "slurmd", "-D", "-N", node, "-f", str(self.conf)], cores)
        self._wait_for_idle_nodes()
        return {"slurm_conf": str(self.conf), "nodes": NODES, "partition": PARTITION, "network": description,
                "pids": {name: p.pid for name, p in self.daemons.items()}}

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.unlink(missing_ok=True)  # a fresh key each start (DIR may hold an old cluster)
        out = subprocess.run(["mungekey", "--create", f"--keyfile={key}"],
                             capture_output=True, text=True, timeout=CLIENT_TIMEOUT)
        if out.returncode != 0:
            raise ClusterError(f"mungekey failed: {out.stderr.strip()}")
        os.chmod(self.root / "munge", 0o755)  # munged wants its socket directory searchable
        sock = self.root / "munge" / "munge.socket"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}",
                               f"--socket={sock}", f"--pid-file={self.root}/munge/munged.pid",
                               f"--log-file={self.root}/log/munged.log",
                               f"--seed-file={self.root}/munge/munged.seed"])
        self._wait_for(lambda: sock.exists(), 10, "munged did not create its socket")

    def _spawn(self, name: str, cmd: list[str], cores: set[int] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")

        def pin() -> None:  # a daemon dies with the supervisor, even a killed one
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if cores:
                os.sched_setaffinity(0, cores)

        try:
            self.daemons[name] = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                                  stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
        except FileNotFoundError:
            raise ClusterError(f"{cmd[0]} is not installed: `apt-get install slurm-wlm munge` "
                               "(make test does it through scripts/install-system-deps.sh)") from None
        finally:
            log.close()

    def _wait_for(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited with code {proc.returncode} while starting. "
                                       f"{self.logs_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} within {seconds:g} s. {self.logs_tail()}")
            time.sleep(0.2)

    def _wait_for_idle_nodes(self) -> None:
        def idle() -> bool:
            out = self.client(["sinfo", "--noheader", "--Node", "--format=%N %t"], check=False)
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(node) == "idle" for node in NODES)

        self._wait_for(idle, START_TIMEOUT, f"nodes {NODES} did not become idle")

    def client(self, cmd: list[str], check: bool = True) -> str:
        """Run a Slurm client command against this cluster, with a timeout."""
        try:
            out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            if check:
                raise ClusterError(f"{' '.join(cmd)} did not answer within {CLIENT_TIMEOUT} s") from None
            return ""
        if check and out.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
        return out.stdout

    def logs_tail(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            text = log.read_text(errors="replace").strip().splitlines()
            if text:
                parts.append(f"--- {log.name} ---\n" + "\n".join(text[-lines:]))
        return "Daemon logs:\n" + "\n".join(parts) if parts else "(no daemon logs)"

    def stop(self) -> None:
        """Cancel every job, end the daemons by pid, then end every process left below us."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            jobs = self.client(["squeue", "--noheader", "--format=%i"], check=False).split()
            if jobs:  # every job here is ours, whichever user submitted it (root may cancel all)
                self.client(["scancel", "--full", *jobs], check=False)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if not self.client(["squeue", "--noheader", "--format=%i"], check=False).strip():
                    break
                time.sleep(0.3)
        # Nodes first (they would otherwise retry the controller), then controller, then munge.
        order = [n for n in self.daemons if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.daemons.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:  # e.g. slurmd retrying a gone controller
                    proc.kill()
                    proc.wait(timeout=5)
        end_descendants()
        if self.network is not None:   # its holders are gone with the descendants; to be sure
            self.network.stop()


# -- the supervisor process ---------------------------------------------------------------------

def end_descendants(grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process below this one (they are ours: we are a subreaper)."""
    me = psutil.Process()
    procs = me.children(recursive=True)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive + me.children(recursive=True):
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(me.children(recursive=True), timeout=grace)
    reap_orphans()


def reap_orphans() -> None:
    """Collect the exit status of adopted children (slurmstepd, job processes) so no zombie stays."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(root: Path, keep: bool = False) -> int:
    """Run the cluster in ``root`` until a signal; then end it, and remove ``root`` if this made
    it, unless ``keep`` (:func:`running_cluster` keeps it: its caller owns the folder and reads
    its logs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans below us become our children
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the test run died: tear down
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    keep = keep or root.exists()  # never remove a folder someone else made
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("ready.json", "failed.txt"):
        (root / stale).unlink(missing_ok=True)
    cluster = Cluster(root)
    try:
        started = time.monotonic()
        info = cluster.start()
        info["start_seconds"] = round(time.monotonic() - started, 2)
        (root / "ready.json").write_text(json.dumps(info))
        print(f"Slurm test cluster up in {info['start_seconds']} s: export SLURM_CONF={info['slurm_conf']}",
              flush=True)
        if not keep:
            print(f"Ctrl-C stops it and removes {root} (--keep keeps its logs there).", flush=True)
        while not stopping:
            time.sleep(0.2)
            reap_orphans()
            dead = [name for name, p in cluster.daemons.items() if p.poll() is not None]
            if dead:
                print(f"daemon(s) {dead} exited; tearing down. {cluster.logs_tail()}", flush=True)
                break
        return 0
    except ClusterError as exc:
        (root / "failed.txt").write_text(str(exc))
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        cluster.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(root: Path, timeout: float = 90, env: dict | None = None):
    """Start the cluster in ``root`` as a supervisor process; yield ready.json's dict plus
    ``root``, ``supervisor`` (its pid) and ``start_seconds``; on leaving, SIGTERM the supervisor
    (it cancels every job and ends the daemons) and wait for it.

    Raises :class:`ClusterError` with the supervisor's reason if the cluster does not come up
    within ``timeout`` seconds.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    log_path = root.parent / f"{root.name}-supervisor.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        supervisor = subprocess.Popen([sys.executable, __file__, "--keep", str(root)], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=env)
    try:
        ready, failed = root / "ready.json", root / "failed.txt"
        while not ready.exists():
            if failed.exists() or supervisor.poll() is not None or time.monotonic() - started > timeout:
                time.sleep(0.5)
                reason = failed.read_text() if failed.exists() else log_path.read_text(errors="replace")
                raise ClusterError(f"the private Slurm cluster did not start within {timeout:g} s:\n{reason}")
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        info.update(root=root, supervisor=supervisor.pid, start_seconds=round(time.monotonic() - started, 1))
        yield info
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(timeout=10)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    keep = "--keep" in arguments
    folders = [a for a in arguments if a != "--keep"]
    if len(folders) != 1:
        sys.exit(f"usage: {sys.argv[0]} [--keep] DIR   (DIR: where the cluster's config, logs and spool go; "
                 "removed when it stops, unless --keep)")
    sys.exit(main(Path(folders[0]).resolve(), keep))
