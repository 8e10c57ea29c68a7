"""The operating-system boundary around graded student code (distlab.grade.boundary.bubblewrap).

Tried as a hostile student would, with what the Python guard cannot stop: the probe below runs
inside the sandbox with *no* guard installed, so whatever it fails to do, the operating
system refused. Every check has a positive twin (the writable folder is writable, ranks run
and talk over the private loopback), so a sandbox that simply failed to start cannot pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from grading_support import REPO, SLUG, Course, fresh_dir, solution_answers, with_answers
from process_support import alive_with_marker

from distlab.grade.boundary import bubblewrap

PROBE = textwrap.dedent(r'''
    import json, os, socket, sys
    targets = json.loads(sys.argv[1])
    report = {"uid": os.getuid(), "environment": dict(os.environ), "created": {}, "read": {}, "connected": {}}
    for path in targets["create"]:
        try:
            with open(path, "w") as f:
                f.write("escaped")
            report["created"][path] = "yes"
        except OSError as exc:
            report["created"][path] = exc.strerror
    for path in targets["read"]:
        try:
            report["read"][path] = open(path).read(40)
        except OSError as exc:
            report["read"][path] = "refused: " + exc.strerror
    for host, port in targets["connect"]:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.settimeout(3)
        try:
            s.connect((host, port))
            report["connected"][f"{host}:{port}"] = "yes"
        except OSError as exc:
            report["connected"][f"{host}:{port}"] = type(exc).__name__
    try:
        os.kill(targets["pid"], 0)
        report["signal"] = "delivered"
    except OSError as exc:
        report["signal"] = type(exc).__name__
    print(json.dumps(report))
''')


def machine_addresses() -> list[str]:
    """This machine's addresses that are not loopback (IPv4 and global IPv6)."""
    found = []
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1", "fe80")):
                found.append(a.address.split("%")[0])
    return found


