"""The demo course on one machine: `make hub` (up) and `make hub-clean` (accounts removed).

    python hub/demo.py up       # cluster, accounts, git mirror, hub; Ctrl-C tears it all down
    python hub/demo.py clean    # delete the demo accounts (and their homes)

What comes up, in order (each piece is what a centre runs, shrunk onto one machine):

1. the private two-node Slurm cluster (scripts/slurm_cluster.py), in a run folder under /tmp
   that every user can read (the students' jobs need slurm.conf and munge's socket);
2. the course's Unix accounts (hub/accounts.py), with fresh passwords, printed once;
3. a read-only git mirror of this repository (``git daemon`` on 127.0.0.1): the compute
   nodes have no internet, so the servers fetch the book's repository from it; the book's
   launch links still name the public repository, and git's ``insteadOf`` rewrites them;
4. JupyterHub (hub/jupyterhub_config.py) on 127.0.0.1, servers as Slurm jobs of the students;
5. the instructor's account with its own private copy of the course and grading folder
   (hub/instructor_account.py): the grading commands run as that account, never as root.

The pieces it brings up with live beside it, one job each: :mod:`demo_sizing` (how big the
cluster must be for the class), :mod:`demo_access` (what the students' servers may read, and
what they may not), :mod:`demo_mirror` (the git mirror), :mod:`demo_processes` (waiting for
and ending the processes started). tests/hub/test_hub.py brings up the same pieces through
:func:`course_hub`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(HERE))
import accounts  # noqa: E402
import instructor_account  # noqa: E402
import slurm_cluster  # noqa: E402
from course_spawner import PROFILES, squeue_format  # noqa: E402
from demo_access import (  # noqa: E402
    let_everyone_through,
    make_instructor_folders_private,
    readable_by_everyone,
    server_python,
)
from demo_mirror import git_mirror  # noqa: E402
from demo_processes import HubError, _end, _hub_ready, _wait_for, end_culler, end_proxy  # noqa: E402
from demo_sizing import cpus_per_node_for, cpus_per_node_needed  # noqa: E402,F401 - tests/hub/test_hub.py asks demo
from free_port import free_port  # noqa: E402

COURSE = "dlc"
START_TIMEOUT = 180  # seconds for the hub to answer (a loaded machine, load average 15, took over 60)
PUBLIC_REPO = "https://github.com/distlab-book/distlab"  # _config.yml's repository.url


@contextlib.contextmanager
def course_hub(run_dir: Path, course: str = COURSE, students: int = 3, queue_timeout: int = 120,
               idle_timeout: int = 3600, activity_interval: int = 60):
    """Cluster, accounts, mirror and hub, all under ``run_dir``; yield what a user needs.

    ``idle_timeout``: seconds without activity after which the idle culler stops a server (and
    so ends its job); ``activity_interval``: how often servers and proxy report activity.

    Yields ``{"url", "passwords", "slurm_conf", "cluster", "log", "mirror", "exchange", "grading",
    "instructor"}`` (``instructor``: for :func:`instructor_account.command`). Leaving the block
    stops the hub (and its proxy), cancels every job, ends the daemons; the accounts stay
    (remove them with :func:`accounts.remove_accounts`).
    """
    if os.geteuid() != 0:
        raise HubError("the course hub runs as root: PAM reads /etc/shadow, and each server's job is "
                       "submitted as its student")
    proxy = HERE / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        raise HubError(f"{proxy} is missing: run `npm ci --prefix hub` (make hub does)")
    course_env = Path(sys.prefix)
    for needed in (REPO / "src", course_env / "lib"):
        let_everyone_through(needed)
        if not readable_by_everyone(needed):
            raise HubError(f"{needed} is not readable by other users, and the students' servers run "
                           "from it: put the repository where every user can read it (or chmod o+rx "
                           "the folders above it)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o755)  # the students' jobs read slurm.conf and use munge's socket below it
    state = run_dir / "state"
    state.mkdir(mode=0o700, exist_ok=True)  # the hub's database and cookie secret: root only
    grading = run_dir / "grading"   # the gradebook, submissions, feedback: the instructor's alone
    exchange = run_dir / "exchange"
    exchange.mkdir(exist_ok=True)
    # nbgrader's shared exchange: every user may write (nbgrader's docs); the sticky bit keeps
    # anyone but its owner from renaming or deleting the course's folder in it.
    os.chmod(exchange, 0o1777)
    make_instructor_folders_private()
    python = server_python(course_env, run_dir)
    passwords = accounts.create_accounts(course, students=students)
    cluster_env, declared = dict(os.environ), cpus_per_node_for(students)
    if declared:
        cluster_env[slurm_cluster.DECLARED_CPUS_VARIABLE] = str(declared)
    with slurm_cluster.running_cluster(run_dir / "c", env=cluster_env) as cluster, \
            git_mirror(run_dir, free_port(), cluster["network"]["controller_address"]) as mirror:
        port, proxy_api_port, hub_api_port = free_port(), free_port(), free_port()
        hub_api_ip = cluster["network"]["controller_address"]   # where the nodes reach this machine
        env = dict(os.environ, SLURM_CONF=cluster["slurm_conf"], DISTLAB_HUB_STATE=str(state),
                   DISTLAB_HUB_COURSE=course, DISTLAB_HUB_PORT=str(port), DISTLAB_HUB_API_PORT=str(hub_api_port),
                   DISTLAB_HUB_PROXY_API_PORT=str(proxy_api_port), DISTLAB_HUB_COURSE_ENV=str(course_env),
                   DISTLAB_HUB_SERVER_PYTHON=str(python), DISTLAB_HUB_QUEUE_TIMEOUT=str(queue_timeout),
                   DISTLAB_HUB_IDLE_TIMEOUT=str(idle_timeout), DISTLAB_HUB_ACTIVITY_INTERVAL=str(activity_interval),
                   DISTLAB_HUB_PARTITION=cluster["partition"],
                   DISTLAB_HUB_GIT_MIRROR=f"{mirror} {PUBLIC_REPO}", DISTLAB_HUB_EXCHANGE=str(exchange),
                   DISTLAB_HUB_SQUEUE_FORMAT=squeue_format(max(map(len, passwords))), DISTLAB_HUB_API_IP=hub_api_ip,
                   DISTLAB_HUB_SERVER_IP="0.0.0.0" if cluster["network"]["mode"] == "namespaces" else "127.0.0.1")
        # The hub's log is root's alone: at DEBUG it holds every server's API token, and at any
        # level the students' names and what they did.
        log = run_dir / "hub.log"
        with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as out:
            hub = subprocess.Popen([str(course_env / "bin" / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")],
                                   cwd=state, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        instructor = None
        try:
            instructor = instructor_account.set_up(run_dir, instructor_of(course), REPO, grading, course_env,
                                                   exchange, cluster["slurm_conf"])
            instructor["environment"]["SQUEUE_FORMAT"] = env["DISTLAB_HUB_SQUEUE_FORMAT"]   # their `squeue` too
            _wait_for(lambda: _hub_ready(log, url), START_TIMEOUT, "JupyterHub did not answer", hub, log)
            yield {"url": url, "passwords": passwords, "slurm_conf": cluster["slurm_conf"],
                   "cluster": cluster, "log": log, "mirror": mirror, "hub_pid": hub.pid, "exchange": exchange,
                   "server_python": python, "grading": grading, "squeue_format": env["DISTLAB_HUB_SQUEUE_FORMAT"],
                   # who runs `python -m distlab.grade`, from where: instructor_account.command(hub["instructor"], ...)
                   "instructor": instructor}
        finally:
            _end(hub, grace=30)   # JupyterHub gives its services up to 20 s to stop
            end_proxy(state / "proxy.pid", proxy_api_port)
            end_culler(f"http://{hub_api_ip}:{hub_api_port}/hub/api")
            if instructor is not None:
                instructor_account.tear_down(instructor)


def instructor_of(course: str) -> str:
    """The course's instructor account (hub/accounts.py makes it with the students)."""
    return f"{course}-instructor1"


