"""A private PostgreSQL server for the gradebook: Debian's package, started in a folder of ours.

A class graded in parallel (many Slurm jobs writing scores at once) needs a database server;
sqlite's single file is for one machine. This script starts a throw-away server the way
``scripts/slurm_cluster.py`` starts a cluster, for the tests and for trying the course by hand:

* ``initdb`` makes a new cluster in ``ROOT/data``, owned by an unprivileged account
  (PostgreSQL refuses to run as root; ``nobody`` by default), with one role, ``distlab``,
  whose random password is in the URL we hand out;
* ``postgres`` listens on 127.0.0.1 at a free port (and on a socket in a private folder),
  with durability switched off (``fsync=off``): a test server, never a course's real one;
  given an ``address`` (the controller's address on the private cluster's bridge,
  scripts/slurm_cluster.py), it listens there too and lets in password logins from the
  ``clients`` network (the nodes), as a centre's gradebook server listens on the cluster's
  network: a job on another node reaches its own loopback at 127.0.0.1, never this server;
* one database, ``gradebook``, is created; the URL is
  ``postgresql+psycopg://distlab:<password>@<address>:<port>/gradebook``;
* stopping sends the postmaster SIGINT (PostgreSQL's "fast" shutdown: it ends its own
  children) and waits; whatever is left of its process group is killed. Nothing survives.

    with running_postgres(Path("/tmp/pg-1")) as server:
        os.environ["DISTLAB_GRADE_DB_URL"] = server.url

From a shell: ``python scripts/postgres_server.py ROOT`` prints the URL and runs until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from free_port import free_port

ROLE, DATABASE = "distlab", "gradebook"


class PostgresError(RuntimeError):
    pass


def find_binaries() -> Path:
    """Debian keeps the server's programs in /usr/lib/postgresql/<version>/bin (not on PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise PostgresError("PostgreSQL is not installed: run `bash scripts/install-system-deps.sh` "
                            "(Debian's package `postgresql`)")
    return Path(found[-1]).parent


@dataclass
class Server:
    root: Path
    port: int
    password: str
    process: subprocess.Popen | None = None
    address: str = "127.0.0.1"
    """Where the URL points: 127.0.0.1, or the address the cluster's nodes reach this machine at."""
    clients: str | None = None
    """The network (CIDR) allowed to log in besides this machine, e.g. the cluster's nodes."""

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of the gradebook database."""
        return f"postgresql+psycopg://{ROLE}:{self.password}@{self.address}:{self.port}/{DATABASE}"

    def connect(self, database: str = DATABASE, timeout: float = 5):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=ROLE, password=self.password,
                               dbname=database, connect_timeout=max(1, int(timeout)), autocommit=True)

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _as_user(account: str) -> dict:
    """Popen arguments that run the child as ``account`` (we are root) with a clean HOME."""
    entry = pwd.getpwnam(account)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": [],
            "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent"}}


def start(root: Path, account: str = "nobody", timeout: float = 60, address: str = "127.0.0.1",
          clients: str | None = None) -> Server:
    """initdb + postgres in ``root`` (created, owned by ``account``); returns once it answers.
    ``address`` and ``clients``: see the module's docstring."""
    binaries = find_binaries()
    root.mkdir(parents=True, exist_ok=True)
    sockets = root / "socket"
    sockets.mkdir(exist_ok=True)
    entry = pwd.getpwnam(account)
    for folder in (root, sockets):
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    os.chmod(sockets, 0o700)  # only the server's account (and root) reach the socket
    server = Server(root, free_port(), secrets.token_urlsafe(18), address=address, clients=clients)
    password_file = root / "password"
    password_file.write_text(server.password + "\n")
    os.chown(password_file, entry.pw_uid, entry.pw_gid)
    os.chmod(password_file, 0o600)
    init = subprocess.run([str(binaries / "initdb"), "-D", str(root / "data"), "-U", ROLE,
                           f"--pwfile={password_file}", "--auth=scram-sha-256", "-E", "UTF8",
                           "--no-sync", "--no-instructions"],
                          capture_output=True, text=True, timeout=120, **_as_user(account))
    password_file.unlink()
    if init.returncode != 0:
        raise PostgresError(f"initdb failed:\n{init.stdout[-2000:]}{init.stderr[-2000:]}")
    if clients:   # initdb lets in this machine only; the nodes log in with the password too
        with open(root / "data" / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {clients} scram-sha-256\n")
    server.log.touch()
    os.chown(server.log, entry.pw_uid, entry.pw_gid)
    _launch(server, account)
    try:
        _wait_until_it_answers(server, timeout)
        with server.connect("postgres") as connection:
            connection.execute(f"CREATE DATABASE {DATABASE}")
    except BaseException:
        stop(server)
        raise
    return server


def _wait_until_it_answers(server: Server, timeout: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise PostgresError(f"postgres exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            with server.connect("postgres", timeout=2):
                return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise PostgresError(f"postgres did not answer within {timeout:.0f} s ({exc}):\n"
                                    f"{server.log_tail()}") from exc
            time.sleep(0.2)


def stop(server: Server, grace: float = 20) -> None:
    """Fast shutdown (SIGINT to the postmaster), then SIGKILL to its process group if needed."""
    process, server.process = server.process, None
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the group is the server's own (new session)
    process.wait()


def restart(server: Server, account: str = "nobody", timeout: float = 60) -> None:
    """Start a stopped server again on the same data, port and password."""
    _launch(server, account)
    _wait_until_it_answers(server, timeout)


def _launch(server: Server, account: str) -> None:
    """The postmaster, in a session of its own (so its whole group can be ended), as ``account``.
    Durability is off: a test server loses nothing it needs on a crash."""
    with open(server.log, "ab") as log:
        server.process = subprocess.Popen(
            [str(find_binaries() / "postgres"), "-D", str(server.root / "data"),
             "-c", f"listen_addresses={','.join(dict.fromkeys(['127.0.0.1', server.address]))}",
             "-c", f"port={server.port}",
             "-c", f"unix_socket_directories={server.root / 'socket'}",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, **_as_user(account))


@contextlib.contextmanager
def running_postgres(root: Path, account: str = "nobody", address: str = "127.0.0.1", clients: str | None = None):
    """A server for the block; its folder is removed afterwards."""
    server = start(root, account, address=address, clients=clients)
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


def _stop_on_signal(signum, frame):
    raise KeyboardInterrupt  # the same tidy stop as Ctrl-C


def main(root: Path) -> int:
    # Also SIGTERM and SIGHUP (a `kill`, a closed terminal), and SIGINT even when started in the
    # background by a script, where the shell leaves it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    with running_postgres(root) as server:
        print(f"PostgreSQL is up: export DISTLAB_GRADE_DB_URL='{server.url}'", flush=True)
        print("Ctrl-C stops it and removes its folder.", flush=True)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/postgres_server.py ROOT   (a new, empty folder)")
    sys.exit(main(Path(sys.argv[1])))
