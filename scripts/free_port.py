"""A TCP port for a server the tests or the demo course start on this machine (Slurm's daemons,
PostgreSQL, the hub and its proxy).

The port is drawn from 20000-31999 and checked free. Asking the kernel for one (``bind`` to
port 0) and letting it go would hand out a port from Linux's ephemeral range (32768 and up),
which the kernel gives to every outgoing connection and every other ``bind`` to port 0: on a
busy machine (a full test run starts hundreds of ranks, each with its own connections) another
process can be given that port in the moment before the server listens on it, and the server
fails to start with "address already in use". Below 32768 only a program that asks for a
number takes one, and two draws of ours meet with a chance of 1 in 12,000.
"""

from __future__ import annotations

import random
import socket

PORTS = (20000, 32000)
"""Drawn from here: above the well-known services, below the ephemeral range."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port in :data:`PORTS` that nothing on ``host`` listens on or holds now."""
    for port in random.SystemRandom().sample(range(*PORTS), 200):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port among 200 drawn from {PORTS[0]}-{PORTS[1] - 1} on {host}")