@pytest.fixture
def listeners():
    """Listening sockets on the host's loopback and on every other address it has."""
    sockets = []
    for host in ["127.0.0.1"] + machine_addresses():
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.bind((host, 0))
        s.listen()
        sockets.append(s)
    yield [(s.getsockname()[0], s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()


def run_probe(targets: dict, writable: list[str], cwd: str) -> dict:
    command = bubblewrap.command([sys.executable, "-c", PROBE, json.dumps(targets)], writable=writable, cwd=cwd)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_student_code_in_the_sandbox_reaches_only_its_own_folder(tmp_path, listeners, monkeypatch):
    tag = f"distlab-escape-{os.getpid()}-{time.monotonic_ns()}"
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    other = work / "submitted" / "bob" / SLUG / f"{SLUG}.ipynb"
    other.parent.mkdir(parents=True)
    other.write_text("bob's answers")
    scratch.mkdir()
    bubblewrap.hand_over(str(scratch))
    outside = ["/" + tag, "/tmp/" + tag, str(REPO / tag), str(REPO / "src" / tag), str(REPO / "solutions" / tag),
               os.path.join(os.path.expanduser("~"), tag), str(work / tag), "/dev/shm/" + tag]
    monkeypatch.setenv("DISTLAB_GRADE_DB_URL_COPY", "postgresql://grader:secret@db/gradebook")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token")
    assert len(listeners) >= 2, "this machine needs an address besides loopback for the network check"
    targets = {"create": outside + [str(scratch / "mine.txt")],
               "read": [str(other), str(REPO / "solutions" / SLUG / f"{SLUG}.ipynb"), "/etc/shadow",
                        str(REPO / "src" / "distlab" / "__init__.py")],
               "connect": listeners, "pid": os.getpid()}

    report = run_probe(targets, writable=[str(scratch)], cwd=str(scratch))

    assert report["created"][str(scratch / "mine.txt")] == "yes"  # the one folder it shares
    assert (scratch / "mine.txt").read_text() == "escaped"
    for path in outside:
        assert not os.path.exists(path), f"the sandbox wrote {path} on the real file system"
    not_written = {p: why for p, why in report["created"].items() if p in outside and why == "yes"}
    # /tmp and /dev/shm are private: a write there lands in the sandbox's own empty folder
    assert set(not_written) <= {"/tmp/" + tag, "/dev/shm/" + tag}, not_written
    assert report["read"][str(REPO / "src" / "distlab" / "__init__.py")].startswith('"""')  # the code it needs
    for secret in (str(other), str(REPO / "solutions" / SLUG / f"{SLUG}.ipynb"), "/etc/shadow"):
        assert report["read"][secret].startswith("refused"), (secret, report["read"][secret])
    for host, port in listeners:
        assert report["connected"][f"{host}:{port}"] != "yes", f"reached {host}:{port} from the sandbox"
    assert report["signal"] == "ProcessLookupError"  # the grader's processes do not exist in there
    assert report["uid"] == bubblewrap.NOBODY
    assert "JUPYTERHUB_API_TOKEN" not in report["environment"]
    assert "DISTLAB_GRADE_DB_URL_COPY" not in report["environment"]
    assert report["environment"]["HOME"] == "/tmp"


FILL = textwrap.dedent(r'''
    import errno, sys
    written = {}
    for folder in ("/tmp", "/dev/shm"):
        written[folder] = 0
        with open(folder + "/fill", "wb") as f:
            try:
                while written[folder] < 2 * 2**30:   # past both caps, short of a strain on memory
                    f.write(bytes(2**24))
                    f.flush()
                    written[folder] += 2**24
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    print(written["/tmp"], written["/dev/shm"])
''')


def test_the_sandbox_s_memory_backed_folders_are_capped(tmp_path):
    """/tmp and /dev/shm live in memory: a submission that writes files until it fails must stop
    at their caps, not at half of the machine's memory."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    bubblewrap.hand_over(str(scratch))
    command = bubblewrap.command([sys.executable, "-c", FILL], writable=[str(scratch)], cwd=str(scratch))
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    tmp, shm = map(int, done.stdout.split())
    assert tmp <= bubblewrap.TMP_MB * 2**20 and shm <= bubblewrap.SHM_MB * 2**20, (tmp, shm)
    assert tmp >= (bubblewrap.TMP_MB - 16) * 2**20 and shm >= (bubblewrap.SHM_MB - 16) * 2**20, (tmp, shm)


def test_ranks_in_the_sandbox_talk_over_its_private_loopback(tmp_path):
    program = textwrap.dedent('''
        import distlab, torch

        def total():
            import torch.distributed as dist
            t = torch.ones(2) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return t.tolist()

        print(distlab.run(total, nprocs=2, timeout=60))
    ''')
    tmp_path.chmod(0o755)
    bubblewrap.hand_over(str(tmp_path))
    done = subprocess.run(bubblewrap.command([sys.executable, "-c", program], writable=[str(tmp_path)],
                                             cwd=str(tmp_path)), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[3.0, 3.0], [3.0, 3.0]]"
    assert "cannot be retrieved" not in done.stderr  # the sandbox's hosts file names its loopback


PEEK = r"""
import json, os, sys
parent, fd = os.getppid(), int(sys.argv[1])
attempts = {
    "its folder": lambda: os.readlink(f"/proc/{parent}/cwd"),
    "its descriptors": lambda: os.listdir(f"/proc/{parent}/fd"),
    "a pipe of its own": lambda: os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY),
    "its memory": lambda: os.open(f"/proc/{parent}/mem", os.O_RDONLY),
}
got = {}
for what, attempt in attempts.items():
    try:
        attempt()
        got[what] = "read"
    except OSError as exc:
        got[what] = exc.strerror
print(json.dumps(got))
"""
PEEK_AT_THE_PARENT = r"""
import os, subprocess, sys
from distlab.grade.boundary import limits

if sys.argv[1] == "undumpable":
    limits.make_undumpable()
secret_in, secret_out = os.pipe()
done = subprocess.run([sys.executable, "-c", sys.argv[2], str(secret_out)], capture_output=True, text=True)
print(done.stdout.strip() or done.stderr)
"""


def test_ranks_cannot_peek_into_an_undumpable_clean_room(tmp_path):
    """The clean room's ranks run as its user: without ``make_undumpable`` a child reads its
    parent's folder, descriptors (the verdict's pipe) and memory (the hidden tests) through
    /proc; with it, none of them."""
    tmp_path.chmod(0o755)
    bubblewrap.hand_over(str(tmp_path))
    seen = {}
    for mode in ("dumpable", "undumpable"):
        done = subprocess.run(bubblewrap.command([sys.executable, "-c", PEEK_AT_THE_PARENT, mode, PEEK],
                                                 writable=[str(tmp_path)], cwd=str(tmp_path)),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen[mode] = json.loads(done.stdout)
    assert set(seen["dumpable"].values()) == {"read"}, seen  # the sandbox alone does not stop it
    assert "read" not in seen["undumpable"].values(), seen


def test_killing_the_sandbox_ends_every_process_in_it(tmp_path):
    marker = f"distlab-sandbox-marker-{time.monotonic_ns()}"
    program = ("import subprocess, sys, time\n"
               f"subprocess.Popen(['sleep', '600', '{marker}'], start_new_session=True)\n"
               f"subprocess.Popen(['sh', '-c', 'sleep 601 {marker} & sleep 602 {marker}'])\n"
               "print('started', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen(bubblewrap.command([sys.executable, "-c", program], writable=[], cwd="/tmp"),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    while len([p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]) < 3:
        assert time.monotonic() < deadline, "the sandbox's processes did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # bwrap itself, as a killed grader would leave it
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not [p for p in psutil.process_iter(["cmdline", "status"])
                if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE]:
            break
        time.sleep(0.1)
    assert alive_with_marker(marker) == []


def test_a_grader_that_is_not_root_gets_the_same_boundary_in_a_user_namespace(tmp_path):
    """The user-namespace branch, run by nobody with Debian's own Python (no packages needed)."""
    script = textwrap.dedent(f'''
        import importlib.util, subprocess
        spec = importlib.util.spec_from_file_location("bw", {str(REPO / "src/distlab/grade/boundary/bubblewrap.py")!r})
        bw = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bw)
        command = bw.command(["sh", "-c", "id -u; touch {REPO}/src/x || echo refused"], writable=[], cwd="/tmp",
                             repo={str(REPO)!r})
        print(subprocess.run(command, capture_output=True, text=True).stdout)
    ''')
    if os.geteuid() != 0:
        pytest.fail("this test drops to nobody, which needs root (as `make test` runs on CI)")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           script], capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert done.stdout.split() == ["65534", "refused"], done.stdout + done.stderr


