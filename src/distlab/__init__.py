"""distlab: run code on N ranks from a notebook, and the reference implementations of the book.

The pieces, one idea per module:

* :func:`run` (:mod:`distlab.launch`): call a function on N ranks through torchrun.
* :class:`Pool` (:mod:`distlab.pool`): keep N ranks warm between calls.
* :class:`RankError`, :class:`DistTimeout` (:mod:`distlab.errors`): what goes wrong, said clearly.
* :mod:`distlab.comm`: record every distributed call a rank makes, with its bytes.
* :func:`device` (:mod:`distlab.devices`): the device this rank should use.
* ``%load_ext distlab`` then ``%%distributed -n 4`` (:mod:`distlab.magic`): a cell on N ranks.

``import distlab`` is cheap: torch is imported only by the modules that need it.
"""

from distlab.errors import DistTimeout, LaunchError, RankError
from distlab.launch import MAX_NPROCS, run
from distlab.pool import Pool, active_pools, fresh_processes, start_pool, stop_pools
from distlab.serialize import NotPicklableError

__all__ = ["run", "Pool", "start_pool", "stop_pools", "active_pools", "fresh_processes", "RankError", "DistTimeout", "LaunchError", "NotPicklableError", "MAX_NPROCS",
           "comm", "device", "load_ipython_extension"]


def device():
    """The device this rank should put its tensors on: ``cuda:LOCAL_RANK`` under NCCL, else CPU."""
    from distlab.devices import device as _device

    return _device()


def load_ipython_extension(ipython):
    """``%load_ext distlab`` registers the ``%%distributed`` cell magic."""
    from distlab.magic import register

    register(ipython)


def __getattr__(name):
    if name == "comm":  # imports torch, so only on first use
        import importlib

        return importlib.import_module("distlab.comm")
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")
