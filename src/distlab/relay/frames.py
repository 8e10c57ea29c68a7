"""How the relay's messages look on a descriptor: a small header, then the tensors' bytes.

Every message between a rank and the router (:mod:`distlab.relay.router`), either way, is one
*frame*::

    [4 bytes: header length H][8 bytes: payload length P][H bytes: JSON header][P bytes: payload]

The header says what the frame is (``{"k": "send", "dst": 1, "tag": 0, "parts": [...]}``); the
payload is the raw bytes of the tensors it carries, one after the other, each described in
``parts`` by its dtype and shape (:func:`encode` and :func:`decode`). JSON and raw bytes, never
pickle: the router reads what ranks running a student's code wrote, and must not be talked
into running anything by it. A header larger than :data:`MOST_HEADER_BYTES` is refused.
"""

from __future__ import annotations

import json
import struct

PREFIX = struct.Struct("!IQ")
MOST_HEADER_BYTES = 1 << 20
"""A header holds ops, ranks and shapes: a megabyte is far more than any honest one needs."""


class BrokenFrame(Exception):
    """The other end wrote something that is not a frame (or hung up in the middle of one)."""


def pack(header: dict, payload_length: int) -> bytes:
    """The prefix and header of a frame whose payload of ``payload_length`` bytes follows."""
    text = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(len(text), payload_length) + text


def write(sock, header: dict, payload: list) -> None:
    """Send one frame on a blocking socket: ``payload`` is a list of byte buffers (memoryviews)."""
    size = sum(len(part) for part in payload)
    sock.sendall(pack(header, size))
    for part in payload:
        if len(part):
            sock.sendall(part)


def read_exactly(sock, count: int) -> bytearray:
    buffer = bytearray(count)
    view, got = memoryview(buffer), 0
    while got < count:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise BrokenFrame("the other end closed the connection")
        got += n
    return buffer


def read(sock) -> tuple[dict, bytearray]:
    """Read one frame from a blocking socket: ``(header, payload)``."""
    header_length, payload_length = PREFIX.unpack(read_exactly(sock, PREFIX.size))
    if header_length > MOST_HEADER_BYTES:
        raise BrokenFrame(f"a frame header of {header_length} bytes")
    header = parse_header(read_exactly(sock, header_length))
    return header, read_exactly(sock, payload_length)


def parse_header(raw) -> dict:
    try:
        header = json.loads(bytes(raw))
    except ValueError as exc:
        raise BrokenFrame(f"a frame header that is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise BrokenFrame("a frame header that is not a JSON object")
    return header


# -- tensors <-> parts and bytes ---------------------------------------------------------------------

def tensor_bytes(tensor) -> memoryview:
    """The bytes of a tensor as a flat buffer (a copy to the CPU first if it is elsewhere)."""
    import torch

    flat = tensor.detach().reshape(-1).contiguous()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def encode(tensors) -> tuple[list, list]:
    """``(parts, payload)``: each tensor's ``[dtype, shape]`` and its bytes."""
    parts = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
    return parts, [tensor_bytes(t) for t in tensors]


def decode(parts: list, payload) -> list:
    """The tensors a frame carries (CPU tensors sharing the payload's memory)."""
    import torch

    tensors, offset, view = [], 0, memoryview(payload)
    for dtype_name, shape in parts:
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise BrokenFrame(f"a part described as {dtype_name!r} {shape!r}")
        numel = 1
        for size in shape:
            numel *= size
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > len(view):
            raise BrokenFrame("a frame whose payload is shorter than its parts say")
        if nbytes:
            tensor = torch.frombuffer(view[offset:offset + nbytes], dtype=dtype).reshape(shape)
        else:
            tensor = torch.empty(shape, dtype=dtype)
        tensors.append(tensor)
        offset += nbytes
    if offset != len(view):
        raise BrokenFrame("a frame whose payload is longer than its parts say")
    return tensors


TAGS = range(-(1 << 31), 1 << 31)
"""The tags torch's ``send`` takes: a C ``int``."""


def wrong_envelope(tag, parts) -> str | None:
    """Why a ``send`` frame's tag and parts are not what torch's ``send`` makes, or ``None``.

    A message's payload is what the record counts (``nbytes``, the ``S`` of
    :mod:`distlab.tools.comm_bytes`); what travels with it, the tag and the description of the
    tensor, reaches the receiver too, uncounted. So the envelope is held to what an honest send
    has: one tensor of a real dtype, a tag that fits torch's 32 bits. A rank cannot then move
    data in a thousand empty parts or in a tag of a thousand digits; what is left is a few bytes
    per message, and every chapter that checks bytes also checks the number of messages.
    """
    import torch

    if isinstance(tag, bool) or not isinstance(tag, int) or tag not in TAGS:
        return f"a tag of {str(tag)[:40]!r} (torch's tags are 32-bit integers)"
    if not isinstance(parts, list) or len(parts) != 1:
        count = len(parts) if isinstance(parts, list) else "no list of"
        return f"{count} tensors in one message (a send carries one tensor)"
    part = parts[0]
    if not (isinstance(part, list) and len(part) == 2 and isinstance(part[0], str)
            and isinstance(getattr(torch, part[0], None), torch.dtype)):
        return f"a tensor described as {str(part)[:80]!r}"
    return None


def flat_parts(parts) -> list:
    """``parts`` with every shape flattened to its number of elements: a receiver copies into its
    own tensor's shape anyway, and a shape (of an empty tensor, say) must not carry data."""
    if not isinstance(parts, list):
        raise BrokenFrame(f"parts that are not a list: {parts!r:.80}")
    flat = []
    for part in parts:
        if not (isinstance(part, list) and len(part) == 2 and isinstance(part[1], list)
                and all(isinstance(s, int) and s >= 0 for s in part[1])):
            raise BrokenFrame(f"a part described as {part!r:.80}")
        numel = 1
        for size in part[1]:
            numel *= size
        flat.append([part[0], [numel]])
    return flat


def parts_bytes(parts: list) -> int:
    """How many payload bytes parts describe (what the record counts)."""
    import torch

    total = 0
    for dtype_name, shape in parts:
        numel = 1
        for size in shape:
            numel *= size
        total += numel * torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    return total