def test_without_bubblewrap_the_grader_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    bubblewrap.check.cache_clear()
    try:
        with pytest.raises(bubblewrap.SandboxUnavailable, match="apt-get install bubblewrap"):
            bubblewrap.check()
    finally:
        bubblewrap.check.cache_clear()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_submission_escaping_through_ctypes_scores_zero_and_leaves_the_class_intact(tmp_path):
    """The issue's attack, graded for real: raw libc calls from the kernel and from task 1's ranks
    write into /, /tmp, the repository and the grader's home, read another student's
    submission and connect out. Task 1's answer is right only if one of them worked (a file in
    /tmp counts only if it appears in the real /tmp, which the test checks)."""
    tag = f"distlab-escaped-{time.monotonic_ns()}"
    escape = textwrap.dedent(f'''
        import ctypes, os, socket

        def escape():
            libc = ctypes.CDLL(None, use_errno=True)
            got = []
            home = "{os.path.expanduser("~")}"
            for path in ("/tmp/{tag}", "/{tag}", "{REPO}/{tag}", home + "/{tag}", "/gradebook.db"):
                fd = libc.open(path.encode(), 0o1 | 0o100, 0o644)  # O_WRONLY | O_CREAT
                if fd >= 0:
                    libc.close(fd)
                    got.append(path)
            # inside, /tmp is the sandbox's own, and a graded rank's own copy of it (its room): a
            # path there, the repository's too when the clone lives in /tmp, is checked outside
            got = [path for path in got if not path.startswith("/tmp/")]
            other = os.path.join(os.getcwd(), "../../../submitted/aa-honest/{SLUG}/{SLUG}.ipynb")
            if libc.open(other.encode(), 0) >= 0:
                got.append(other)
            for host in {machine_addresses()!r}:
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                s.settimeout(2)
                if s.connect_ex((host, 22)) in (0, 111):  # open, or refused by the machine itself
                    got.append(host)
            return got
    ''')
    answers = solution_answers(SLUG)
    answers["task1-answer"] = escape + textwrap.dedent('''
        def my_rank():
            return dist.get_rank() if escape() else -1
    ''') + "\nprint('kernel escapes:', escape())\n"
    course = Course(tmp_path / "work")
    release = course.release()
    incoming = fresh_dir(tmp_path / "incoming")
    for student in ("aa-honest", "zz-honest"):
        course.submit(incoming, student, with_answers(release, solution_answers(SLUG)))
    course.submit(incoming, "mm-escape", with_answers(release, answers))
    assert course.grade("collect", SLUG, "--from", str(incoming)).returncode == 0, course.log
    assert course.grade("autograde", SLUG).returncode == 0, course.log

    scores = course.scores()
    full = course.max_scores()
    assert scores["aa-honest"] == full and scores["zz-honest"] == full, course.log
    assert scores["mm-escape"] == {**full, "task1-tests": 0.0}, course.log
    graded = (course.work / "autograded" / "mm-escape" / SLUG / f"{SLUG}.ipynb").read_text()
    assert "kernel escapes: []" in graded  # the kernel got nowhere either
    for path in ("/" + tag, "/tmp/" + tag, str(REPO / tag), os.path.join(os.path.expanduser("~"), tag),
                 "/gradebook.db"):
        assert not os.path.exists(path), f"{path} was written by a graded submission"
    assert course.integrity() == "ok"


