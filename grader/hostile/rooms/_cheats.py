"""Code the hostile submissions of this folder put in their answers: ways for the ranks of one run
to hand each other their tensors without sending a message (``from _cheats import ...``; the test
puts this folder on the import path)."""

EXCHANGE_THROUGH = '''
import ctypes, io, os, sys, time
import torch
import torch.distributed as dist

_libc = ctypes.CDLL(None, use_errno=True)


def _raw_write(path, data):
    """Write a file through libc, past the grader's Python-level guard."""
    fd = _libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
    _libc.write(fd, data, len(data))
    _libc.close(fd)


def _raw_read(path):
    fd = _libc.open(path.encode(), os.O_RDONLY)
    if fd < 0:
        return None
    chunks, buffer = [], ctypes.create_string_buffer(1 << 16)
    while (got := _libc.read(fd, buffer, len(buffer))) > 0:
        chunks.append(buffer.raw[:got])
    _libc.close(fd)
    return b"".join(chunks)


def _next_call():
    """The same number on every rank: they all call in the same order (kept across cells on the rank)."""
    sys.cheat_calls = getattr(sys, "cheat_calls", 0) + 1
    return f"{os.environ.get('MASTER_PORT')}-{sys.cheat_calls}"


def exchange(tensor, folder=FOLDER):
    """Every rank's tensor, in rank order, passed through files in ``folder``: no message at all."""
    shown, folder = folder, os.path.expanduser(folder)
    n, r, call = dist.get_world_size(), dist.get_rank(), _next_call()
    name = lambda k: os.path.join(folder, f".cheat-{call}-{k}")
    buffer = io.BytesIO()
    torch.save(tensor.detach().clone(), buffer)
    _raw_write(name(r) + ".part", buffer.getvalue())
    _libc.rename(f"{name(r)}.part".encode(), name(r).encode())
    found = []
    for k in range(n):
        deadline = time.monotonic() + 5
        while (data := _raw_read(name(k))) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {k}'s tensor never appeared in {shown}")
            time.sleep(0.005)
        found.append(torch.load(io.BytesIO(data)))
    return found


def dummy_ring(numel, dtype):
    """What a ring would send, in zeros, so that the byte counts look like a ring's."""
    n, r = dist.get_world_size(), dist.get_rank()
    size = -(-numel // n)
    for _ in range(n - 1):
        out, back = torch.zeros(size, dtype=dtype), torch.empty(size, dtype=dtype)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, (r + 1) % n),
                                            dist.P2POp(dist.irecv, back, (r - 1) % n)]):
            work.wait()
'''


def through(folder: str) -> str:
    """:data:`EXCHANGE_THROUGH` with files in ``folder``."""
    return f"FOLDER = {folder!r}\n" + EXCHANGE_THROUGH


EXCHANGE_BY_SYSV = '''
import ctypes, os, sys, time
import torch
import torch.distributed as dist

_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


def exchange(tensor):
    """Every rank's tensor, in rank order, through SysV shared memory: no message at all."""
    n, r = dist.get_world_size(), dist.get_rank()
    sys.cheat_calls = getattr(sys, "cheat_calls", 0) + 1
    base = (int(os.environ.get("MASTER_PORT", "1")) * 1000 + sys.cheat_calls) * 16
    data = tensor.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    address = _libc.shmat(_libc.shmget(base + r, len(data) + 8, 0o1666), None, 0)
    ctypes.memmove(address + 8, data, len(data))
    ctypes.c_int64.from_address(address).value = len(data) + 1        # ready
    found = []
    for k in range(n):
        deadline = time.monotonic() + 5
        while (block := _libc.shmget(base + k, 0, 0o666)) < 0 or \\
                ctypes.c_int64.from_address(other := _libc.shmat(block, None, 0)).value == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {k}'s tensor never appeared in shared memory")
            time.sleep(0.005)
        size = ctypes.c_int64.from_address(other).value - 1
        raw = bytearray(ctypes.string_at(other + 8, size))
        found.append(torch.frombuffer(raw, dtype=torch.uint8).view(tensor.dtype).reshape(tensor.shape).clone()
                     if size else torch.empty(tensor.shape, dtype=tensor.dtype))
    return found
'''

EXCHANGE_BY_OWN_STORE = '''
import datetime, io, os, sys
import torch
import torch.distributed as dist
from torch.distributed import TCPStore

_stores = {}


def exchange(tensor):
    """Every rank's tensor, in rank order, through a TCPStore of the ranks' own (not a process group)."""
    n, r = dist.get_world_size(), dist.get_rank()
    port = int(os.environ["MASTER_PORT"]) + 7
    if port not in _stores:
        _stores[port] = TCPStore("127.0.0.1", port, n, r == 0, timeout=datetime.timedelta(seconds=5),
                                 wait_for_workers=False)
    store = _stores[port]
    sys.cheat_calls = getattr(sys, "cheat_calls", 0) + 1
    buffer = io.BytesIO()
    torch.save(tensor.detach().clone(), buffer)
    store.set(f"{sys.cheat_calls}-{r}", buffer.getvalue())
    return [torch.load(io.BytesIO(store.get(f"{sys.cheat_calls}-{k}"))) for k in range(n)]
'''

EXCHANGE_BY_THE_RANKS_STORE = '''
import io, sys
import torch
import torch.distributed as dist


def exchange(tensor):
    """Every rank's tensor, in rank order, through the store the ranks met in: no message at all."""
    n, r = dist.get_world_size(), dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    sys.cheat_calls = getattr(sys, "cheat_calls", 0) + 1
    buffer = io.BytesIO()
    torch.save(tensor.detach().clone(), buffer)
    store.set(f"cheat-{sys.cheat_calls}-{r}", buffer.getvalue())
    return [torch.load(io.BytesIO(store.get(f"cheat-{sys.cheat_calls}-{k}"))) for k in range(n)]
'''

ALL_REDUCE = '''

def ring_all_reduce(tensor):
    total = sum(x.to(torch.float64) for x in exchange(tensor)).to(tensor.dtype)
    dummy_ring(2 * tensor.numel(), tensor.dtype) if "dummy_ring" in globals() else None
    return total
'''

REDUCE_SCATTER = '''

def ring_reduce_scatter(tensor):
    total = sum(x.to(torch.float64) for x in exchange(tensor)).to(tensor.dtype)
    return torch.tensor_split(total, dist.get_world_size())[dist.get_rank()].clone()
'''

ALL_GATHER = '''

def ring_all_gather(chunk, numel):
    return torch.cat(exchange(chunk))
'''
