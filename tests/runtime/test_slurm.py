"""distlab on Slurm: command building without a cluster, then a real two-node Slurm cluster.

The slow tests start Debian's Slurm on this machine (scripts/slurm_cluster.py: munged,
slurmctld, two slurmd as nodes distlab-n1 and distlab-n2) and run through it: srun inside
``salloc``, sbatch from outside any allocation, 2 nodes x 2 ranks each way, a training script
through the job-script template, a rank that raises, ``scancel`` and the ``--time`` limit.
If Slurm cannot start here, they fail and say why: they are never skipped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import cluster_network
import psutil
import pytest
import slurm_cluster

import distlab
from distlab import RankError
from distlab.runtime import launchers
from distlab.runtime.launchers.local import LocalJob
from distlab.runtime.launchers.slurm import commands, interconnect, script
from distlab.runtime.launchers.slurm import config as slurm_config
from distlab.runtime.launchers.slurm.commands import SlurmJobError
from distlab.runtime.launchers.slurm.sbatch import QueuedJob, SbatchJob
from distlab.runtime.launchers.slurm.srun import SrunJob

REPO = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT = 20


# ---- without a cluster ------------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No Slurm allocation, no distlab settings from the environment or a user's files."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "DISTLAB_SLURM_")) or name in ("DISTLAB_CONFIG", "DISTLAB_LAUNCHER"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def test_auto_picks_srun_inside_an_allocation_and_local_outside(clean_env, monkeypatch):
    has_srun = {"value": True}
    monkeypatch.setattr(commands.shutil, "which", lambda name: "/usr/bin/srun" if has_srun["value"] else None)
    assert launchers.choose("auto") is LocalJob  # no SLURM_JOB_ID: a laptop, a login node
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert launchers.choose("auto") is SrunJob
    has_srun["value"] = False  # a job id but no Slurm tools: local after all
    assert launchers.choose("auto") is LocalJob
    has_srun["value"] = True
    monkeypatch.setenv("DISTLAB_LAUNCHER", "local")  # the user's explicit choice wins
    assert launchers.choose("auto") is LocalJob
    assert launchers.choose("srun") is SrunJob
    assert launchers.choose("sbatch") is SbatchJob
    with pytest.raises(ValueError, match="'sbatch'.*'srun'"):
        launchers.choose("slurm")


def test_ranks_are_spread_evenly_over_nodes():
    assert commands.ranks_per_node(4, 2) == 2
    assert commands.ranks_per_node(3, 1) == 3
    with pytest.raises(ValueError, match="3 ranks cannot be spread evenly over 2 nodes"):
        commands.ranks_per_node(3, 2)


def test_cpus_per_node_reads_slurms_compressed_format():
    assert commands.cpus_per_node("36(x2),72") == 36
    assert commands.cpus_per_node("2") == 2
    assert commands.cpus_per_node("") is None


def test_a_batch_job_asks_for_its_timeout_plus_two_minutes_to_start_and_leave():
    assert script.minutes_for(60) == "3"
    assert script.minutes_for(61) == "4"
    assert script.minutes_for(5) == "3"


def test_each_node_runs_torchrun_and_only_the_first_hosts_the_rendezvous():
    line = script.torchrun_on_each_node("echo", "2", 4, "n1i:23456", "run-x",
                                       ["--module", "distlab.runtime.worker", "/runs/a b"])
    for part in ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=n1i:23456", "--rdzv-id=run-x", "'/runs/a b'"]:
        assert part in line
    # With `echo` as the interpreter, bash shows what each node would run.
    for node_id, is_host in (("0", "1"), ("1", "0")):
        out = subprocess.run(["bash", "-c", line], env={"SLURM_NODEID": node_id, "PATH": os.environ["PATH"]},
                             capture_output=True, text=True, timeout=10)
        assert f"--rdzv-conf=is_host={is_host} --module distlab.runtime.worker /runs/a b" in out.stdout


def test_the_interface_for_gloo_is_the_one_the_kernel_routes_to_the_rendezvous_host_by():
    assert interconnect.route_to("127.0.0.1") == ("lo", "127.0.0.1")
    assert interconnect.route_to("localhost")[0] == "lo"
    with pytest.raises(interconnect.NoRoute, match="does not resolve"):
        interconnect.route_to("no-such-node.invalid")
    # Every node of a job exports what the route says, unless the user chose an interface.
    line = script.torchrun_on_each_node(sys.executable, "1", 1, "127.0.0.1:1", "x", ["t"])
    shown = line.replace(f"exec {sys.executable} -m torch.distributed.run", "echo $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME", 1)
    for chosen, expected in ((None, "lo lo"), ("ib7", "ib7 lo")):
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "src"), "SLURM_NODEID": "0",
               **({"GLOO_SOCKET_IFNAME": chosen} if chosen else {})}
        out = subprocess.run(["bash", "-c", shown], env=env, capture_output=True, text=True, timeout=30)
        assert out.stdout.startswith(expected + " "), out.stdout + out.stderr
        assert "--local-addr=127.0.0.1 " in out.stdout   # torchrun tells the others this node's address


def test_srun_runs_one_task_per_node_on_exactly_those_nodes():
    cmd = script.srun_command(["n1", "n2"], "distlab-run-x", "exec true", cpus=8)
    assert cmd[:1] == ["srun"] and cmd[-3:] == ["bash", "-c", "exec true"]
    for option in ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2",
                   "--job-name=distlab-run-x", "--kill-on-bad-exit=1", "--cpus-per-task=8"]:
        assert option in cmd


def write_config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "distlab.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_settings_come_from_the_nearest_distlab_toml_and_the_environment_wins(clean_env, tmp_path, monkeypatch):
    write_config(tmp_path / "repo", """
        [slurm]
        account = "proj"
        modules = ["GCC", "Python"]
        nodes = 2
        queue_timeout = 60
        """)
    chapter = tmp_path / "repo" / "book" / "01-data-loading"
    chapter.mkdir(parents=True)
    monkeypatch.chdir(chapter)  # a notebook inside the book finds the repository's file
    config, sources = slurm_config.load_with_sources()
    assert (config.account, config.modules, config.nodes, config.queue_timeout) == ("proj", ["GCC", "Python"], 2, 60.0)
    assert config.partition == "" and sources["partition"] == "default"
    assert sources["account"].endswith("distlab.toml")
    monkeypatch.setenv("DISTLAB_SLURM_NODES", "4")
    monkeypatch.setenv("DISTLAB_SLURM_MODULES", "Stages/2025 CUDA")
    monkeypatch.setenv("DISTLAB_SLURM_OFFLINE", "no")
    config, sources = slurm_config.load_with_sources()
    assert (config.nodes, config.modules, config.offline) == (4, ["Stages/2025", "CUDA"], False)
    assert sources["nodes"] == "$DISTLAB_SLURM_NODES"
    # DISTLAB_CONFIG names the file outright.
    other = write_config(tmp_path / "elsewhere", '[slurm]\npartition = "gpu"\n')
    monkeypatch.setenv("DISTLAB_CONFIG", str(other))
    assert slurm_config.load().partition == "gpu"


@pytest.mark.parametrize("text, env, message", [
    ('[slurm]\nacount = "x"\n', {}, r"unknown key\(s\) \['acount'\]"),
    ('[slurm]\nnodes = "two"\n', {}, r"\[slurm\] nodes: expected int, got 'two'"),
    ('[slurm]\nmodules = "GCC"\n', {}, r"modules: expected a list of strings"),
    ('[slurm]\nnodes = 0\n', {}, r"nodes must be at least 1"),
    ('[slurm\n', {}, r"not valid TOML"),
    ("", {"DISTLAB_SLURM_NODES": "two"}, r"\$DISTLAB_SLURM_NODES='two': expected int"),
    ("", {"DISTLAB_SLURM_PARTITON": "gpu"}, r"unknown setting \$DISTLAB_SLURM_PARTITON"),
    ("", {"DISTLAB_SLURM_OFFLINE": "maybe"}, r"DISTLAB_SLURM_OFFLINE='maybe': expected bool"),
])
def test_bad_settings_fail_with_the_place_to_fix_them(clean_env, tmp_path, monkeypatch, text, env, message):
    write_config(tmp_path, text)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        slurm_config.load()


def test_job_script_has_the_settings_the_offline_caches_and_srun_torchrun(clean_env, tmp_path):
    write_config(tmp_path, """
        [slurm]
        account = "proj"
        partition = "booster"
        gpus_per_node = 4
        cpus_per_task = 32
        modules = ["Stages/2025", "Python"]
        activate = "source $HOME/venv/bin/activate"
        hostname_suffix = "i"
        sbatch_options = ["--reservation=course"]
        """)
    config = slurm_config.load()
    text = script.job_script(config, nodes=2, nproc_per_node=4, target=["train.py", "--epochs", "3"],
                            job_name="train", time_limit="30", output="out-%j.txt")
    for line in ["#SBATCH --account=proj", "#SBATCH --partition=booster", "#SBATCH --gres=gpu:4",
                 "#SBATCH --cpus-per-task=32", "#SBATCH --nodes=2", "#SBATCH --time=30",
                 "#SBATCH --reservation=course", "#SBATCH --output=out-%j.txt",
                 "module load Stages/2025 Python", "source $HOME/venv/bin/activate",
                 "export HF_DATASETS_OFFLINE=1", "export HF_HUB_OFFLINE=1",
                 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
                 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)i"',
                 'if [ "$SLURM_NNODES" -eq 1 ]; then', "    MASTER_ADDR=127.0.0.1",   # one node: its own network
                 "srun --kill-on-bad-exit=1",
                 "exec python -m distlab.runtime.private_network --one-node -- python -m torch.distributed.run",
                 "--nproc-per-node=4", "train.py --epochs 3"]:
        assert line in text, line
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=10)
    assert syntax.returncode == 0, syntax.stderr


def test_a_job_scripts_torchrun_gets_a_network_of_its_own_on_one_node_only(tmp_path):
    """``private_network --one-node`` (the job script's torchrun line): a new network namespace
    where the step runs on one node, the node's own on several (they need it between them);
    the hosts file it shows as /etc/hosts leaves nothing behind in the temporary folder."""
    def network_of(nnodes: str) -> tuple[str, str]:
        env = dict(os.environ, SLURM_NNODES=nnodes, TMPDIR=str(tmp_path))
        env.pop("DISTLAB_PRIVATE_NETWORK", None)
        out = subprocess.run([sys.executable, "-m", "distlab.runtime.private_network", "--one-node", "--",
                              "bash", "-c", "readlink /proc/self/ns/net; grep -c '^::ffff:127.0.0.1 localhost' /etc/hosts"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode in (0, 1), out.stderr   # grep: 1 where no line matched
        return tuple(out.stdout.split())

    ours = os.readlink("/proc/self/ns/net")
    assert network_of("2") == (ours, "0")
    alone, hosts_lines = network_of("1")
    assert alone != ours and hosts_lines == "1"
    assert list(tmp_path.iterdir()) == []


def test_the_job_scripts_rendezvous_port_is_free_and_outside_the_ports_linux_hands_out():
    """The port is drawn below Linux's ephemeral range: one the kernel picked (``bind`` to
    port 0) and let go was once given to another process before torchrun listened on it, and
    a batch job failed with EADDRINUSE on a busy machine. A port in use is skipped."""
    def drawn(ports=commands.PORT_RANGE) -> int:
        lines = script.free_port_lines(sys.executable, ports)
        shell = "\n".join(lines) + '\necho "$MASTER_PORT"\n'
        out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60, check=True)
        return int(out.stdout)

    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(5):
        port = drawn()
        assert commands.PORT_RANGE[0] <= port < commands.PORT_RANGE[1] and not low <= port <= high, port
    for busy in range(*commands.PORT_RANGE):   # two neighbours free now: hold the first
        held, neighbour = socket.socket(), socket.socket()
        try:
            held.bind(("", busy))
            neighbour.bind(("", busy + 1))
        except OSError:
            held.close()
            continue
        finally:
            neighbour.close()
        break
    with held:
        held.listen()
        assert {drawn((busy, busy + 2)) for _ in range(5)} == {busy + 1}


def test_the_checked_in_template_is_what_the_installed_command_writes(clean_env):
    # templates/slurm/train-2-nodes.sbatch is for reading and copying; it must not drift from
    # the code. Regenerate it with the command in templates/slurm/README.md (this one).
    command = Path(sys.executable).with_name("distlab-slurm")
    env = dict(os.environ, DISTLAB_CONFIG=str(REPO / "templates" / "slurm" / "distlab.toml"))
    out = subprocess.run([str(command), "script", "--nodes", "2", "--time", "1:00:00", "--", "train.py", "--epochs", "3"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "templates" / "slurm" / "train-2-nodes.sbatch").read_text()


def test_a_bad_setting_is_one_line_from_the_command(clean_env, tmp_path):
    (tmp_path / "distlab.toml").write_text("[slurm]\nnodes = 0\n")
    out = subprocess.run([str(Path(sys.executable).with_name("distlab-slurm")), "config"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 1 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr, out.stderr


def test_srun_outside_an_allocation_is_a_clear_error(clean_env):
    with pytest.raises(ValueError, match="needs a Slurm allocation.*launcher='sbatch'"):
        distlab.run(lambda: 1, nprocs=2, launcher="srun")


def test_a_pool_cannot_be_a_batch_job(clean_env):
    with pytest.raises(ValueError, match="Pool keeps its ranks.*needs an allocation"):
        distlab.Pool(nprocs=2, launcher="sbatch").start()


# ---- on a real Slurm cluster ---------------------------------------------------------------------

def test_a_cluster_directory_too_deep_for_slurmstepd_sockets_is_refused_by_name(tmp_path):
    deep = tmp_path / ("d" * 100)
    with pytest.raises(slurm_cluster.ClusterError, match="too deep.*107-byte"):
        slurm_cluster.check_socket_paths(deep)
    ours = Path("/tmp/distlab-tests-abcdefgh/gw1-abcdefgh/slurm-abcdefgh/cluster")  # under an xdist worker
    slurm_cluster.check_socket_paths(ours)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_started_by_hand_the_cluster_removes_its_folder_when_stopped(tmp_path):
    """`python scripts/slurm_cluster.py DIR`, then Ctrl-C, as the guides show: nothing is left,
    neither a daemon nor the folder it made (a folder that was there before is kept)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-")) / "by-hand"  # short: slurmstepd's socket paths
    with open(tmp_path / "out.log", "wb") as out:
        by_hand = subprocess.Popen([sys.executable, slurm_cluster.__file__, str(root)], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ctrl-C stops it" not in (tmp_path / "out.log").read_text():
            assert by_hand.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
            time.sleep(0.2)
        daemons = psutil.Process(by_hand.pid).children(recursive=True)
        assert {d.name() for d in daemons} >= {"munged", "slurmctld", "slurmd"}
        network = json.loads((root / "ready.json").read_text())["network"]
        assert _link_exists(network["host_interface"])
        by_hand.send_signal(signal.SIGINT)
        assert by_hand.wait(timeout=60) == 0, (tmp_path / "out.log").read_text()
    finally:
        if by_hand.poll() is None:
            os.killpg(by_hand.pid, signal.SIGKILL)
    assert not root.exists(), sorted(str(p) for p in root.rglob("*"))[:10]
    assert not [d for d in daemons if d.is_running() and d.status() != psutil.STATUS_ZOMBIE]
    assert not _link_exists(network["host_interface"])  # the namespaces and the bridge went with it


def _link_exists(interface: str | None) -> bool:
    return interface is not None and Path("/sys/class/net", interface).exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_cluster_leaves_no_daemon_namespace_or_interface_behind(tmp_path):
    """SIGKILL of the supervisor (no teardown runs): the kernel ends the daemons and the holders of
    the namespaces (they die with their parent), and so the nodes' interfaces and addresses."""
    root = Path(tempfile.mkdtemp(prefix="slurm-")) / "killed"
    with open(tmp_path / "out.log", "wb") as out:
        supervisor = subprocess.Popen([sys.executable, slurm_cluster.__file__, "--keep", str(root)], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (root / "ready.json").exists():
            assert supervisor.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
            time.sleep(0.2)
        network = json.loads((root / "ready.json").read_text())["network"]
        _namespaced({"network": network})
        below = psutil.Process(supervisor.pid).children(recursive=True)
        assert _link_exists(network["host_interface"])
    finally:
        supervisor.kill()   # only the supervisor: what is below it must go by itself
        supervisor.wait(timeout=10)
    gone_by = time.monotonic() + 15
    while time.monotonic() < gone_by and (_link_exists(network["host_interface"]) or
                                          [p for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]):
        time.sleep(0.2)
    assert not [p.pid for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not _link_exists(network["host_interface"])


def _client(args: list[str]) -> str:
    """A Slurm client command against the test cluster (SLURM_CONF is set), with a timeout."""
    out = subprocess.run(args, capture_output=True, text=True, timeout=CLIENT_TIMEOUT)
    return out.stdout


def _jobs() -> list[str]:
    return _client(["squeue", "--noheader", "--format=%i %T"]).split("\n")[:-1]


@pytest.fixture(scope="module")
def cluster():
    """Start the private two-node cluster once for this module; tear it down by pid afterwards."""
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # under the test session's folder; kept short:
    # slurmstepd's sockets live below it, and a Unix socket path has at most 107 bytes
    try:
        with slurm_cluster.running_cluster(root / "cluster") as info:
            (root / "distlab.toml").write_text("# empty: the tests set what they need through DISTLAB_SLURM_*\n")
            with pytest.MonkeyPatch.context() as mp:
                for name in list(os.environ):
                    if name.startswith(("SLURM_", "DISTLAB_SLURM_")):
                        mp.delenv(name)
                mp.setenv("SLURM_CONF", info["slurm_conf"])
                mp.setenv("DISTLAB_CONFIG", str(root / "distlab.toml"))
                mp.setenv("DISTLAB_SLURM_RUN_ROOT", str(root / "runs"))
                mp.setenv("DISTLAB_SLURM_POLL_SECONDS", "0.5")
                mp.delenv("DISTLAB_LAUNCHER", raising=False)
                yield {**info, "root": root}
    except slurm_cluster.ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _job_processes(cluster: dict) -> list[psutil.Process]:
    """Processes below the cluster's supervisor that are not its daemons nor the holders of its
    nodes' namespaces (slurmstepd, ranks)."""
    network = cluster.get("network", {})
    holders = {network.get("switch_pid"), *network.get("node_pids", {}).values()}
    try:
        below = psutil.Process(cluster["supervisor"]).children(recursive=True)
    except psutil.Error:
        return []
    left = []
    for proc in below:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.pid not in holders and \
                    proc.name() not in ("munged", "slurmctld", "slurmscriptd", "slurmd"):
                left.append(proc)
        except psutil.Error:
            continue
    return left


@pytest.fixture
def slurm_env(cluster, monkeypatch):
    """The cluster, and after the test: no job left in the queue, no process of any job left."""
    yield cluster
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_jobs_active() or _job_processes(cluster)
                                           or _processes_mentioning(str(cluster["root"] / "runs"))):
        time.sleep(0.2)
    active, procs = _jobs_active(), _job_processes(cluster)
    procs += _processes_mentioning(str(cluster["root"] / "runs"))
    if active:
        _client(["scancel", "--user", str(os.getuid())])
    assert not active, f"jobs left in the queue: {active}"
    assert not procs, "processes left behind: " + "; ".join(f"{p.pid} {' '.join(p.cmdline())}" for p in procs)


def _jobs_active() -> list[str]:
    return [line for line in _jobs() if line.split()[1] in commands.ACTIVE_STATES]


def _salloc_python(tmp_path: Path, code: str, nodes: int, minutes: int = 5, timeout: float = 120,
                   background: bool = False):
    """Run a Python script inside ``salloc``, as a user in an allocation's shell would."""
    script = tmp_path / "in_allocation.py"
    script.write_text(textwrap.dedent(code))
    cmd = ["salloc", f"--nodes={nodes}", f"--time={minutes}", "--job-name=salloc-test",
           sys.executable, str(script)]
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# The function that both 2x2 tests run: who am I, where, and which rendezvous did torchrun use.
WHO_AM_I = """
import json, os, sys
import psutil, torch, torch.distributed as dist
import distlab

def who_am_i(offset):
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    torchrun = " ".join(psutil.Process().parent().cmdline())
    endpoint = next(a.split("=", 1)[1] for a in torchrun.split() if a.startswith("--rdzv-endpoint="))
    print(f"rank {dist.get_rank()} on {os.environ['SLURMD_NODENAME']}", flush=True)
    return {"rank": dist.get_rank() + offset, "world": dist.get_world_size(),
            "node": os.environ["SLURMD_NODENAME"], "local_rank": int(os.environ["LOCAL_RANK"]),
            "sum": total.item(), "endpoint": endpoint, "account": os.environ.get("SLURM_JOB_ACCOUNT"),
            "offline": os.environ.get("HF_HUB_OFFLINE")}
"""


def _check_two_by_two(results, offset=0):
    assert [r["rank"] for r in results] == [offset + k for k in range(4)]
    assert all(r["world"] == 4 and r["sum"] == 6.0 for r in results)  # 0+1+2+3 through all_reduce
    by_node = {}
    for r in results:
        by_node.setdefault(r["node"], []).append(r["local_rank"])
    assert sorted(by_node) == ["distlab-n1", "distlab-n2"], by_node
    assert all(sorted(ranks) == [0, 1] for ranks in by_node.values()), by_node
    # The rendezvous is on the first node, reached under its interconnect name (suffix "i").
    assert {r["endpoint"].rsplit(":", 1)[0] for r in results} == {"distlab-n1i"}


@pytest.mark.slow
def test_srun_inside_salloc_runs_two_nodes_times_two_ranks(slurm_env, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_SLURM_HOSTNAME_SUFFIX", "i")
    out = _salloc_python(tmp_path, WHO_AM_I + """
        print("launcher:", distlab.runtime.launchers.choose("auto").__name__)
        print("RESULT " + json.dumps(distlab.run(who_am_i, 10, nprocs=4, timeout=90)))
        with distlab.Pool(nprocs=4) as pool:  # warm ranks, started once through the same srun
            print("POOL " + json.dumps([pool.run(who_am_i, k, timeout=60) for k in (20, 30)]))
        """.replace("\n        ", "\n"), nodes=2)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "launcher: SrunJob" in out.stdout
    results = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
    _check_two_by_two(results, offset=10)
    first, second = json.loads(out.stdout.split("POOL ", 1)[1].splitlines()[0])
    _check_two_by_two(first, offset=20)
    _check_two_by_two(second, offset=30)
    for k in range(4):  # each rank's output streamed with its prefix
        assert re.search(rf"^\[rank {k}\] rank {k} on distlab-n[12]$", out.stdout, flags=re.M)
    assert not list((slurm_env["root"] / "runs").glob("run-*")), "the run directory was not removed"


@pytest.mark.slow
def test_sbatch_from_outside_runs_two_nodes_times_two_ranks_and_shows_the_queue(slurm_env, monkeypatch, capsys):
    monkeypatch.setenv("DISTLAB_SLURM_NODES", "2")
    monkeypatch.setenv("DISTLAB_SLURM_HOSTNAME_SUFFIX", "i")
    monkeypatch.setenv("DISTLAB_SLURM_ACCOUNT", "course42")
    namespace: dict = {"__name__": "who_am_i_script"}
    exec(WHO_AM_I, namespace)
    assert launchers.choose("auto") is LocalJob  # outside any allocation
    results = distlab.run(namespace["who_am_i"], 0, nprocs=4, timeout=90, launcher="sbatch")
    _check_two_by_two(results)
    assert {r["account"] for r in results} == {"course42"}  # the setting reached sbatch
    assert {r["offline"] for r in results} == {"1"}  # compute nodes: no downloads
    out = capsys.readouterr().out
    job = re.search(r"\[slurm\] job (\d+) submitted: 2 node\(s\) x 2 rank\(s\)", out)
    assert job, out
    states = re.findall(rf"\[slurm\] job {job.group(1)}: (\w+)", out)
    assert "RUNNING" in states and states[-1] == "COMPLETED", out  # pending -> running -> done
    assert states.index("RUNNING") < states.index("COMPLETED")
    for k in range(4):
        assert re.search(rf"^\[rank {k}\] rank {k} on distlab-n[12]$", out, flags=re.M)
    assert not list((slurm_env["root"] / "runs").glob("run-*")), "the run directory was not removed"


def _namespaced(cluster: dict) -> dict:
    """The cluster's network, which must be nodes in namespaces of their own on this machine (root)."""
    network = cluster["network"]
    refused = cluster_network.namespaces_allowed()
    if refused:
        pytest.fail(f"this test needs the namespaced cluster, and {refused}", pytrace=False)
    if network["mode"] != "namespaces":
        pytest.fail(f"this test needs the namespaced cluster; this one shares the loopback ({network.get('why')})",
                    pytrace=False)
    return network


# Run through srun in an allocation of both nodes, one rank on each.
ACROSS_NODES = """
import json, os, socket
import torch, torch.distributed as dist
import distlab
from distlab.runtime.launchers.slurm import interconnect

def addresses(elements):
    data = torch.ones(elements)
    dist.all_reduce(data)
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    return {"node": os.environ["SLURMD_NODENAME"], "host": socket.gethostname(), "gloo": interface,
            "nccl": os.environ.get("NCCL_SOCKET_IFNAME"), "address": interconnect.interface_address(interface),
            "master": os.environ["MASTER_ADDR"], "sum": data.sum().item()}

def dial_loopback():
    \"\"\"Rank 0 listens on its node's 127.0.0.1, rank 1 dials 127.0.0.1 at that port: the bug.\"\"\"
    port = torch.zeros(1, dtype=torch.int64)
    server = None
    if dist.get_rank() == 0:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port[0] = server.getsockname()[1]
    dist.broadcast(port, 0)
    outcome = "listened on 127.0.0.1"
    if dist.get_rank() == 1:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
            outcome = "connected"
        except OSError as exc:
            outcome = type(exc).__name__
    dist.barrier()
    return outcome
"""


@pytest.mark.slow
def test_ranks_on_two_nodes_meet_at_node_addresses_and_talk_over_the_bridge(slurm_env, tmp_path):
    network = _namespaced(slurm_env)
    port = network["switch_ports"]["distlab-n2"]
    before = cluster_network.port_bytes(network["switch_pid"], port)
    elements = 1_000_000  # 4 MB of float32 per rank
    out = _salloc_python(tmp_path, ACROSS_NODES + f"""
        print("RESULT " + json.dumps(distlab.run(addresses, {elements}, nprocs=2, timeout=90)))
        """.replace("\n        ", "\n"), nodes=2)
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
    crossed = cluster_network.port_bytes(network["switch_pid"], port) - before
    assert [r["node"] for r in results] == ["distlab-n1", "distlab-n2"]
    assert [r["host"] for r in results] == ["distlab-n1", "distlab-n2"]  # each node is a host of its own
    # Each rank used the interface that reaches the first node, and its address there is its node's.
    assert [r["address"] for r in results] == [network["addresses"]["distlab-n1"], network["addresses"]["distlab-n2"]]
    assert {r["gloo"] for r in results} == {r["nccl"] for r in results} == {network["node_interface"]}
    assert {r["master"] for r in results} <= set(network["addresses"].values())  # an address, never a loopback
    # The single-process sum of ones is the element count; two ranks' all_reduce doubles it, exactly
    # (integers below 2**24 are exact in float32, whatever order gloo adds in).
    assert [r["sum"] for r in results] == [2.0 * elements] * 2
    # Node 2's half of the all_reduce (at least 2 MB: a ring over two ranks sends half the
    # tensor each way) went through the bridge's port of node 2.
    assert crossed >= 2 * elements, f"only {crossed} bytes crossed node 2's port of the bridge"


@pytest.mark.slow
def test_a_rank_that_dials_127_0_0_1_for_another_node_fails_on_the_namespaced_cluster(slurm_env, tmp_path):
    """The class of bug the namespaced cluster exists to catch: on the loopback cluster this connects."""
    _namespaced(slurm_env)
    out = _salloc_python(tmp_path, ACROSS_NODES + """
        print("RESULT " + json.dumps(distlab.run(dial_loopback, nprocs=2, timeout=90)))
        """.replace("\n        ", "\n"), nodes=2)
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert results == ["listened on 127.0.0.1", "ConnectionRefusedError"], results


def run_job_script(folder: Path, ranks_per_node: int, target: list[str], seconds: float) -> str:
    """Write the job script for ``target`` with the installed command (2 nodes), ``sbatch`` it
    from ``folder`` as a user would, wait until the job has left the queue; return its output."""
    generated = subprocess.run(
        [sys.executable, "-m", "distlab.runtime.launchers.slurm", "script", "--nodes", "2", "--ranks-per-node",
         str(ranks_per_node), "--time", "5", "--output", str(folder / "train-%j.out"), "--", *target],
        capture_output=True, text=True, timeout=30, cwd=folder)
    assert generated.returncode == 0, generated.stderr
    (folder / "train.sbatch").write_text(generated.stdout)
    submitted = subprocess.run(["sbatch", "--parsable", str(folder / "train.sbatch")],
                               capture_output=True, text=True, timeout=CLIENT_TIMEOUT, cwd=folder)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    queued = QueuedJob(job_id, poll_seconds=0.5)
    deadline = time.monotonic() + seconds
    while (queued.refresh(force=True), queued.active)[1]:
        assert time.monotonic() < deadline, f"job {job_id} still {queued.state} after {seconds:g} s"
        time.sleep(0.5)
    return (folder / f"train-{job_id}.out").read_text()


@pytest.mark.slow
def test_the_job_script_template_runs_a_training_script_on_two_nodes(slurm_env, tmp_path):
    output = run_job_script(tmp_path, 2, [str(REPO / "tests" / "runtime" / "slurm_train.py"), "--steps", "3"], 90)
    assert "RESULT " in output, output
    seen = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    assert [s["rank"] for s in seen] == [0, 1, 2, 3] and {s["world"] for s in seen} == {4}
    assert sorted({s["node"] for s in seen}) == ["distlab-n1", "distlab-n2"]
    assert len({s["checksum"] for s in seen}) == 1  # DDP kept the replicas identical
    assert {s["offline"] for s in seen} == {"1"}


@pytest.mark.slow
def test_the_complete_training_script_trains_on_two_nodes_and_checkpoints(slurm_env, tmp_path):
    """templates/train.py (book/appendices/training-script.md) as the Slurm appendix submits it."""
    output = run_job_script(tmp_path, 1, [
        str(REPO / "templates" / "train.py"), "--epochs", "1", "--steps-per-epoch", "3", "--validation-steps", "2",
        "--global-batch", "8", "--checkpoint-dir", str(tmp_path / "checkpoints")], 180)
    assert "2 rank(s) on cpu (gloo)" in output and output.count("epoch 0: train loss") == 1, output
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["epoch"] == 0
    assert (tmp_path / "checkpoints" / "epoch-0" / "full.pt").stat().st_size > 0


def _sleeper():
    import time as _time

    print("working", flush=True)
    _time.sleep(300)


def _fails_on_rank_3():
    import torch.distributed as dist

    if dist.get_rank() == 3:
        raise ValueError("bad shard on rank 3")
    dist.barrier()  # the others wait for rank 3, as in a real collective
    return dist.get_rank()


@pytest.mark.slow
def test_a_rank_that_raises_in_a_batch_job_is_a_rank_error_and_the_job_is_cancelled(slurm_env, monkeypatch, capsys):
    monkeypatch.setenv("DISTLAB_SLURM_NODES", "2")
    started = time.monotonic()
    with pytest.raises(RankError) as info:
        distlab.run(_fails_on_rank_3, nprocs=4, timeout=90, launcher="sbatch")
    assert info.value.rank == 3 and info.value.exc_type == "ValueError"
    assert "bad shard on rank 3" in str(info.value)
    # The failed rank waits 30 s to be stopped; we cancel the job instead: its state is
    # CANCELLED, not COMPLETED or FAILED as it would be had we waited for the rank to exit.
    # (No wall-clock bound here: with the hub's browser tests beside it on 2 cores, starting
    # 4 ranks alone took 30 s.)
    assert re.search(r"\[slurm\] job \d+: CANCELLED", capsys.readouterr().out)
    assert time.monotonic() - started < 90


@pytest.mark.slow
def test_the_timeout_of_a_batch_job_is_a_dist_timeout_naming_what_ranks_do(slurm_env, monkeypatch):
    with pytest.raises(distlab.DistTimeout) as info:
        distlab.run(_sleeper, nprocs=2, timeout=12, launcher="sbatch")
    assert set(info.value.rank_states) == {0, 1}
    assert all("user code" in s for s in info.value.rank_states.values()), info.value.rank_states


def _when_ranks_work(runs: Path, count: int, then, seconds: float = 60) -> threading.Thread:
    """In the background: once ``count`` ranks under ``runs`` are in user code, call ``then()``."""
    earlier = set(runs.glob("run-*"))  # kept from failed runs of earlier tests

    def watch():
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            working = [p for p in runs.glob("run-*/state-*.json")
                       if p.parent not in earlier and '"user"' in p.read_text(errors="replace")]
            if len(working) >= count:
                then()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_scancel_of_a_batch_job_is_a_clear_error(slurm_env, monkeypatch):
    def cancel_the_job():
        for line in _jobs():
            _client(["scancel", line.split()[0]])

    watcher = _when_ranks_work(slurm_env["root"] / "runs", 2, cancel_the_job)
    with pytest.raises(SlurmJobError) as info:
        distlab.run(_sleeper, nprocs=2, timeout=90, launcher="sbatch")
    watcher.join(timeout=5)
    assert info.value.state == "CANCELLED"
    message = str(info.value)
    assert "was cancelled (scancel" in message and "before ranks [0, 1] returned" in message
    assert "rank 0: in user code" in message


def sleeper_in_an_allocation(timeout: float) -> str:
    """A script for _salloc_python: one distlab.run of a sleeper, and the error it ends with, printed."""
    return f"""
        import time, distlab
        def sleeper():
            time.sleep(300)
        try:
            distlab.run(sleeper, nprocs=2, timeout={timeout})
        except Exception as exc:
            print("ERROR", type(exc).__name__, getattr(exc, "state", None))
            print(exc)
        """


@pytest.mark.slow
def test_scancel_of_an_srun_step_is_a_clear_error(slurm_env, tmp_path):
    def cancel_the_step():
        for line in _client(["squeue", "--steps", "--noheader", "--format=%i %j"]).splitlines():
            step_id, name = line.split()
            if name.startswith("distlab-run-"):
                _client(["scancel", step_id])

    watcher = _when_ranks_work(slurm_env["root"] / "runs", 2, cancel_the_step)
    out = _salloc_python(tmp_path, sleeper_in_an_allocation(timeout=90), nodes=2)
    watcher.join(timeout=5)
    assert "ERROR SlurmJobError CANCELLED" in out.stdout, out.stdout + out.stderr
    assert "was cancelled (scancel" in out.stdout


@pytest.mark.slow
def test_the_time_limit_ends_batch_jobs_and_allocations_with_a_clear_error(slurm_env, tmp_path, monkeypatch):
    # Slurm enforces --time only every ~30 s and counts in whole minutes: this takes 60-95 s,
    # so both launchers wait for their limit side by side.
    allocation = _salloc_python(tmp_path, sleeper_in_an_allocation(timeout=170), nodes=1, minutes=1, background=True)
    try:
        monkeypatch.setenv("DISTLAB_SLURM_TIME", "1")
        with pytest.raises(SlurmJobError) as info:
            distlab.run(_sleeper, nprocs=2, timeout=170, launcher="sbatch")
        assert info.value.state == "TIMEOUT"
        assert "reached its time limit" in str(info.value) and "DUE TO TIME LIMIT" in str(info.value)
        out, _ = allocation.communicate(timeout=120)
    finally:
        if allocation.poll() is None:
            allocation.kill()
            allocation.wait(timeout=10)
    assert "ERROR SlurmJobError TIMEOUT" in out, out
    assert "reached its time limit" in out


@pytest.mark.slow
def test_a_job_slurm_refuses_is_a_clear_error(slurm_env, monkeypatch):
    monkeypatch.setenv("DISTLAB_SLURM_PARTITION", "nosuchpartition")
    runs = slurm_env["root"] / "runs"
    earlier = set(runs.glob("run-*"))  # kept from failed runs of earlier tests
    with pytest.raises(SlurmJobError, match=r"(?s)sbatch refused the job: .*invalid partition.*partition='nosuchpartition'"):
        distlab.run(lambda: 1, nprocs=2, launcher="sbatch")
    assert set(runs.glob("run-*")) == earlier, "the refused run's directory was left behind"


def test_another_account_sees_none_of_a_users_jobs(slurm_env, tmp_path):
    """PrivateData=jobs,usage,users (issue 44): a job of one account (root's here) is missing
    from another account's squeue and scontrol, which still answer (nobody, with the cluster's
    folder searchable for the length of the test, as the course hub makes it)."""
    # the cluster's folder (and the test session's folders above it), searchable by all while the test runs
    folders = [Path(slurm_env["slurm_conf"]).parent, *Path(slurm_env["slurm_conf"]).parent.parents][:-1]
    modes = {folder: folder.stat().st_mode for folder in folders}
    for folder, mode in modes.items():
        folder.chmod(mode | 0o001)
    job = _client(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 120"]).strip()
    try:
        assert job and job in _client(["squeue", "--noheader", "--format=%i"])   # its owner sees it

        def as_nobody(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args],
                                  capture_output=True, text=True, timeout=CLIENT_TIMEOUT, cwd="/")

        queue = as_nobody("squeue", "--format=%i %u")
        assert queue.returncode == 0 and queue.stdout.split() == ["JOBID", "USER"], queue   # answers, and empty
        shown = as_nobody("scontrol", "show", "job", job)
        assert "UserId=" not in shown.stdout and "Command=" not in shown.stdout, shown.stdout
        everything = as_nobody("scontrol", "show", "jobs")
        assert everything.returncode == 0 and f"JobId={job}" not in everything.stdout, everything
    finally:
        _client(["scancel", job])
        for folder, mode in modes.items():
            folder.chmod(mode)


def test_a_process_that_leaves_its_jobs_session_still_ends_with_the_job(slurm_env):
    """Where the machine has cgroup v1 (this one does), the cluster tracks each job's processes in
    a control group of the job (proctrack/cgroup, task/cgroup): a process that leaves the job's
    process tree (a new session, its parent gone) still ends with the job, which it did not when
    Slurm followed the process tree (linuxproc). Elsewhere the configuration says linuxproc."""
    conf = Path(slurm_env["slurm_conf"]).read_text()
    if not all(os.access(f"/sys/fs/cgroup/{c}/cgroup.procs", os.W_OK) for c in slurm_cluster.CGROUP_V1_CONTROLLERS):
        assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
        assert not (Path(slurm_env["slurm_conf"]).parent / "cgroup.conf").exists()
        return
    assert "ProctrackType=proctrack/cgroup" in conf and "TaskPlugin=task/cgroup" in conf
    seconds = f"3000.{time.monotonic_ns() % 10**6:06d}"   # names the escapee among all processes
    escape = f"setsid sleep {seconds} </dev/null >/dev/null 2>&1 & " + \
             'g=$(grep ":freezer:" /proc/self/cgroup | cut -d: -f3); echo "$g"'
    out = subprocess.run(["srun", "--nodes=1", "--ntasks=1", "sh", "-c", escape],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"/slurm_distlab-n\d/uid_\d+/job_\d+/step_\d+", out.stdout.strip()), out.stdout

    def escapees() -> list[psutil.Process]:
        return [p for p in _processes_mentioning(f"sleep {seconds}") if p.info["cmdline"][:1] == ["sleep"]]

    deadline = time.monotonic() + 20
    while escapees() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = escapees()
    for proc in left:
        proc.kill()
    assert not left, "a process that left its job's session outlived the job"


from eavesdrop import BUSY_RANKS  # noqa: E402 - beside the program that uses it

ONE_NODE_RUN = """
import json, time
import distlab
from distlab.runtime import launchers

""" + BUSY_RANKS + """
print("launcher:", launchers.choose("auto").__name__)
print("RESULT " + json.dumps(distlab.run(busy, 15, nprocs=2, timeout=180)))
"""


def _student_run_beside_a_second_account(slurm_env, tag: str, command: list[str], launcher: str) -> None:
    """A student account runs ``command`` (ONE_NODE_RUN, in salloc or not) while a second account
    tries every port the student listens on as the run's rendezvous store (write a key) and sends
    junk to each: no store is reached, the result is right, ``launcher`` started the ranks."""
    from eavesdrop import intrude_on_ranks
    from hub_support import accounts, course_name

    course = course_name(tag)
    folders = [Path(slurm_env["slurm_conf"]).parent, *Path(slurm_env["slurm_conf"]).parent.parents][:-1]
    modes = {folder: folder.stat().st_mode for folder in folders}
    try:
        for folder, mode in modes.items():   # the cluster's configuration, readable by the student
            folder.chmod(mode | 0o001)
        (student,) = accounts.create_accounts(course, students=1, instructors=0)
        import pwd

        account = pwd.getpwnam(student)
        home = Path(account.pw_dir)
        (home / "distlab.toml").write_text("")
        os.chown(home / "distlab.toml", account.pw_uid, account.pw_gid)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "SLURM_CONF": slurm_env["slurm_conf"],
               "DISTLAB_CONFIG": str(home / "distlab.toml"), "DISTLAB_SLURM_RUN_ROOT": str(home / "runs"),
               "DISTLAB_SLURM_POLL_SECONDS": "0.5"}
        if launcher == "sbatch":   # outside an allocation "auto" is the local launcher
            env["DISTLAB_LAUNCHER"] = "sbatch"
        # the second account on this machine and, where the cluster's nodes are hosts of their
        # own (network namespaces), on each node, where the ranks run
        holders = (slurm_env.get("network") or {}).get("node_pids", {})
        intruders = [intrude_on_ranks(account.pw_uid, seconds=60, enter=place) for place in
                     [[], *(["nsenter", f"--target={pid}", "--net", "--uts", "--mount", "--"] for pid in holders.values())]]
        done = subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups",
                               *command], capture_output=True, text=True, env=env, cwd=home, timeout=300)
        tried = [intruder.communicate(timeout=120) for intruder in intruders]
    finally:
        for folder, mode in modes.items():
            folder.chmod(mode)
        accounts.remove_accounts(course)
    reports = [json.loads(out or "{}") for out, _ in tried]
    assert all(reports), [errors[-3000:] for _, errors in tried]
    report = {"ports": [r["ports"] for r in reports], "junk_sent": [r["junk_sent"] for r in reports],
              "store_written": [written for r in reports for written in r["store_written"]]}
    assert f"launcher: {'SrunJob' if launcher == 'srun' else 'SbatchJob'}" in done.stdout, \
        done.stdout[-3000:] + done.stderr[-3000:]
    assert report["store_written"] == [], report     # the rendezvous store: not reached
    # before: the junk sent to the ranks' ports left a rank blocked in all_reduce until the timeout
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [r[0] for r in results] == [[3.0] * 4] * 2 and all(r[1] > 10 for r in results), results