def test_the_grader_leaves_no_zombie_of_a_killed_sandbox():
    """bwrap forks the sandbox's init; killed with bwrap, it is re-parented to the grader (a
    subreaper), which must collect it: unreaped, two per notebook piled up in a class run."""
    program = textwrap.dedent('''
        import subprocess, sys, time, psutil
        from distlab.grade.boundary import bubblewrap, limits
        from distlab.runtime import processes
        processes.become_subreaper()
        sandbox = subprocess.Popen(bubblewrap.command(["sleep", "600"], writable=[], cwd="/tmp"))
        time.sleep(1.5)
        sandbox.kill()  # as jupyter_client ends a kernel: bwrap alone; its init dies with it
        sandbox.wait()
        time.sleep(0.5)
        killed = limits.kill_descendants()  # what the grader does after each notebook
        zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE
                   and c.pid != sandbox.pid]
        print(killed, zombies)
    ''')
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    killed, zombies = done.stdout.split(" ", 1)
    assert int(killed) == 0, done.stdout + done.stderr  # nothing was left alive in the sandbox
    assert zombies.strip() == "[]", done.stdout + done.stderr


def test_the_kernels_socket_folder_lives_exactly_as_long_as_its_kernel(tmp_path):
    """The grading kernel talks through Unix sockets in a folder of its own: made when the kernel
    starts, gone when it is shut down; a manager that never starts one leaves nothing in /tmp."""
    import asyncio
    import glob
    import tempfile

    from distlab.grade.pipeline.grading_kernel import GradingKernelManager

    def folders():
        return set(glob.glob(os.path.join(tempfile.gettempdir(), "distlab-kernel-*")))

    before = folders()
    km = GradingKernelManager(kernel_name="python3")
    assert folders() == before

    async def start_and_shut_down():
        await km.start_kernel(cwd=str(tmp_path))
        try:
            assert folders() - before == {km.sockets_folder} and await km.is_alive()
        finally:
            await km.shutdown_kernel(now=True)

    asyncio.run(start_and_shut_down())
    assert folders() == before


