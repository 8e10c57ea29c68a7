"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

A *mixture of experts* (MoE) layer replaces one MLP by ``E`` of them (the experts) and a tiny
*router*: a linear layer that scores every token against every expert. Each token goes only
to its best-scoring expert (top-1 routing, as in the Switch Transformer, Fedus et al., 2021),
and that expert's output is scaled by the router's probability for it, which is how the
router gets a gradient. ``E`` experts hold ``E`` times the parameters of one MLP, yet every
token still costs one MLP's compute.

**Expert parallelism** puts ``E / N`` experts on each of ``N`` ranks. Like data parallelism,
every rank starts with its own tokens (its part of the batch); unlike it, a token must
travel to the rank that holds its expert and its result must travel back. Both trips are
one ``all_to_all``: rank ``r`` sends to rank ``q`` exactly the tokens routed to ``q``'s experts.
It is tensor parallelism "along the batch dimension": the weights are split (by expert), the
tokens are split (by rank), and the all-to-all brings each token to its weights.

:class:`MoE` is the single-process reference; :class:`ExpertParallelMoE` its expert-parallel
twin, sliced from the same weights (:func:`parallelize_moe`). The steps of its forward:

1. route: the router (replicated, like a DDP model) picks an expert per token;
2. sort the tokens by destination rank and tell every rank how many to expect
   (a small ``all_to_all`` of counts: the splits change every step);
3. dispatch: ``all_to_all`` of the token vectors (:class:`_AllToAll`, whose backward is the
   reverse all-to-all of the gradients);
4. every rank runs its experts on the tokens it received;
5. combine: the reverse ``all_to_all`` brings each result home, unsorted, scaled by its gate.

Gradients: an expert sees tokens from every rank, so its gradient is complete on its owner
after backward (the reverse all-to-all carries every token's gradient to it). The router
is replicated and each rank only saw its own tokens: its gradient is summed over the ranks,
as in DDP (:func:`all_reduce_router_gradients`).

Kept out, to stay readable: a capacity limit per expert (real systems drop or re-route the
overflow so that every all-to-all has a fixed size), the load-balancing loss that keeps the
router from sending everything to one expert, and top-2 routing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    """One expert: a two-layer MLP, ``dim -> hidden -> dim``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def route(router: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 routing of tokens ``x`` of shape ``(tokens, dim)``: ``(expert id, gate)`` per token.

    The gate is the router's softmax probability of the chosen expert: differentiable, so the
    router learns which expert helps each token.
    """
    probabilities = F.softmax(router(x), dim=-1)
    gate, expert = probabilities.max(dim=-1)
    return expert, gate


class MoE(nn.Module):
    """The reference: a router and ``experts`` experts, all in one process."""

    def __init__(self, dim: int = 16, hidden: int = 32, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(tokens, dim)`` -> ``(tokens, dim)``, each token through its chosen expert."""
        expert, gate = route(self.router, x)
        out = torch.zeros_like(x)
        for e, module in enumerate(self.experts):
            mine = expert == e
            out[mine] = module(x[mine]) * gate[mine].unsqueeze(-1)
        return out


def build(seed: int = 0, **sizes) -> MoE:
    """A :class:`MoE` with weights fixed by ``seed`` (the same on every rank)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return MoE(**sizes)
    finally:
        torch.random.set_rng_state(state)


# -- the one collective, with its backward --------------------------------------------------------

def _all_to_all(x: torch.Tensor, send_counts: list[int], receive_counts: list[int], group) -> torch.Tensor:
    """Send ``x[rows for rank q]`` to every rank ``q``; return the rows received, in rank order."""
    out = x.new_empty((sum(receive_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive_counts,
                           input_split_sizes=send_counts, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """All-to-all forward; backward, the same exchange in reverse (each gradient goes home)."""

    @staticmethod
    def forward(ctx, x, send_counts, receive_counts, group):
        ctx.counts, ctx.group = (send_counts, receive_counts), group
        return _all_to_all(x, send_counts, receive_counts, group)

    @staticmethod
    def backward(ctx, grad):
        send_counts, receive_counts = ctx.counts
        return _all_to_all(grad, receive_counts, send_counts, ctx.group), None, None, None


def all_to_all(x, send_counts, receive_counts, group=None):
    """Differentiable all-to-all of the rows of ``x`` (``send_counts[q]`` rows go to rank ``q``)."""
    return _AllToAll.apply(x, list(send_counts), list(receive_counts), group)


# -- the expert-parallel layer ------------------------------------------------------------------------

class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with ``experts / N`` experts per rank; every rank routes its own tokens.

    Rank ``r`` holds experts ``r * E/N .. (r+1) * E/N - 1`` under their global names
    (``experts.0`` on rank 0 is expert ``r * E/N``), and a full copy of the router.
    """

    def __init__(self, dim: int = 16, hidden: int = 32, experts: int = 4, group=None):
        super().__init__()
        self.group = group
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if experts % n:
            raise ValueError(f"{experts} experts do not split evenly over {n} ranks; "
                             f"use a multiple of {n} experts")
        self.num_experts, self.per_rank = experts, experts // n
        self.first = rank * self.per_rank                    # my experts: first, first + 1, ...
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(self.per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = dist.get_world_size(self.group)
        expert, gate = route(self.router, x)                                  # 1. route
        order = torch.argsort(expert, stable=True)                            # 2. sort by expert,
        owner = expert // self.per_rank                                       #    so by owner rank
        send_counts = torch.bincount(owner, minlength=n)
        receive_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(receive_counts, send_counts, group=self.group)
        send, receive = send_counts.tolist(), receive_counts.tolist()

        arrived = all_to_all(x[order], send, receive, self.group)             # 3. dispatch
        arrived_expert = _all_to_all(expert[order], send, receive, self.group)
        results = torch.zeros_like(arrived)
        for local, module in enumerate(self.experts):                         # 4. my experts
            mine = arrived_expert == self.first + local
            results[mine] = module(arrived[mine])

        back = all_to_all(results, receive, send, self.group)                 # 5. combine
        out = torch.empty_like(back)
        out[order] = back                                                     # undo the sort
        return out * gate.unsqueeze(-1)


@torch.no_grad()
def parallelize_moe(reference: MoE, group=None) -> ExpertParallelMoE:
    """This rank's expert-parallel slice of ``reference``: the router, and its own experts."""
    first = reference.experts[0]
    layer = ExpertParallelMoE(first.fc1.in_features, first.fc1.out_features, len(reference.experts), group)
    layer.router.load_state_dict(reference.router.state_dict())
    for local, module in enumerate(layer.experts):
        module.load_state_dict(reference.experts[layer.first + local].state_dict())
    return layer


def reference_names(layer: ExpertParallelMoE) -> dict[str, str]:
    """``{name on this rank: name in the reference}``: local expert ``i`` is global ``first + i``."""
    names = {}
    for name, _ in layer.named_parameters():
        parts = name.split(".")
        if parts[0] == "experts":
            parts[1] = str(layer.first + int(parts[1]))
        names[name] = ".".join(parts)
    return names


def all_reduce_router_gradients(layer: ExpertParallelMoE) -> None:
    """Sum the router's gradient over the ranks: each rank's covers only its own tokens."""
    for p in layer.router.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=layer.group)
