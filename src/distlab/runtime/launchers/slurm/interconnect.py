"""Which network interface of this node reaches the first node: what gloo and NCCL must use.

A compute node has several interfaces: the loopback, a management network (often the one its
host name resolves to), the fast interconnect (InfiniBand ``ib0``, or Ethernet under a name
of the centre's choosing). Left to themselves, gloo and NCCL guess: gloo binds to the address
the node's host name resolves to (the loopback when it resolves to 127.0.1.1, as Debian sets
it up), NCCL takes the first interface that is not the loopback. A wrong guess is a run that
hangs while connecting, or one that crawls over the management network.

The kernel already knows the right answer: the interface it would send a packet on to reach
the first node, where the rendezvous is. :func:`route_to` asks it without sending anything
(a UDP socket that is "connected" only picks its route and source address), then finds the
interface that holds that source address. On the first node itself the route goes through the
loopback, but the source address is still the node's address on the interconnect, so the
answer is the same interface on every node.

``python -m distlab.runtime.launchers.slurm.interconnect HOST`` prints ``INTERFACE ADDRESS``;
the line that starts torchrun on each node (:func:`.script.torchrun_on_each_node`) exports
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` from it (unless you set them) and gives the
address to torchrun (``--local-addr``), so the other nodes reach this one at an address, not at
a host name that may resolve differently on each node.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys

_SIOCGIFADDR = 0x8915


class NoRoute(RuntimeError):
    """The host does not resolve, or no interface of this node reaches it."""


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (None if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_holding(address: str) -> str:
    """The interface that has ``address`` (the loopback's for 127.x)."""
    for _, name in socket.if_nameindex():
        if interface_address(name) == address:
            return name
    raise NoRoute(f"no interface of this node holds {address}")


def route_to(host: str, port: int = 9) -> tuple[str, str]:
    """``(interface, address)``: how this node reaches ``host`` (see the module's docstring)."""
    try:
        target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except OSError as exc:
        raise NoRoute(f"{host!r} does not resolve on {socket.gethostname()} ({exc})") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, port))   # picks the route; sends nothing
        except OSError as exc:
            raise NoRoute(f"{socket.gethostname()} has no route to {host} ({target}): {exc}") from None
        source = s.getsockname()[0]
    return interface_holding(source), source


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m distlab.runtime.launchers.slurm.interconnect HOST", file=sys.stderr)
        return 2
    try:
        interface, address = route_to(argv[0])
    except NoRoute as exc:
        print(f"distlab: cannot choose the network interface for the ranks: {exc}", file=sys.stderr)
        return 1
    print(interface, address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
