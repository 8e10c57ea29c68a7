"""Each graded rank in a room of its own (distlab.grade.boundary.rank_room): every road from one rank to
another but the process group is closed, tried from inside the grading sandbox.

Every attack runs twice on the same two warm ranks of a fork-launcher pool, as the clean room
starts them: once without the room (the secret must pass: the attack is real) and once in it
(it must not). Rank 0 puts ``SECRET`` somewhere, both ranks meet in a barrier, rank 1 looks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from distlab.grade.boundary import bubblewrap, limits, rank_keeper, rank_room

SECRET = "the-answer-is-42"

PROGRAM = textwrap.dedent(r'''
import ctypes, datetime, json, os, signal, socket, sys, threading, time
import distlab
from distlab.grade.boundary import rank_room
from distlab.runtime import options
from distlab.runtime.pool import Pool

SECRET = sys.argv[1]


def _meet(put, get):
    """Rank 0 runs put(), then both meet, then rank 1 returns get() (or why it failed)."""
    import torch.distributed as dist
    problem = None
    if dist.get_rank() == 0:
        try:
            put()
        except Exception as exc:
            problem = f"put: {type(exc).__name__}: {exc}"
    dist.barrier()
    found = None
    if dist.get_rank() == 1:
        try:
            found = get()
            found = found.decode(errors="replace") if isinstance(found, bytes) else str(found)
        except Exception as exc:
            found = f"get: {type(exc).__name__}: {str(exc)[:120]}"
    dist.barrier()
    return found if dist.get_rank() == 1 else problem


def in_folder(folder):
    path = os.path.join(os.path.expanduser(folder), "from-rank-0")

    def put():
        with open(path, "w") as f:
            f.write(SECRET)
    return _meet(put, lambda: open(path).read())


def posix_shared_memory():
    from multiprocessing import shared_memory
    kept = []

    def put():
        block = shared_memory.SharedMemory(name="distlab-room-test", create=True, size=64)
        block.buf[:len(SECRET)] = SECRET.encode()
        kept.append(block)
    def get():
        block = shared_memory.SharedMemory(name="distlab-room-test")
        return bytes(block.buf[:len(SECRET)])
    return _meet(put, get)


def sysv_shared_memory():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p

    def put():
        address = libc.shmat(libc.shmget(4242, 4096, 0o1666), None, 0)
        ctypes.memmove(address, SECRET.encode() + b"\0", len(SECRET) + 1)

    def get():
        block = libc.shmget(4242, 4096, 0o666)
        if block < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return ctypes.string_at(libc.shmat(block, None, 0))
    return _meet(put, get)


def the_ranks_store():
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    return _meet(lambda: store.set("mailbox", SECRET), lambda: store.get("mailbox"))


def a_store_of_its_own():
    from torch.distributed import TCPStore
    kept = []

    def put():
        kept.append(TCPStore("127.0.0.1", 29777, 2, True, timeout=datetime.timedelta(seconds=5),
                             wait_for_workers=False))
        kept[0].set("mailbox", SECRET)
    get = lambda: TCPStore("127.0.0.1", 29777, 2, False, timeout=datetime.timedelta(seconds=5)).get("mailbox")
    return _meet(put, get)


def abstract_unix_socket():
    kept = []

    def put():
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind("\0distlab-room-test")
        server.listen(1)
        kept.append(server)
        threading.Thread(target=lambda: server.accept()[0].sendall(SECRET.encode()), daemon=True).start()

    def get():
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(5)
        client.connect("\0distlab-room-test")
        return client.recv(100)
    return _meet(put, get)


def the_run_folder():
    run_dir = sys.argv[1]   # the worker's argument: the run folder
    path = os.path.join(run_dir, "planted")

    def put():
        with open(path, "w") as f:
            f.write(SECRET)
        print(SECRET, flush=True)   # into rank 0's output file, out-0, in the run folder
    return _meet(put, lambda: open(path).read() + " / " + open(os.path.join(run_dir, "out-0")).read())


def the_sibling_s_proc():
    def put():
        with open("/tmp/seen-through-proc", "w") as f:
            f.write(SECRET)

    def get():
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and open(f"/proc/{pid}/comm").read().strip() == "distlab-rank0":
                    return open(f"/proc/{pid}/root/tmp/seen-through-proc").read()
            except OSError as exc:
                last = exc
        raise last
    return _meet(put, get)


def _signalled_by_rank_1(send):
    """Rank 1 runs send(libc); rank 0 answers whether a SIGWINCH (ignored by default) reached it."""
    import torch.distributed as dist
    libc = ctypes.CDLL(None, use_errno=True)
    got = []
    signal.signal(signal.SIGWINCH, lambda *_: got.append(1))
    dist.barrier()
    sent = send(libc) if dist.get_rank() == 1 else None
    time.sleep(0.5)
    dist.barrier()
    signal.signal(signal.SIGWINCH, signal.SIG_DFL)
    return f"{SECRET}: rank 0 got rank 1's signal" if got else f"no signal came ({sent})"


def signal_the_sibling():
    """Rank 1 finds rank 0 by its name in /proc and signals it through libc. (Rank 0's answer.)"""
    def send(libc):
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and open(f"/proc/{pid}/comm").read().strip() == "distlab-rank0":
                    libc.kill(int(pid), signal.SIGWINCH)
            except OSError:
                pass
    return _signalled_by_rank_1(send)


def signal_the_process_group():
    """Rank 1 signals its whole process group (kill(0, ...)). (Rank 0's answer.)"""
    return _signalled_by_rank_1(lambda libc: libc.kill(0, signal.SIGWINCH))


def undo_the_room():
    """Unmount the private /tmp (to reach the shared one beneath), from the main thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(b"/tmp", 2) != 0:
        return f"refused: {os.strerror(ctypes.get_errno())}"
    return "unmounted"


def _task(native_id):
    """The folder of /proc/self/task of a thread: a rank in its room is numbered by its own pid
    namespace (native_id) and by the sandbox's (/proc): the NSpid line has both."""
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/status") as status:
            if any(line.startswith("NSpid:") and int(line.split()[-1]) == native_id for line in status):
                return task
    return str(native_id)


def threads_in_the_room():
    main = os.readlink("/proc/self/ns/mnt")   # the room's: the main thread entered it
    return {t.name: os.readlink(f"/proc/self/task/{_task(t.native_id)}/ns/mnt") == main for t in threading.enumerate()
            if t is not threading.main_thread() and t.name.startswith("distlab")}


def descriptors():
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:   # the listing's own descriptor, closed by now
            pass
    return found


def fill(folder, size, count):
    made = 0
    block = b"x" * size
    try:
        for i in range(count):
            with open(os.path.join(folder, f"fill-{i}"), "wb") as f:
                f.write(block)
            made += 1
    except OSError as exc:
        return made, exc.strerror
    return made, None


def start_a_child():
    """Fork a child that sleeps (a call's processes must end with the call)."""
    pid = os.fork()
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    sys.distlab_test_child = pid
    return pid


def the_child_is_alive():
    try:
        os.kill(sys.distlab_test_child, 0)
        return True
    except ProcessLookupError:
        return False


def start_twenty_children():
    for _ in range(20):
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    time.sleep(30)   # the watchdog ends this rank long before


def ranks_left():
    """Processes of a rank (or its keeper) still in the sandbox."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and open(f"/proc/{pid}/comm").read().startswith("distlab-"):
                found.append(open(f"/proc/{pid}/comm").read().strip())
        except OSError:
            pass
    return found


def honest():
    import torch, torch.distributed as dist
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.tolist()


room = sys.argv[2] == "room"
caps = [{"module": "distlab.grade.boundary.limits", "function": "apply", "when": "start", "kwargs": {"processes": 8}}]
pool = Pool(2, launcher="fork", start_setup=rank_room.around(caps) if room else caps)
pool.start()
found = {"honest before": pool.run(honest, timeout=60)}
for folder in ("/tmp", "/dev/shm", ".", "~"):
    found[f"file in {folder}"] = pool.run(in_folder, folder, timeout=60)[1]
for attack in (posix_shared_memory, sysv_shared_memory, the_ranks_store, a_store_of_its_own,
               abstract_unix_socket, the_run_folder, the_sibling_s_proc):
    found[attack.__name__] = pool.run(attack, timeout=60)[1]
for attack in (signal_the_sibling, signal_the_process_group):
    found[attack.__name__] = pool.run(attack, timeout=60)[0]
if room:
    found["undo the room"] = pool.run(undo_the_room, timeout=60)
    found["threads"] = pool.run(threads_in_the_room, timeout=60)
    found["descriptors"] = pool.run(descriptors, timeout=60)
    for folder in ("/tmp", "/dev/shm"):
        found[f"20000 files in {folder}"] = pool.run(fill, folder, 1, 20_000, timeout=120)
        found[f"10 GB in {folder}"] = pool.run(fill, folder, 2**20, 10 * 1024, timeout=120)
    found["10 GB in ."] = pool.run(fill, ".", 2**20, 10 * 1024, timeout=120)
    found["a call's child"] = pool.run(start_a_child, timeout=60)
    found["its child after the call"] = pool.run(the_child_is_alive, timeout=60)
found["honest after"] = pool.run(honest, timeout=60)
pool.stop()
with options.setup_steps(pool.start_setup):   # a cold run of its own, as the clean room starts some
    found["cold run"] = distlab.run(in_folder, "/tmp", nprocs=2, launcher="fork", timeout=60)[1]
if room:   # the process cap, counted and enforced from inside the room
    with Pool(2, launcher="fork", start_setup=rank_room.around(caps)) as pool:
        try:
            pool.run(start_twenty_children, timeout=60)
            found["past the process cap"] = "not stopped"
        except Exception as exc:
            found["past the process cap"] = str(exc)
    found["left after the pools"] = ranks_left()
print("FOUND " + json.dumps(found))
''')


def run_attacks(folder, room: bool) -> dict:
    program = folder / "attacks.py"
    program.write_text(PROGRAM)
    folder.chmod(0o755)
    bubblewrap.hand_over(str(folder))
    argv = bubblewrap.command([sys.executable, str(program), SECRET, "room" if room else "open"],
                              writable=[str(folder)], cwd=str(folder))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("FOUND ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(lines[-1][len("FOUND "):])


ATTACKS = ["cold run", "file in /tmp", "file in /dev/shm", "file in .", "file in ~", "posix_shared_memory",
           "sysv_shared_memory", "the_ranks_store", "a_store_of_its_own", "abstract_unix_socket", "the_run_folder",
           "the_sibling_s_proc", "signal_the_sibling", "signal_the_process_group"]


@pytest.fixture(scope="module")
def open_ranks(tmp_path_factory):
    return run_attacks(tmp_path_factory.mktemp("open"), room=False)


@pytest.fixture(scope="module")
def ranks_in_rooms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rooms")
    disk_before = shutil.disk_usage(folder).used
    found = run_attacks(folder, room=True)
    found["host disk grew by"] = shutil.disk_usage(folder).used - disk_before
    found["left in the folder"] = sorted(os.listdir(folder))
    return found


@pytest.mark.parametrize("attack", ATTACKS)
def test_without_the_room_each_attack_moves_the_secret(open_ranks, attack):
    """The attacks are real: the sandbox alone lets ranks of one user meet all these ways."""
    assert SECRET in open_ranks[attack], open_ranks[attack]


@pytest.mark.parametrize("attack", ATTACKS)
def test_in_its_room_no_rank_reaches_another(ranks_in_rooms, attack):
    assert ranks_in_rooms[attack] is not None and SECRET not in ranks_in_rooms[attack], ranks_in_rooms[attack]


def test_the_process_group_works_before_and_after_every_attack(open_ranks, ranks_in_rooms):
    for found in (open_ranks, ranks_in_rooms):
        assert found["honest before"] == found["honest after"] == [[3.0] * 3, [3.0] * 3]


def test_a_rank_cannot_undo_its_room_and_its_threads_are_inside(ranks_in_rooms):
    assert all(answer.startswith("refused") for answer in ranks_in_rooms["undo the room"])
    for threads in ranks_in_rooms["threads"]:
        assert {"distlab-rank-state", "distlab-limits-watchdog"} <= set(threads) and all(threads.values()), threads


def test_in_its_room_a_rank_s_processes_are_counted_capped_and_ended(ranks_in_rooms):
    """The room's process-id namespace numbers a rank's children otherwise than /proc does: the
    watchdog still counts them and stops the rank past its cap, and what a call started still
    ends with the call."""
    assert all(isinstance(pid, int) for pid in ranks_in_rooms["a call's child"])
    assert ranks_in_rooms["its child after the call"] == [False, False]
    stopped = ranks_in_rooms["past the process cap"]   # the watchdog's exit code, passed on by the keeper
    assert f"exited with code {limits.EXIT_TOO_MANY_PROCESSES}" in stopped, stopped
    assert ranks_in_rooms["left after the pools"] == []


def test_a_rank_holds_no_descriptor_of_a_shared_place(ranks_in_rooms):
    """Its standard input is /dev/null and its output its own files; the rest is the process
    group's (sockets, gloo's pipes and event queue): nothing open on a folder or file of another."""
    for rank, held in enumerate(ranks_in_rooms["descriptors"]):
        files = [h for h in held if not h.startswith(("socket:", "pipe:", "anon_inode:"))]
        assert sorted(os.path.basename(h) for h in files) == [f"err-{rank}", "null", f"out-{rank}"], held


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
def test_many_files_or_ten_gigabytes_stop_at_the_cap(ranks_in_rooms, folder):
    for made, why in ranks_in_rooms[f"20000 files in {folder}"]:
        assert made < rank_room.FOLDER_FILES and why == "No space left on device"
    for made, why in ranks_in_rooms[f"10 GB in {folder}"]:
        assert made <= rank_room.FOLDER_MB and why == "No space left on device"


def test_the_working_folder_is_capped_and_the_host_s_disk_unchanged(ranks_in_rooms):
    for made, why in ranks_in_rooms["10 GB in ."]:
        assert made <= rank_room.FOLDER_MB and why == "No space left on device"
    assert ranks_in_rooms["left in the folder"] == ["attacks.py"]   # nothing a rank wrote reached it
    assert ranks_in_rooms["host disk grew by"] < 64 * 2**20


def test_every_chapter_s_ranks_lose_the_network_those_that_make_groups_too():
    """Chapters 4, 5 and 7 make groups and meshes of their own: on the relay that needs no network
    (test_relay's mesh and new_group test), so their ranks lose it like every other chapter's."""
    steps = {s["function"]: s for s in rank_room.around([{"module": "m", "function": "f", "when": "start",
                                                          "kwargs": {}}])}
    assert list(steps) == ["prepare", "f", "enter"] and steps["enter"]["kwargs"] == {"network": True}


@pytest.mark.parametrize("env, own", [({"DISTLAB_BACKEND": "gloo"}, True), ({"DISTLAB_BACKEND": "relay"}, True),
                                       ({"DISTLAB_BACKEND": "nccl"}, False),
                                       ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "2"}, False),
                                       ({"CUDA_VISIBLE_DEVICES": "0", "LOCAL_WORLD_SIZE": "2"}, True),
                                       ({"CUDA_VISIBLE_DEVICES": "", "LOCAL_WORLD_SIZE": "2"}, True)])
def test_ranks_that_may_join_nccl_keep_the_sandbox_s_process_ids(monkeypatch, env, own):
    for name in ("DISTLAB_BACKEND", "CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rank_keeper.wanted() is own


PROBE = textwrap.dedent(r'''
import sys
from distlab.grade.boundary import rank_room
from distlab.runtime.pool import Pool

CODE = sys.argv[1]


def import_and_write():
    """In the room: import a module from CODE, then try to leave a file there."""
    sys.path.insert(0, CODE)
    import room_probe_module
    try:
        open(CODE + "/left-by-a-rank", "w").close()
        wrote = "wrote"
    except OSError as exc:
        wrote = type(exc).__name__
    return room_probe_module.ANSWER, wrote


caps = [{"module": "distlab.grade.boundary.limits", "function": "apply", "when": "start", "kwargs": {"processes": 8}}]
with Pool(2, launcher="fork", start_setup=rank_room.around(caps)) as pool:
    print("FOUND", pool.run(import_and_write, timeout=60))
''')


def test_code_shown_read_only_under_tmp_stays_importable_and_read_only_in_the_room(tmp_path, monkeypatch):
    """A clone of the course in /tmp (as a fresh clone may be) puts its code in a read-only mount
    inside the sandbox's /tmp; the rank's own /tmp must not hide it (it once did: every graded
    rank failed to import distlab.grade.boundary.protect and the whole class scored 0), and what is shown
    again must stay read-only, or it would be a folder every rank shares."""
    code = tempfile.mkdtemp(prefix="distlab-room-code-", dir="/tmp")
    try:
        with open(os.path.join(code, "room_probe_module.py"), "w") as module:
            module.write("ANSWER = 42\n")
        os.chmod(code, 0o755)
        monkeypatch.syspath_prepend(code)   # a readable root of the sandbox, as a clone's src/ would be
        (tmp_path / "probe.py").write_text(PROBE)
        tmp_path.chmod(0o755)
        bubblewrap.hand_over(str(tmp_path))
        argv = bubblewrap.command([sys.executable, str(tmp_path / "probe.py"), code],
                                  writable=[str(tmp_path)], cwd=str(tmp_path))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        assert "FOUND [(42, 'OSError'), (42, 'OSError')]" in done.stdout, done.stdout[-3000:]
        assert os.listdir(code) == ["room_probe_module.py"]
    finally:
        shutil.rmtree(code)


@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "exit 5"])
def test_a_keeper_ends_as_its_rank_ended(end):
    """The launcher reads the keeper's end as the rank's. A rank the out-of-memory killer ended
    (SIGKILL) once left its keeper raising EINVAL from ``signal.signal(SIGKILL, ...)`` and going
    on as a second copy of the rank, so the run waited for its timeout instead of naming the
    dead rank (test_submission_caps' ``memory_in_many_ranks``)."""
    keeper = os.fork()
    if keeper == 0:
        try:
            rank_keeper.split_off()       # returns in the child, which is the rank from now on
            if end == "exit 5":
                os._exit(5)
            os.kill(os.getpid(), getattr(signal, end))
            time.sleep(5)
        finally:
            os._exit(3)                   # neither the rank nor the keeper should get here
    _, status = os.waitpid(keeper, 0)
    expected = 5 if end == "exit 5" else -getattr(signal, end)
    assert os.waitstatus_to_exitcode(status) == expected