@pytest.mark.timeout(400)
def test_another_account_on_the_node_cannot_reach_the_store_of_a_one_node_srun_step(slurm_env):
    """Issue 44, for ranks that Slurm starts (a hub notebook's distlab.run is an srun step, even
    with every rank on one node): while a student's run works, a second account tries every
    port the student listens on as the run's rendezvous store (write a key) and sends junk to
    each. The step's ranks are in a network of their own on the node: no store is reached and
    the result is right. (srun's own ports, which the second account also finds, are Slurm's.)"""
    from eavesdrop import python_for_any_account

    _student_run_beside_a_second_account(slurm_env, "dlsn", [
        "salloc", "--nodes=1", "--time=5", "--job-name=one-node-step", python_for_any_account(), "-c", ONE_NODE_RUN],
        "srun")


@pytest.mark.timeout(400)
def test_another_account_on_the_node_cannot_reach_the_store_of_a_one_node_batch_job(slurm_env):
    """The same for a one-node batch job (``launcher="sbatch"`` from outside any allocation, or
    a job script of ``distlab-slurm script`` submitted with ``--nodes=1``): its torchrun and
    ranks start in a network of their own on the node, where the rendezvous is on the loopback.
    Before: the job's rendezvous store listened on the node's address, and the second account
    wrote keys into it."""
    from eavesdrop import python_for_any_account

    _student_run_beside_a_second_account(slurm_env, "dlsb", [python_for_any_account(), "-c", ONE_NODE_RUN], "sbatch")
