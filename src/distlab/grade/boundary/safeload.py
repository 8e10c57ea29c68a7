"""Loading data that student code produced, without letting it run code in the grader.

``pickle.loads`` runs code: a pickle can say "call ``os.system('...')``" and the loader
obeys. distlab's runtime sends results from the ranks back with pickle, which is fine in a
student's own notebook, but not in the grader, where the ranks run student code and the
loader runs in the process that decides the grade. So the grader uses two layers:

1. On the rank, the student's return value is encoded with ``torch.save`` and wrapped in
   bytes marked with :data:`MAGIC` (:func:`encode`).
2. In the grader, the pickle that carries those bytes is read by :class:`_DataOnlyUnpickler`,
   which refuses every global (no class, no function: only tuples, lists, dicts, strings,
   bytes, numbers, booleans, ``None`` and sets can be built). Marked bytes are then decoded
   with ``torch.load(..., weights_only=True)``, torch's loader for untrusted files, which
   builds tensors and plain containers and nothing else (:func:`loads`).

A forged result file can therefore at worst contain wrong data, which the tests reject.
"""

from __future__ import annotations

import io
import pickle

MAGIC = b"distlab-safe-data-v1\x00"


class UnsafeData(pickle.UnpicklingError):
    """The data asked for something other than plain data (a class, a function, ...)."""


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise UnsafeData(f"the grader refuses to load {module}.{name} from a rank's result: "
                         "results must be tensors, numbers, strings, lists, tuples or dicts")


def encode(value) -> bytes:
    """``value`` as marked bytes (on the rank). Raises ``TypeError`` for what cannot be plain data."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    blob = buffer.getvalue()
    try:
        torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - say what the grader accepts
        raise TypeError(f"the grader can only accept plain data as a result (tensors, numbers, "
                        f"strings, lists, tuples, dicts), got {type(value).__name__}: {exc}") from None
    return MAGIC + blob


def decode(blob: bytes):
    import torch

    return torch.load(io.BytesIO(blob[len(MAGIC):]), weights_only=True)


def _decode_marked(obj):
    if isinstance(obj, bytes) and obj.startswith(MAGIC):
        return decode(obj)
    if isinstance(obj, list):
        return [_decode_marked(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_decode_marked(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _decode_marked(v) for k, v in obj.items()}
    return obj


def loads(data: bytes):
    """Load a rank's result pickle as plain data, decoding the marked parts (see above)."""
    return _decode_marked(_DataOnlyUnpickler(io.BytesIO(data)).load())