READY_KERNEL = textwrap.dedent(r'''
    import asyncio, contextlib, json, os, sys
    from distlab.grade.pipeline.grading_kernel import GradingKernelManager

    @contextlib.asynccontextmanager
    async def ready_kernel(folder):
        """The grading kernel started in ``folder`` and a client it answers; both ended on the way out."""
        km = GradingKernelManager(kernel_name="python3")
        await km.start_kernel(cwd=folder)
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=120)
            yield km, client
        finally:
            client.stop_channels()
            await km.shutdown_kernel(now=True)
''')
"""The start of a grader's script below, which runs as another account: a grading kernel as
autograde starts it, ended however the script's checks go."""

GRADED_KERNEL = READY_KERNEL + textwrap.dedent(r'''
    async def main(folder, marker):
        async with ready_kernel(folder) as (km, client):
            # a forked process's print reaches the notebook too (ipykernel's pipe for them, moved
            # to a Unix socket): the owner must hear it
            client.execute(f"import os, time\nif os.fork() == 0:\n    print('forked', {marker!r}, flush=True)\n"
                           "    os._exit(0)\n"
                           f"for _ in range(80):\n    print({marker!r}, flush=True)\n    time.sleep(0.1)")
            print(json.dumps(km.get_connection_info(session=False), default=str), flush=True)
            sys.stdin.readline()              # the eavesdropper has listened
            heard = ""
            while "forked " + marker not in heard or heard.count(marker) < 3:
                msg = await client.get_iopub_msg(timeout=30)
                heard += msg["content"].get("text", "")
            print("owner heard it", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
''')


def test_another_account_on_the_node_cannot_listen_to_a_grading_kernel():
    """Issue 44's attack on the grading kernel of a grader without the sandbox (inside it, the
    kernel has a network of its own): a second account scans /proc/net/tcp and /proc/net/unix
    for the grader's listening sockets and subscribes to each while the kernel prints. The
    grader here is a numbered account of its own, so that only its sockets are tried."""
    from eavesdrop import VICTIM_UID, eavesdrop, python_for_any_account

    home = Path(tempfile.mkdtemp(prefix="distlab-grader-", dir="/tmp"))
    try:
        os.chown(home, VICTIM_UID, VICTIM_UID)
        home.chmod(0o700)
        marker = f"graded-answer-{os.getpid()}"
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8",
               bubblewrap.SANDBOX_VARIABLE: "none"}
        grader = subprocess.Popen(["setpriv", f"--reuid={VICTIM_UID}", f"--regid={VICTIM_UID}", "--clear-groups",
                                   python_for_any_account(), "-c", GRADED_KERNEL, str(home), marker],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=home)
        try:
            connection = json.loads(grader.stdout.readline() or "{}")
            assert connection, grader.stderr.read()
            heard = eavesdrop(VICTIM_UID, seconds=4)
            grader.stdin.write("done\n")
            grader.stdin.flush()
            said, errors = grader.communicate(timeout=120)
        finally:
            if grader.poll() is None:
                grader.kill()
                grader.wait()
        assert "owner heard it" in said, errors[-3000:]   # the positive twin: the kernel did print
        assert not [h for h in heard["heard"] if marker in h], heard["heard"][:3]
        assert not [e for e in heard["endpoints"] if e.startswith("tcp://")], heard["endpoints"]
        assert connection["transport"] == "ipc" and os.path.isabs(connection["ip"]), connection
        assert "Kernel is running over TCP without encryption" not in errors
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_no_setting_swaps_the_grading_kernel_for_another():
    """The hub's nbgrader settings name a kernel manager for nbgrader's other kernels
    (Execute.kernel_manager_class): autograde must keep its own, capped and sandboxed. When the
    setting won, the kernel ran outside the sandbox and a submission wrote into /."""
    from traitlets.config import Config

    from distlab.grade.pipeline.nbplugins import GradingKernelManager, KernelExecute

    settings = Config()
    settings.Execute.kernel_manager_class = "distlab.grade.boundary.kernel_sockets.PrivateSocketsKernelManager"
    assert KernelExecute(config=settings).kernel_manager_class is GradingKernelManager
    later = KernelExecute()
    later.config = settings   # as nbconvert hands a preprocessor its settings, after making it
    assert later.kernel_manager_class is GradingKernelManager