def example_due_date() -> str:
    """Tomorrow at 17:00 in UTC, spelled as nbgrader reads a due date (the time zone named)."""
    tomorrow = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    return tomorrow.strftime("%Y-%m-%d 17:00:00 UTC")


def launch_link(url: str, notebook: str = "notebooks/00-first-steps/00-first-steps.ipynb") -> str:
    """The link an exercise page's launch button makes when _config.yml names this hub."""
    query = urllib.parse.urlencode({"repo": PUBLIC_REPO, "urlpath": f"lab/tree/distlab/{notebook}",
                                    "branch": "main"}, safe="/")
    return f"{url}/hub/user-redirect/git-pull?{query}"


class StopAsked(BaseException):
    """A signal asked the demo to stop while it was still coming up. Raised from the signal
    handler, as KeyboardInterrupt is: the start-up unwinds, and each piece already started is
    ended by its context manager on the way out."""


def up(course: str, students: int = 3) -> int:
    """Bring the demo up, print what a person needs, and serve until SIGINT, SIGTERM or SIGHUP.

    Each signal stops it the same way: Ctrl-C in a terminal (SIGINT to the whole process
    group, make's included: make waits for its child), SIGTERM to ``make`` (GNU make passes
    SIGTERM on to its child, this process, then exits with 143), or any of them to this process
    from a script or a service manager. Once up, the main loop notices the signal and leaves
    the ``course_hub`` block; while still coming up, the first signal raises StopAsked, which
    unwinds the start-up (a later one is only noted, so nothing interrupts the teardown).
    """
    run_dir = Path(tempfile.mkdtemp(prefix="distlab-hub-", dir="/tmp"))
    stopping, serving = [], []

    def stop(signum, _frame) -> None:
        first = not stopping
        stopping.append(signum)
        if first and not serving:
            raise StopAsked(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    print(f"course hub: coming up in {run_dir} (process {os.getpid()}; Ctrl-C or SIGTERM stops it)", flush=True)
    try:
        with course_hub(run_dir, course, students=students) as hub:
            serving.append(True)
            print(f"\nThe demo course hub is up: {hub['url']}   (Ctrl-C ends it; from a script, SIGTERM to "
                  f"make or to process {os.getpid()})\n", flush=True)
            declared = cpus_per_node_for(students)
            print(f"Sized for {students} students, each server a Slurm job of the default profile "
                  f"({next(iter(PROFILES.values()))['title']}): "
                  + (f"each of the {len(slurm_cluster.NODES)} nodes declares {declared} CPUs, more than this "
                     f"machine's {os.cpu_count()}, which the servers share (Slurm allows it for testing).\n"
                     if declared else f"this machine's {os.cpu_count()} cores per node suffice.\n"), flush=True)
            width = max(map(len, hub["passwords"]))
            for user, password in hub["passwords"].items():
                print(f"  {user:<{width}}  password {password}")
            print(f"\nOpen chapter 0 as a student (the book's launch button, for this hub):\n  {launch_link(hub['url'])}")
            instructor = hub["instructor"]
            profile = instructor_account.shell_profile(instructor)
            print(f"\nThe instructor ({instructor['user']}, not root: a copy of the course of their own, "
                  f"{instructor['course']}) releases, collects, grades and returns:\n"
                  f"  su - {instructor['user']}\n"
                  f"  source {profile}\n"
                  f"  python -m distlab.grade publish 00-first-steps --due \"{example_due_date()}\"\n"
                  "  python -m distlab.grade collect 00-first-steps   # then autograde, feedback, return")
            print(f"\nSlurm: export SLURM_CONF={hub['slurm_conf']}; export SQUEUE_FORMAT='{hub['squeue_format']}'; "
                  f"squeue    Hub log: {hub['log']}", flush=True)
            while not stopping:
                time.sleep(0.5)
            print("\nstopping: hub, jobs, Slurm daemons ...")
    except StopAsked as asked:
        print(f"\nstopped while coming up ({asked}): hub, jobs and Slurm daemons ended.", flush=True)
    except (HubError, slurm_cluster.ClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print("stopped. The accounts stay until `make hub-clean` (python hub/demo.py clean).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "clean"])
    parser.add_argument("--course", default=COURSE, help="account prefix and group names (default: %(default)s)")
    parser.add_argument("--students", type=int, default=3,
                        help="student accounts to make; the private cluster is sized so each gets a server "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "up":
        if args.students < 1:
            parser.error("--students must be at least 1")
        return up(args.course, args.students)
    removed = accounts.remove_accounts(args.course)
    print(f"removed {len(removed)} account(s): {' '.join(removed) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
