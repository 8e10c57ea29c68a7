"""The private cluster's network: each node a host of its own, on a bridge, as at a centre.

Two "nodes" that share this machine's loopback hide a whole class of bugs: a rank on node 2
reaches node 1's rendezvous on 127.0.0.1 whatever ``MASTER_ADDR`` says, a server bound to
127.0.0.1 answers the hub anyway, gloo picks the loopback and works. So, where Linux lets us
(root, and the ``ip`` command of iproute2), every node runs in namespaces of its own:

* a **network namespace**: its own loopback and one interface, ``icn0`` (an uncommon name on
  purpose: code that assumes ``eth0`` or ``ib0`` fails here as it would at a centre), with its
  own address on a private subnet;
* a **UTS namespace**: its host name is the node's name, as on a real node;
* a **mount namespace** where ``/etc/hosts`` is a file of the cluster's (``DIR/hosts``) that
  names the nodes (and their ``i`` interconnect names) and the controller by those addresses.
  The machine's ``/etc/hosts`` is never written.

The nodes' interfaces are the ends of veth pairs whose other ends are ports of a bridge, and the
bridge lives in a network namespace of its own too (the "switch"); one more veth pair joins the
switch to this machine's namespace, where its end (``dl<id>h``) holds the controller's address,
``.1``: slurmctld, munge, PostgreSQL and the hub stay here and the nodes reach them at that
address. Node-to-node traffic crosses the switch; :func:`port_bytes` reads how much did.

Nothing of it outlives the cluster, even a killed one: the namespaces have no names (nothing
under ``/run/netns``), each is held by a ``sleep`` that the kernel kills when the supervisor
dies (``PR_SET_PDEATHSIG``), and the kernel removes a namespace's interfaces (and with a veth,
its peer, addresses and routes on this machine) once its last process is gone. A cluster that
was killed so hard that a job of its survived keeps only that job's node namespace alive, as it
keeps the job: ending the job ends it.

Names and addresses cannot collide between clusters started at once on one machine: the subnet
is a /24 of 198.18.0.0/15 (the block set aside for network tests, RFC 2544) drawn from a hash of
the cluster's folder, skipping any /24 this machine already routes, and the one name visible on
this machine, ``dl<id>h``, carries the same hash; the other names live in the namespaces.

:func:`choose_mode` says which network a cluster gets: ``DISTLAB_CLUSTER_NETWORK=namespaces``
or ``=loopback`` forces one; unset, namespaces where :func:`namespaces_allowed`, else the old
loopback cluster (every node at 127.0.0.1).
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

MODE_VARIABLE = "DISTLAB_CLUSTER_NETWORK"
SUBNETS = ipaddress.ip_network("198.18.0.0/15")
NODE_INTERFACE = "icn0"
"""The nodes' one interface (an interconnect's, not eth0: nothing may assume its name)."""
IP_TIMEOUT = 10

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
_MS_REC, _MS_SLAVE, _MS_BIND = 16384, 1 << 19, 4096
_PR_SET_PDEATHSIG = 1


class NetworkError(RuntimeError):
    """The namespaces or the bridge could not be made; the message says which command failed."""


def namespaces_allowed() -> str | None:
    """None where this process may make the namespaces and veth pairs, else why not."""
    if os.geteuid() != 0:
        return "not root (a network namespace joined by veth pairs needs CAP_NET_ADMIN on this machine)"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "the `ip` (iproute2) or `nsenter` (util-linux) command is missing"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True,
                           timeout=IP_TIMEOUT)
    if probe.returncode != 0:
        return f"Linux refused new namespaces: {probe.stderr.strip()}"
    return None


def choose_mode(environ=os.environ) -> tuple[str, str]:
    """``("namespaces" | "loopback", why)`` for a cluster started now (see the module's docstring)."""
    asked = environ.get(MODE_VARIABLE, "").strip().lower()
    if asked in ("loopback", "namespaces"):
        return asked, f"{MODE_VARIABLE}={asked}"
    if asked:
        raise NetworkError(f"{MODE_VARIABLE}={asked!r}: use 'namespaces', 'loopback' or leave it unset")
    refused = namespaces_allowed()
    if refused:
        return "loopback", f"namespaces not allowed here: {refused}"
    return "namespaces", "the default where namespaces are allowed"


def cluster_id(root: Path) -> str:
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:6]


def _routed_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True,
                         timeout=IP_TIMEOUT)
    nets = []
    for line in out.stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("local", "broadcast", "unicast") and len(line.split()) > 1:
            first = line.split()[1]
        try:
            nets.append(ipaddress.ip_network(first, strict=False))
        except ValueError:
            continue   # "default", ...
    return [n for n in nets if n.prefixlen > 0]


def pick_subnet(ident: str) -> ipaddress.IPv4Network:
    """A /24 of :data:`SUBNETS` from the cluster's id, skipping those this machine routes."""
    subnets = list(SUBNETS.subnets(new_prefix=24))
    taken = _routed_networks()
    start = int(ident, 16) % len(subnets)
    for step in range(len(subnets)):
        candidate = subnets[(start + step) % len(subnets)]
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise NetworkError(f"every /24 of {SUBNETS} is in use on this machine")