def test_a_grader_that_is_not_root_gets_the_capped_folders_too():
    """The folders a submission writes are memory file systems capped in bytes and files
    (distlab.grade.boundary.scratch), also for a grader with no privilege, whose group differs from its
    user (the hub's instructor): past the cap on files a write fails, the submission's own files
    are there, and the host's folder is as the grader left it."""
    import json

    from eavesdrop import VICTIM_UID, python_for_any_account

    from distlab.grade.boundary import scratch

    folder = Path(tempfile.mkdtemp(prefix="distlab-capped-", dir="/tmp"))
    try:
        (folder / "data.txt").write_text("handed in\n")
        for path in (folder, folder / "data.txt"):
            os.chown(path, VICTIM_UID, VICTIM_UID + 1)
        spec = json.dumps([{"path": str(folder), "mb": 8, "files": 100}])
        writes = (f"cd {folder} && cat data.txt && i=0 && "
                  "while [ $i -lt 1000 ] && echo x > f$i 2>/dev/null; do i=$((i+1)); done; echo made $i")
        done = subprocess.run(["setpriv", f"--reuid={VICTIM_UID}", f"--regid={VICTIM_UID + 1}", "--clear-groups",
                               python_for_any_account(), "-m", scratch.__name__, spec, "--", "sh", "-c", writes],
                              capture_output=True, text=True, timeout=120, cwd="/")
        assert done.returncode == 0, done.stderr
        said = done.stdout.split()
        assert said[:2] == ["handed", "in"] and said[2] == "made" and 90 <= int(said[3]) < 100, done.stdout
        assert sorted(p.name for p in folder.iterdir()) == ["data.txt"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


FILLS_ITS_SOCKET_FOLDER = READY_KERNEL + textwrap.dedent(r'''
    CELL = """
    import os
    arguments = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    folder = os.path.dirname(arguments[arguments.index(b"-f") + 1].decode())
    made = written = 0
    try:
        for i in range(20_000):
            with open(os.path.join(folder, f"many-{i}"), "w") as f:
                f.write("x")
            made += 1
    except OSError as exc:
        print("files stopped after", made, exc.strerror)
    try:
        with open(os.path.join(folder, "big"), "wb") as f:
            for _ in range(100):
                f.write(b"x" * 2**20)
                f.flush()
                written += 1
    except OSError as exc:
        print("bytes stopped after", written, "MiB", exc.strerror)
    print("made", made, "written", written)
    """

    async def main(folder):
        async with ready_kernel(folder) as (km, client):
            reply = await client.execute_interactive(CELL, timeout=300, output_hook=lambda msg: print(
                msg["content"].get("text", ""), end="", flush=True))
            # the host's socket folder, while the kernel lives: as the grader made it
            print(json.dumps({"host": sorted(os.listdir(km.sockets_folder)), "status": reply["content"]["status"],
                              "answers": (await client.execute_interactive("print(6 * 7)", timeout=60))["content"]["status"]}))

    asyncio.run(main(sys.argv[1]))
''')


@pytest.mark.timeout(500)
def test_a_kernel_filling_its_socket_folder_stops_at_its_caps_and_the_host_folder_is_unchanged():
    """The grading kernel binds its sockets in a folder it must write (distlab.grade.boundary.kernel_sockets);
    on the host's /tmp a submission filled it without a limit (20,000 files, 100 MiB). Now it is a
    memory file system of its own capped at 1 MiB and 64 files (distlab.grade.boundary.scratch), which
    the grader reaches through the sandbox's mounts: the writes stop there, the kernel still
    answers, and the host's folder holds what the grader put in it."""
    from distlab.grade.boundary import scratch

    home = Path(tempfile.mkdtemp(prefix="distlab-grader-", dir="/tmp"))   # the grader's temporary folder
    work = Path(tempfile.mkdtemp(prefix="distlab-kernel-folder-", dir="/tmp"))   # the kernel's, as autograde's
    try:
        home.chmod(0o755)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
        done = subprocess.run([sys.executable, "-c", FILLS_ITS_SOCKET_FOLDER, str(work)], capture_output=True,
                              text=True, env=env, cwd=home, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        made, written = map(int, re.search(r"made (\d+) written (\d+)", done.stdout).groups())
        assert made < scratch.SOCKETS_FILES and written <= scratch.SOCKETS_MB, (made, written)   # before: 20000, 100
        assert "files stopped after" in done.stdout and "bytes stopped after" in done.stdout, done.stdout[:500]
        assert "No space left on device" in done.stdout, done.stdout[:500]
        assert report["status"] == "ok" and report["answers"] == "ok", str(report)[:500]   # the kernel still talks
        assert report["host"] == ["kernel.json"], (len(report["host"]), report["host"][:10])
        assert not list(home.glob("distlab-kernel-*")), list(home.iterdir())   # all gone after
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_a_grader_that_is_not_root_reaches_a_socket_in_a_capped_folder():
    """How the grader reaches its kernel's sockets in their capped folder (/proc/PID/root,
    distlab.grade.boundary.scratch.seen_from_outside) holds for a grader with no privilege too: the
    folder's file system lives in a user namespace that grader made, so it may look in."""
    from eavesdrop import VICTIM_UID, python_for_any_account

    folder = Path(tempfile.mkdtemp(prefix="distlab-capped-", dir="/tmp"))
    try:
        os.chown(folder, VICTIM_UID, VICTIM_UID)
        listens = (f"import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('{folder}/s')\ns.listen()\n"
                   "c, _ = s.accept()\nc.sendall(b'hello')\ntime.sleep(1)")
        grader = textwrap.dedent(f"""
            import json, os, socket, subprocess, sys, time
            from distlab.grade.boundary import scratch
            sandbox = ["bwrap", "--die-with-parent", "--unshare-all", "--ro-bind", "/usr", "/usr",
                       "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
                       "--proc", "/proc", "--dev", "/dev", "--bind", {str(folder)!r}, {str(folder)!r},
                       "--", "/usr/bin/python3", "-c", {listens!r}]
            inside = subprocess.Popen(scratch.wrap(sandbox, [], sockets={str(folder)!r}))
            for _ in range(100):
                try:
                    with socket.socket(socket.AF_UNIX) as c:
                        c.connect(scratch.seen_from_outside(inside.pid, {str(folder)!r} + "/s"))
                        print(c.recv(10).decode(), sorted(os.listdir({str(folder)!r})))
                    break
                except OSError:
                    time.sleep(0.1)
            inside.wait()
        """)
        done = subprocess.run(["setpriv", f"--reuid={VICTIM_UID}", f"--regid={VICTIM_UID}", "--clear-groups",
                               python_for_any_account(), "-c", grader], capture_output=True, text=True, timeout=120,
                              cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "src")})
        assert done.stdout.split() == ["hello", "[]"], done.stdout + done.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)
