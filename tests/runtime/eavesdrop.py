"""What a second account on the node can try against a student's kernel and ranks (issue 44).

The attack: a kernel's channels are ZeroMQ sockets. Over TCP, every account on the node sees
their ports in ``/proc/net/tcp`` (its ``uid`` column names the owner), and a ``SUB`` socket
connected to the IOPub port receives everything the kernel publishes (the cells it runs and
what they print): the message key signs messages, it does not hide them. Over Unix sockets
(``ipc``), the socket files' paths are listed in ``/proc/net/unix`` for all to see too, so the
attacker tries those as well; a folder only the owner can enter is what keeps them out.

:func:`eavesdrop` runs :data:`LISTENER` as a numbered account with no name (``setpriv``; the
tests run as root, as ``make test`` does) and reports what it found and what it heard.
Numbered accounts of their own keep the scan off every other service of the machine: only
ports of the victim's account are tried.

:func:`intrude_on_ranks` runs :data:`RANK_INTRUDER` the same way against a running
``distlab.run``: every port the victim's account listens on (torch's rendezvous store, gloo's
connections) is tried as a ``TCPStore`` (write a key, count the keys) and sent bytes of junk.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ATTACKER_UID = 64_801
"""The second account on the node (no entry in /etc/passwd is needed to run as it)."""
VICTIM_UID = 64_802
"""The account whose kernel is listened to, where a test starts it as an account of its own."""

LISTENER = textwrap.dedent(r'''
    import json, re, socket, sys, time
    import zmq
    victim, seconds = int(sys.argv[1]), float(sys.argv[2])
    endpoints = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            local, state, uid = fields[1], fields[3], int(fields[7])
            if state != "0A" or uid != victim:        # 0A: listening
                continue
            address, port = local.rsplit(":", 1)
            raw = bytes.fromhex(address)
            if family == socket.AF_INET:
                host = socket.inet_ntop(family, raw[::-1])
                host = "127.0.0.1" if host == "0.0.0.0" else host
            else:
                host = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                host = "[::1]" if host == "::" else f"[{host}]"
            endpoints.append(f"tcp://{host}:{int(port, 16)}")
    # ipc: every bound Unix socket's path is public; Jupyter's are named <base>-<number>
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        path = line.split()[-1] if len(line.split()) >= 8 else ""
        if path.startswith("/") and re.search(r"-\d+$", path):
            endpoints.append("ipc://" + path)
    context = zmq.Context()
    poller = zmq.Poller()
    for endpoint in endpoints:
        listener = context.socket(zmq.SUB)
        listener.setsockopt(zmq.SUBSCRIBE, b"")
        listener.setsockopt(zmq.IPV6, 1)
        listener.setsockopt(zmq.LINGER, 0)
        listener.connect(endpoint)
        poller.register(listener, zmq.POLLIN)
    heard = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for listener, _ in poller.poll(100):
            frames = listener.recv_multipart()
            heard.append(b" ".join(frames).decode(errors="replace")[:2000])
    print(json.dumps({"endpoints": endpoints, "heard": heard}))
    sys.stdout.flush()
    import os; os._exit(0)
''')


BUSY_RANKS = """
def busy(seconds):
    import torch, torch.distributed as dist
    end, calls = time.monotonic() + seconds, 0
    while True:
        # the ranks agree when to stop: each one's clock started when it did
        going = torch.tensor([float(time.monotonic() < end)])
        dist.all_reduce(going, op=dist.ReduceOp.MAX)
        if not going.item():
            return total.tolist(), calls
        total = torch.ones(4) * (dist.get_rank() + 1)
        dist.all_reduce(total)
        calls += 1
        time.sleep(0.05)
"""
"""The victim's ranks (source for a program that imports time): all-reduce every 50 ms for
``seconds``, so that a second account has a live store and live gloo ports to go at. They stop
on the same call: a rank that started later, and stopped by its own clock alone, went into
one more all_reduce than the others and waited there until the run's timeout (seen on a busy
machine as "rank 0: blocked in all_reduce", "rank 1: returned")."""


@functools.lru_cache(maxsize=1)
def python_for_any_account() -> str:
    """A Python with the course's packages that any account can run (hub/demo.py's bridge, where
    this one lives in root's home), kept until this process ends."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hub"))
    import demo

    folder = Path(tempfile.mkdtemp(prefix="distlab-any-python-", dir="/tmp"))
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(demo.server_python(Path(sys.prefix), folder))


RANK_INTRUDER = textwrap.dedent(r'''
    import datetime, json, socket, sys, time
    from torch.distributed import TCPStore
    victim, seconds = int(sys.argv[1]), float(sys.argv[2])

    def listening():
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[7]) == victim:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return ports

    found, store_written, junk_sent = set(), [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for port in sorted(listening() - found):   # the ranks' ports come and go: look again and again
            found.add(port)
            try:
                store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=2))
                store.set("intruder", "was here")
                store_written.append([port, store.num_keys()])
            except Exception:
                pass
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as junk:
                    junk.sendall(b"\xff" * 4096)
                    junk_sent.append(port)
            except OSError:
                pass
        time.sleep(0.1)
    print(json.dumps({"ports": sorted(found), "store_written": store_written, "junk_sent": junk_sent}))
''')


def intrude_on_ranks(victim_uid: int, seconds: float, enter: list[str] = ()) -> subprocess.Popen:
    """Start the second account's attempts on ``victim_uid``'s ranks for ``seconds``; its
    ``communicate()`` gives the JSON line of what it found and did. ``enter``: a command that
    puts it on another host first (``nsenter`` into a node of the private Slurm cluster)."""
    command = [*enter, "setpriv", f"--reuid={ATTACKER_UID}", f"--regid={ATTACKER_UID}", "--clear-groups",
               python_for_any_account(), "-c", RANK_INTRUDER, str(victim_uid), str(seconds)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})


def eavesdrop(victim_uid: int, seconds: float = 4.0) -> dict:
    """What the second account finds and hears of ``victim_uid``'s listening sockets in
    ``seconds``: ``{"endpoints": [...], "heard": [...]}``."""
    command = ["setpriv", f"--reuid={ATTACKER_UID}", f"--regid={ATTACKER_UID}", "--clear-groups",
               python_for_any_account(), "-c", LISTENER, str(victim_uid), str(seconds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60 + seconds, cwd="/",
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
