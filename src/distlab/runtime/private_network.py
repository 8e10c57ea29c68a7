"""A network of the run's own: ranks on one machine that no other account can reach.

The ranks of a run talk over TCP on the machine's loopback: torchrun's rendezvous store (a
``TCPStore``, which holds the addresses of every rank and, through the run, whatever torch
keeps there), and gloo's connections between ranks. Neither checks who connects. On a
machine several people share (a node of the course hub, a login node), any account can find
those ports in ``/proc/net/tcp`` (it names each port's owner), write keys into the store,
count them, or send bytes to gloo's sockets, which ends the run or changes what it computes.

Linux lets any account give a process a *network namespace* of its own, inside a *user
namespace* of its own (no privilege needed where unprivileged user namespaces are on, as on
Debian, Ubuntu and most clusters): a separate loopback, reachable by the processes inside it
and by nobody else. :func:`enter` does that, as the last step before the local launcher's
agent (torchrun) starts; every rank is its child and shares it. Inside, the account is the
same (its own uid and gid, mapped to themselves), the files are the same, and the run folder
is shared with the caller as before; only the network is new. A mount namespace comes with
it, for one file: ``/etc/hosts`` gets lines for the loopback's other names (``::1``, and
``::ffff:127.0.0.1``, which a dual-stack socket reports), because torch looks its peers up by
name and, without them, asks DNS, which is out of reach inside and makes torch warn.

Ranks that Slurm starts on one node get the same: a Slurm job step whose ranks all run on one
node (a hub notebook's ``distlab.run`` is one, started with ``srun``) runs its torchrun through
``python -m distlab.runtime.private_network FOLDER -- COMMAND...`` (:func:`main`), which enters a
network of its own on that node, with its hosts file in FOLDER, and becomes COMMAND. A batch
job's script (:func:`distlab.runtime.launchers.slurm.script.job_script`, what ``launcher="sbatch"``
submits and ``distlab-slurm script`` prints) cannot know when it is written how many nodes it
will get (``sbatch --nodes=1`` overrides its ``#SBATCH`` line): it runs torchrun through
``python -m distlab.runtime.private_network --one-node -- COMMAND...``, which enters a network of
its own only where the step runs on one node (``SLURM_NNODES`` is 1), its hosts file in a
private folder removed once it is in place, and otherwise becomes COMMAND as it is.

What stays: a run across several machines needs the real network between its nodes, so there
the store and gloo are reachable by other accounts on those nodes as before (the instructor's
guide says what a centre can do); and where user namespaces are switched off, :func:`enter`
leaves the process as it was and says so once on its error stream.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import socket
import struct
import sys
import tempfile

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
EXTRA_HOSTS = "127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n"
"""Lines added to the machine's /etc/hosts inside (see the module's docstring)."""
ONE_NODE = "--one-node"
""":func:`main`'s option for a batch job's script: a network of its own only on one node."""
VARIABLE = "DISTLAB_PRIVATE_NETWORK"
"""``DISTLAB_PRIVATE_NETWORK=0`` starts the ranks in the network they were started from: the grading
sandbox sets it (its network is private already, and the clean room counts its ranks' bytes there)."""


def wanted() -> bool:
    return os.environ.get(VARIABLE, "1").strip().lower() not in ("0", "no", "off", "false")


def hosts_file(folder: str) -> str:
    """Write the hosts file used inside (the machine's, plus :data:`EXTRA_HOSTS`) into ``folder``."""
    try:
        with open("/etc/hosts") as f:
            machine = f.read()
    except OSError:
        machine = ""
    path = os.path.join(folder, "hosts")
    with open(path, "w") as f:
        f.write(machine.rstrip("\n") + "\n" + EXTRA_HOSTS)
    return path


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def map_to_itself(uid: int, gid: int) -> None:
    """In a user namespace just made: the account inside is the same as outside (``uid``, ``gid``
    map to themselves; supplementary groups cannot be set, as Linux requires for an unprivileged
    map)."""
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request + b"\0" * 22)[:18])[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP) + b"\0" * 22)


def enter(hosts: str | None = None) -> bool:
    """Move this process into a new network namespace with its loopback up (see the module's
    docstring); ``hosts``: a file to show as /etc/hosts there. Meant for a child process just
    before it starts its program (``preexec_fn``). Returns False, changing nothing, where
    Linux refuses the namespaces."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWNS | (0 if uid == 0 else CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        os.write(2, b"[distlab] note: this machine allows no private network for the ranks "
                    b"(user namespaces are off); other accounts here can reach their ports\n")
        return False
    if uid != 0:
        map_to_itself(uid, gid)
    _loopback_up()
    if hosts and libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0:
        libc.mount(hosts.encode(), b"/etc/hosts", None, _MS_BIND, None)   # if refused: torch warns, no more
    return True


def enter_with_own_hosts_file() -> bool:
    """:func:`enter`, its hosts file in a new private folder, removed once it is shown as /etc/hosts."""
    folder = tempfile.mkdtemp(prefix="distlab-network-")
    try:
        return enter(hosts_file(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> None:
    """``python -m distlab.runtime.private_network FOLDER -- COMMAND...``: COMMAND in a network of
    its own (its hosts file written into FOLDER), or, where Linux refuses one, as it is.
    ``... --one-node -- COMMAND...``: the same where this Slurm step runs on one node, else
    COMMAND as it is (see the module's docstring)."""
    where, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    if where == [ONE_NODE]:
        if wanted() and os.environ.get("SLURM_NNODES") == "1":
            enter_with_own_hosts_file()
    elif wanted():
        enter(hosts_file(where[0]))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