def _ip(*args: str, namespace_pid: int | None = None) -> None:
    cmd = ["ip", *args] if namespace_pid is None else ["nsenter", f"--target={namespace_pid}", "--net", "ip", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT)
    if out.returncode != 0:
        raise NetworkError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()}")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _holder(flags: int, hosts: Path | None = None, hostname: str | None = None):
    """``preexec_fn`` of a ``sleep`` that holds new namespaces and dies with its parent."""
    def enter() -> None:
        _die_with_parent()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if hostname:
            socket.sethostname(hostname)
        if hosts is not None:
            # Mounts made on the machine still reach the node (slave), ours never leave it.
            if libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0 or \
                    libc.mount(str(hosts).encode(), b"/etc/hosts", None, _MS_BIND, None) != 0:
                raise OSError(ctypes.get_errno(), "mount /etc/hosts")
    return enter


class Network:
    """The switch, the nodes' namespaces and their addresses; ``start`` makes them, ``describe``
    says what daemons and tests need, ``run_in`` starts a command in a node's namespaces."""

    def __init__(self, root: Path, nodes: list[str], aliases: dict[str, list[str]], controller: str):
        self.root, self.nodes, self.aliases, self.controller = Path(root), nodes, aliases, controller
        self.ident = cluster_id(root)
        self.host_interface = f"dl{self.ident}h"
        self.subnet = pick_subnet(self.ident)
        hosts = list(self.subnet.hosts())
        self.controller_address = str(hosts[0])
        self.addresses = {node: str(hosts[10 + k]) for k, node in enumerate(nodes)}
        self.holders: dict[str, subprocess.Popen] = {}

    def hosts_text(self) -> str:
        lines = ["# Written by scripts/slurm_cluster.py: /etc/hosts inside this cluster's nodes",
                 "127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 f"{self.controller_address} {self.controller}"]
        lines += [f"{self.addresses[n]} {' '.join([n, *self.aliases.get(n, [])])}" for n in self.nodes]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        hosts = self.root / "hosts"
        hosts.write_text(self.hosts_text())
        sleep = ["sleep", "infinity"]
        self.holders["switch"] = subprocess.Popen(sleep, preexec_fn=_holder(_CLONE_NEWNET))
        for node in self.nodes:
            self.holders[node] = subprocess.Popen(sleep, preexec_fn=_holder(
                _CLONE_NEWNET | _CLONE_NEWUTS | _CLONE_NEWNS, hosts, node))
        switch = self.holders["switch"].pid
        prefix = self.subnet.prefixlen
        _ip("link", "add", "br0", "type", "bridge", namespace_pid=switch)
        _ip("link", "set", "dev", "br0", "up", namespace_pid=switch)
        _ip("link", "add", self.host_interface, "type", "veth", "peer", "name", "ctl", "netns", str(switch))
        _ip("addr", "add", f"{self.controller_address}/{prefix}", "dev", self.host_interface)
        _ip("link", "set", "dev", self.host_interface, "up")
        _ip("link", "set", "dev", "ctl", "master", "br0", "up", namespace_pid=switch)
        for k, node in enumerate(self.nodes):
            port, pid = f"n{k + 1}", self.holders[node].pid
            _ip("link", "add", port, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", str(pid),
                namespace_pid=switch)
            _ip("link", "set", "dev", port, "master", "br0", "up", namespace_pid=switch)
            _ip("link", "set", "dev", "lo", "up", namespace_pid=pid)
            _ip("addr", "add", f"{self.addresses[node]}/{prefix}", "dev", NODE_INTERFACE, namespace_pid=pid)
            _ip("link", "set", "dev", NODE_INTERFACE, "up", namespace_pid=pid)

    def run_in(self, node: str) -> list[str]:
        """The command prefix that runs a program in ``node``'s namespaces (net, UTS, mounts)."""
        return ["nsenter", f"--target={self.holders[node].pid}", "--net", "--uts", "--mount", "--"]

    def describe(self) -> dict:
        return {"mode": "namespaces", "subnet": str(self.subnet), "controller_address": self.controller_address,
                "host_interface": self.host_interface, "node_interface": NODE_INTERFACE,
                "addresses": dict(self.addresses), "switch_pid": self.holders["switch"].pid,
                "node_pids": {n: self.holders[n].pid for n in self.nodes},
                "switch_ports": {n: f"n{k + 1}" for k, n in enumerate(self.nodes)}}

    def stop(self) -> None:
        """Remove the machine's end of the link, then end the holders: the kernel removes the
        namespaces and what is in them. The link goes first and by hand because a namespace is
        torn down later, by a kernel worker: ending its holder alone leaves the machine's end
        visible for a moment after ``stop`` returned (a killed supervisor has to wait for that)."""
        if Path("/sys/class/net", self.host_interface).exists():
            subprocess.run(["ip", "link", "delete", self.host_interface], capture_output=True, timeout=IP_TIMEOUT)
        for holder in self.holders.values():
            if holder.poll() is None:
                holder.kill()
                holder.wait(timeout=5)


def port_bytes(switch_pid: int, port: str) -> int:
    """Bytes received plus sent so far by the switch's ``port`` (from ``/proc/PID/net/dev``)."""
    for line in Path(f"/proc/{switch_pid}/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == port:
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    raise NetworkError(f"the switch has no port {port!r}")


def loopback_description() -> dict:
    return {"mode": "loopback", "controller_address": "127.0.0.1", "addresses": {}}
