"""``%%distributed``: run a notebook cell on N ranks.

    %load_ext distlab

    %%distributed -n 4 --timeout 30
    t = torch.ones(2) * rank
    dist.all_reduce(t)
    t                      # the last expression: one value per rank comes back

How names travel
    *To the ranks*: every name the cell uses that exists in the notebook is pickled and
    sent (functions and classes defined in the notebook by value, imported modules by
    reference). Each rank also gets ``torch``, ``dist`` (``torch.distributed``), ``rank``,
    ``world_size`` and ``device``; these always win over notebook names of the same name.

    *Back to the notebook*: only the value of the cell's last expression, one per rank, as a
    list (shown as the cell's output; ``--out NAME`` also stores it in ``NAME``). Variables
    assigned on the ranks stay there and vanish with them; return what you need.

Time: a cell may run for ``DEFAULT_TIMEOUT`` seconds (10 minutes: a training cell on a node
shared by a class takes minutes) before :class:`distlab.DistTimeout` ends it. ``--timeout S``
gives one cell its own limit; ``%distributed --timeout S`` (the line magic, no action) sets
the limit of every later cell of the notebook (its kernel). A cell that runs out of time ends
with the message alone, no traceback through the runtime: what each rank was doing, and in
one line how to give the cell more time.

Warm ranks: ``%distributed start -n 4`` starts 4 ranks once (a few seconds); every later
``%%distributed -n 4`` cell (and ``distlab.run(..., nprocs=4)``) reuses them and costs
milliseconds instead of seconds. ``%distributed stop`` ends them; so does the kernel's end.

The cell must be plain Python: IPython syntax (``%magic``, ``!shell``) has no meaning on a rank.
Output, errors (:class:`distlab.RankError`) and timeouts (:class:`distlab.DistTimeout`)
behave exactly as in :func:`distlab.run`, which this calls.
"""

from __future__ import annotations

import ast
import re
import time

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from distlab.runtime import pool, serialize
from distlab.runtime.errors import DistTimeout, more_time
from distlab.runtime.run import run

CELL_FILENAME = "<distributed cell>"
GIVEN_ON_RANKS = {"torch", "dist", "rank", "world_size", "device"}
DEFAULT_TIMEOUT = 600.0
"""Seconds a ``%%distributed`` cell may run unless told otherwise. :func:`distlab.run` keeps
its 60 s (a library call in a test or a script); a teaching notebook's cell trains a model,
and on a hub's node shared by a class that takes minutes, not seconds."""


def run_cell_on_rank(source: str, namespace: dict):
    """Executed on every rank: run the cell's code, return the value of its last expression."""
    import linecache

    import torch
    import torch.distributed as dist

    from distlab.runtime.devices import device

    # Register the source so tracebacks show the cell's lines.
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    scope = {"__name__": "__distributed_cell__", **namespace, "torch": torch, "dist": dist,
             "rank": dist.get_rank(), "world_size": dist.get_world_size(), "device": device()}
    tree = ast.parse(source, CELL_FILENAME)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, CELL_FILENAME, "exec"), scope)
    return eval(compile(last, CELL_FILENAME, "eval"), scope) if last is not None else None


def names_to_send(source: str, user_ns: dict) -> dict:
    """The notebook variables the cell refers to (by plain name), ready to pickle."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}  # the rank will report the syntax error with its line
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    chosen = {}
    for name in sorted(used - GIVEN_ON_RANKS):
        if name.startswith("_") or name in ("In", "Out", "get_ipython", "exit", "quit") or name not in user_ns:
            continue
        why = serialize.why_not_picklable(user_ns[name])
        if why:
            raise serialize.NotPicklableError(
                f"%%distributed cannot send the notebook variable `{name}` "
                f"({type(user_ns[name]).__name__}) to the ranks: {why}. "
                "Create it inside the cell instead (each rank makes its own).")
        chosen[name] = user_ns[name]
    return chosen


@magics_class
class DistributedMagics(Magics):
    @magic_arguments()
    @argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    @argument("--timeout", type=float, default=None,
              help=f"seconds before DistTimeout (default {DEFAULT_TIMEOUT:g}; as a line magic with no "
                   "action: the default of every later cell)")
    @argument("--backend", default=None, help="gloo or nccl (default: chosen from the hardware)")
    @argument("--out", default=None, help="also store the per-rank results in this variable")
    @argument("action", nargs="?", choices=["start", "stop", "status"],
              help="line magic only: start or stop a warm pool of -n ranks, or show the pools")
    @line_cell_magic
    def distributed(self, line, cell=None):
        """Run this cell on N ranks: ``%%distributed -n 4 [--timeout S] [--out NAME]``.

        As a line magic, manage warm ranks that the following cells reuse:
        ``%distributed start -n 4``, ``%distributed stop``, ``%distributed status``.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.distributed, line)
        if cell is None:
            return self._manage_pools(args)
        if args.action:
            raise ValueError(f"%%distributed runs a cell; use the line magic for `{args.action}`")
        namespace = names_to_send(cell, self.shell.user_ns)
        timeout = args.timeout if args.timeout is not None else self.timeout
        try:
            results = run(run_cell_on_rank, cell, namespace, nprocs=args.nprocs,
                          timeout=timeout, backend=args.backend)
        except DistTimeout as timed_out:
            raise timed_out.with_hint(self.hint(timed_out, line)) from None
        if args.out:
            self.shell.user_ns[args.out] = results
        return results if any(r is not None for r in results) else None

    @property
    def timeout(self) -> float:
        """This notebook's default for a cell (``%distributed --timeout S`` sets it)."""
        return getattr(self, "_timeout", DEFAULT_TIMEOUT)

    @staticmethod
    def hint(timed_out: DistTimeout, line: str) -> str:
        """How to give this cell more time, in one line, with the cell's own first line changed."""
        if timed_out.waiting_for == "start":
            return timed_out.hint
        more = more_time(timed_out.timeout)
        options = re.sub(r"\s*--timeout(=|\s+)\S+", "", line).strip()
        first_line = f"%%distributed {options} --timeout {more}".replace("  ", " ")
        return (f"To give it more time, make the cell's first line `{first_line}`, "
                f"or run `%distributed --timeout {more}` once for every cell of this notebook.")

    def _manage_pools(self, args) -> None:
        if args.action is None and args.timeout is not None:
            if args.timeout <= 0:
                raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
            self._timeout = args.timeout
            print(f"distlab: %%distributed cells now run for up to {args.timeout:g} s "
                  "(a cell's own --timeout still wins)")
        elif args.action == "start":
            started = time.monotonic()
            pool.start_pool(args.nprocs, backend=args.backend)
            print(f"distlab: {args.nprocs} ranks ready in {time.monotonic() - started:.1f} s; "
                  f"cells with -n {args.nprocs} and distlab.run(..., nprocs={args.nprocs}) now reuse them")
        elif args.action == "stop":
            pool.stop_pools()
            print("distlab: pools stopped")
        elif args.action == "status":
            pools = pool.active_pools()
            print("distlab: no active pool" if not pools else
                  "distlab: active pools: " + ", ".join(f"{p.nprocs} ranks" + (f" ({p.backend})" if p.backend else "")
                                                      for _, p in sorted(pools.items(), key=lambda kv: str(kv[0]))))
        else:
            raise ValueError("use %distributed start -n N, %distributed stop, %distributed status "
                             "or %distributed --timeout S")


def register(ipython) -> None:
    ipython.register_magics(DistributedMagics)
