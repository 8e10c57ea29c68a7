"""The rank grid of 3D parallelism: which rank does what, and who talks to whom.

3D parallelism runs three kinds of parallelism at once, on ``N = dp * pp * tp`` ranks:

* **tp** (tensor parallel, chapter 5): ``tp`` ranks split every weight matrix of the same layers;
* **pp** (pipeline parallel, chapter 6): ``pp`` groups of layers (stages) run one after the other;
* **dp** (data parallel, chapters 3-4): ``dp`` copies of all that each train on a different
  part of the batch.

Every rank therefore has three **coordinates** ``(dp, pp, tp)``, and for every axis a
**group**: the ranks that share its two *other* coordinates. Rank 5 of the grid below
all-reduces its activations with its tp group ``[4, 5]``, hands them on to rank 7, the next
stage in its pp group ``[5, 7]``, and averages gradients with its dp group ``[1, 5]``: the
ranks that hold the same weights. A grid is just counting in a mixed
radix: the coordinates are the digits of the rank, **tp the fastest-varying digit**, then
pp, then dp::

    Grid(dp=2, pp=2, tp=2)         rank   dp pp tp        tp groups: [0,1] [2,3] [4,5] [6,7]
                                     0     0  0  0        pp groups: [0,2] [1,3] [4,6] [5,7]
                                     1     0  0  1        dp groups: [0,4] [1,5] [2,6] [3,7]
                                     2     0  1  0
                                     3     0  1  1
                                     4     1  0  0
                                     5     1  0  1
                                     6     1  1  0
                                     7     1  1  1

**Why this order** (``("dp", "pp", "tp")``, slowest to fastest; picotron's order, and what
``init_device_mesh(..., (dp, pp, tp))`` builds). Launchers number the ranks node by node,
so consecutive ranks share a node and its fast links (NVLink, hundreds of GB/s), while ranks
far apart talk over the network (tens of GB/s per GPU). The axis that talks most, and
waits for it, must get the consecutive ranks:

1. **tp innermost**: two all-reduces of the activations per layer forward and two backward,
   each blocking the next matrix multiply. Over the network this is hopeless, so tp groups
   are consecutive ranks and ``tp`` is at most the GPUs of a node (Megatron-LM, Narayanan
   et al., 2021, takeaway 1).
2. **pp next**: one activation per micro-batch to one neighbour, on the critical path but
   small; it can cross nodes.
3. **dp outermost**: one gradient reduction per step, the largest message but one that
   overlaps with backward (chapter 3): the most tolerant of a slow link.

Megatron-LM's default (``order="tp-cp-ep-dp-pp"``) swaps the outer two, putting pp
outermost: then each stage's dp group, whose gradient all-reduce is the largest message,
stays as close as possible, and only the small pipeline hand-offs cross the farthest links.
Both choices put tp innermost, the rule that matters most; ``Grid(..., order=("pp", "dp", "tp"))``
gives Megatron's layout, and the layout planner (:mod:`distlab.parallel3d.planner`) prices either.
Two more axes exist in the wild: context parallelism (``cp``, split the sequence) sits
next to tp, and expert parallelism (``ep``, :mod:`distlab.tensor_parallel.experts`) is carved out of the dp
ranks for the MoE layers only; they are left out here to keep three digits.

Everything above is pure arithmetic (:class:`Grid`, :func:`grid_for`): no process group,
no torch, usable in a notebook to draw the picture. On running ranks, :class:`ProcessGrid`
turns each group into a ``torch.distributed`` process group, and :func:`device_mesh` builds
torch's own ``DeviceMesh`` of the same layout; :func:`mesh_disagreements` checks that the two
agree rank for rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

AXES = ("dp", "pp", "tp")
"""The axes, outermost (slowest-varying, farthest apart) first: picotron's and torch's order."""


@dataclass(frozen=True)
class Grid:
    """Sizes of the three axes and their order; everything else is computed from them.

    ``order`` lists the axes from the slowest-varying to the fastest-varying digit of the rank.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    order: tuple[str, ...] = AXES

    def __post_init__(self):
        object.__setattr__(self, "order", tuple(self.order))
        if sorted(self.order) != sorted(AXES):
            raise ValueError(f"order must list each of {AXES} once, got {self.order!r}")
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"{axis} must be a positive int, got {size!r}")

    # -- sizes ----------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes in ``order``: the shape of the rank array (and of a DeviceMesh)."""
        return tuple(getattr(self, axis) for axis in self.order)

    def size(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; the axes are {AXES}")
        return getattr(self, axis)

    def stride(self, axis: str) -> int:
        """How far apart two neighbours along ``axis`` are: the product of the sizes inside it.

        tp (innermost) has stride 1: its groups are consecutive ranks.
        """
        inner = self.order[self.order.index(axis) + 1:]
        return prod(self.size(a) for a in inner)

    def check(self, world_size: int) -> None:
        """A ``ValueError`` unless the grid has exactly ``world_size`` ranks."""
        if self.world_size != world_size:
            raise ValueError(f"dp * pp * tp = {self.dp} * {self.pp} * {self.tp} = {self.world_size}, "
                             f"but there are {world_size} ranks; the three sizes must multiply to the world size")

    # -- coordinates ----------------------------------------------------------------------------

    def coords(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "pp": j, "tp": k}`` of ``rank``: its digits, tp the fastest-varying."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a grid of {self.world_size} ranks")
        return {axis: rank // self.stride(axis) % self.size(axis) for axis in AXES}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        """The rank at the given coordinates (the inverse of :meth:`coords`)."""
        where = {"dp": dp, "pp": pp, "tp": tp}
        for axis, index in where.items():
            if not 0 <= index < self.size(axis):
                raise ValueError(f"{axis} coordinate {index} is outside 0..{self.size(axis) - 1}")
        return sum(where[axis] * self.stride(axis) for axis in AXES)

    # -- groups ---------------------------------------------------------------------------------

    def group(self, rank: int, axis: str) -> list[int]:
        """The members of ``rank``'s group along ``axis``: same other coordinates, in ``axis`` order."""
        here = self.coords(rank)
        return [self.rank(**{**here, axis: i}) for i in range(self.size(axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, each once, ordered by its smallest rank.

        They partition the ranks: ``world_size / size(axis)`` groups of ``size(axis)`` ranks.
        """
        seen, out = set(), []
        for rank in range(self.world_size):
            if rank not in seen:
                members = self.group(rank, axis)
                seen.update(members)
                out.append(members)
        return out

    def table(self) -> str:
        """The picture of the module docstring: every rank's coordinates, then each axis's groups."""
        rows = ["rank  " + " ".join(f"{a:>3}" for a in AXES)]
        for rank in range(self.world_size):
            c = self.coords(rank)
            rows.append(f"{rank:>4}  " + " ".join(f"{c[a]:>3}" for a in AXES))
        for axis in AXES:
            rows.append(f"{axis} groups: " + " ".join("[" + ",".join(map(str, g)) + "]" for g in self.groups(axis)))
        return "\n".join(rows)


def grid_for(world_size: int, dp: int | None = None, pp: int = 1, tp: int = 1, order=AXES) -> Grid:
    """The grid of ``world_size`` ranks with the given sizes; ``dp=None`` means "all ranks left".

    >>> grid_for(8, tp=2, pp=2)
    Grid(dp=2, pp=2, tp=2, order=('dp', 'pp', 'tp'))
    """
    if dp is None:
        if world_size % (pp * tp):
            raise ValueError(f"pp * tp = {pp} * {tp} = {pp * tp} does not divide the world size {world_size}")
        dp = world_size // (pp * tp)
    grid = Grid(dp=dp, pp=pp, tp=tp, order=order)
    grid.check(world_size)
    return grid


# -- on running ranks ---------------------------------------------------------------------------

class ProcessGrid:
    """This rank's place in the grid, with a ``torch.distributed`` process group per axis.

    Call it on every rank, after ``init_process_group``::

        pg = ProcessGrid(Grid(dp=2, tp=2))
        dist.all_reduce(activations, group=pg.group("tp"))     # with my tp partners only
        dist.all_reduce(gradients, op=dist.ReduceOp.AVG, group=pg.group("dp"))

    **Every rank creates every group, in the same order**, including the groups it is not
    in. ``dist.new_group`` is a collective call of the *whole* world: the ranks agree on a
    group's identity by counting the calls (the n-th ``new_group`` of every rank is the same
    group), and the group's own backend is set up through the global store. A rank that
    skipped the groups it is not in would number the next ones differently, and the ranks
    would wait for each other in groups that do not match: a hang, not an error.
    (``new_group(..., use_local_synchronization=True)`` relaxes this for members-only calls,
    at the price of stricter rules about ordering; ``dist.new_subgroups_by_enumeration``
    does the loop below for one axis.)
    """

    def __init__(self, grid: Grid):
        import torch.distributed as dist

        grid.check(dist.get_world_size())
        self.grid = grid
        self.global_rank = dist.get_rank()
        self.coords = grid.coords(self.global_rank)
        self._groups, self._members = {}, {}
        for axis in AXES:                                  # same order on every rank ...
            for members in grid.groups(axis):              # ... and every group, mine or not
                group = dist.new_group(members)
                if self.global_rank in members:
                    self._groups[axis], self._members[axis] = group, members

    def group(self, axis: str):
        """My process group along ``axis``."""
        return self._groups[axis]

    def members(self, axis: str) -> list[int]:
        """The global ranks of my group along ``axis``, in order of their coordinate."""
        return list(self._members[axis])

    def size(self, axis: str) -> int:
        return self.grid.size(axis)

    def rank_in(self, axis: str) -> int:
        """My coordinate along ``axis``: my rank inside that group (``dist.get_rank(group)``)."""
        return self.coords[axis]

    # -- what a pipeline schedule needs ---------------------------------------------------------

    @property
    def is_first_stage(self) -> bool:
        return self.coords["pp"] == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords["pp"] == self.grid.pp - 1

    @property
    def previous_stage(self) -> int | None:
        """Global rank of the stage before mine (same dp and tp coordinates), or ``None``."""
        return None if self.is_first_stage else self._members["pp"][self.coords["pp"] - 1]

    @property
    def next_stage(self) -> int | None:
        """Global rank of the stage after mine, or ``None``."""
        return None if self.is_last_stage else self._members["pp"][self.coords["pp"] + 1]

    def __repr__(self) -> str:
        where = ", ".join(f"{a}={self.coords[a]}/{self.size(a)}" for a in AXES)
        return f"ProcessGrid(rank {self.global_rank}: {where})"


def device_mesh(grid: Grid, device_type: str = "cpu"):
    """torch's ``DeviceMesh`` of the same layout: ``init_device_mesh(device_type, shape, mesh_dim_names=order)``.

    Call on every rank (it creates a process group per mesh dimension, like
    :class:`ProcessGrid`). ``mesh["tp"]`` is then my tp sub-mesh, ``mesh["dp"].get_group()``
    my dp process group; FSDP2 and DTensor take these sub-meshes.
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, grid.shape, mesh_dim_names=grid.order)


def mesh_disagreements(grid: Grid, mesh) -> list[str]:
    """Where a ``DeviceMesh`` and the grid disagree on this rank (empty: they agree).

    Checks the whole rank array, and for each axis my coordinate and my group's members.
    """
    import torch.distributed as dist

    problems = []
    expected = list(range(grid.world_size))
    for size in reversed(grid.shape):          # the nested lists of a row-major arange
        expected = [expected[i:i + size] for i in range(0, len(expected), size)]
    if mesh.mesh.tolist() != expected[0]:
        problems.append(f"rank array {mesh.mesh.tolist()} != {expected[0]}")
    rank = dist.get_rank()
    coords = grid.coords(rank)
    for axis in AXES:
        sub = mesh[axis]
        if sub.get_local_rank() != coords[axis]:
            problems.append(f"{axis}: mesh coordinate {sub.get_local_rank()} != grid's {coords[axis]}")
        members = sub.mesh.tolist()
        if members != grid.group(rank, axis):
            problems.append(f"{axis}: mesh group {members} != grid's {grid.group(rank, axis)}")
        group_ranks = dist.get_process_group_ranks(sub.get_group())
        if group_ranks != grid.group(rank, axis):
            problems.append(f"{axis}: mesh process group {group_ranks} != grid's {grid.group(rank, axis)}")
    return problems
