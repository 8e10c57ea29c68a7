"""The executor: one rank runs its list of actions, talking to its neighbours with ``isend``/``irecv``.

Receives are posted one action ahead (the message can arrive while the rank computes); sends
are waited for only at the end of the step (two neighbours sending to each other at once must
not both block). Every message carries a tag naming its micro-batch, chunk and direction.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.pipeline_parallel.schedules import Action
from distlab.pipeline_parallel.stages import Stage, micro_batches_of, rank_of
from distlab.pipeline_parallel.timeline import KINDS, _label, lane_name
from distlab.tools import memory
from distlab.tools.groups import global_rank, world
from distlab.tools.trace import Tracer


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of full ``(..., V)`` logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Executor:
    """Runs one rank's actions for one step, talking to the other ranks with ``isend``/``irecv``.

    ``chunks``: ``{chunk index: Stage}`` held by this rank. The state it keeps between actions:
    ``saved`` (a micro-batch's stage input and output, from its F until its backward),
    ``weight_jobs`` (a zero-bubble stage's W work, from its I until its W), the receives posted
    ahead (``posted``) and the sends not yet waited for. It counts the micro-batch chunks in flight and the bytes of activations they
    keep (counted with :func:`distlab.tools.memory.saved_activation_bytes`, plus the received input),
    with their peaks.
    """

    def __init__(self, chunks: dict[int, Stage], total_chunks: int, batch, micro_batches: int,
                 tracer: Tracer | None = None, delay: float = 0.0, group=None, loss_fn=None):
        """``loss_fn(outputs, targets)``: the mean loss of one micro-batch from the last stage's
        outputs; default, the cross-entropy of full logits. (A tensor-parallel last stage passes
        the vocab-parallel cross-entropy, so its logits are never gathered.)"""
        self.chunks, self.total_chunks, self.group = chunks, total_chunks, group
        self.loss_fn = loss_fn or _cross_entropy
        self.ranks, self.rank = world(group)
        self.inputs, self.targets = micro_batches_of(batch, micro_batches)
        self.m = micro_batches
        dim = next(iter(chunks.values())).dim
        self.shape = (*self.inputs[0].shape, dim)             # (micro-batch, seq, dim): what travels
        self.virtual = total_chunks // self.ranks
        self.tracer, self.delay = tracer, delay
        self.lane = lane_name(self.rank, self.ranks, total_chunks)
        self.saved, self.weight_jobs, self.sends, self.local, self.posted = {}, {}, [], {}, {}
        self.loss = None
        self.in_flight = self.peak_in_flight = 0
        self.live_bytes = self.peak_bytes = 0

    def run(self, actions: list[Action]) -> None:
        for k, action in enumerate(actions):
            if k + 1 < len(actions):                          # the next action's input may arrive meanwhile
                self.post_receive(actions[k + 1])
            {"F": self.forward, "B": self.backward, "I": self.backward, "W": self.weight}[action.kind](action)
        for work, _tensor in self.sends:                      # every message has left before the step ends
            work.wait()
        self.sends.clear()

    # -- messages ---------------------------------------------------------------------------------------

    def _tag(self, micro: int, chunk: int, what: str) -> int:
        """One number per message: micro-batch, receiving chunk, activation (0) or gradient (1)."""
        return (micro * self.total_chunks + chunk) * 2 + (what == "gradient")

    def send(self, tensor: torch.Tensor, micro: int, to_chunk: int, what: str) -> None:
        dst = rank_of(to_chunk, self.ranks)
        if dst == self.rank:                                  # the next chunk is on this rank (a 1-rank pipeline)
            self.local[(micro, to_chunk, what)] = tensor
            return
        tensor = tensor.contiguous()
        work = dist.isend(tensor, self._global(dst), group=self.group, tag=self._tag(micro, to_chunk, what))
        self.sends.append((work, tensor))

    def post_receive(self, action: Action) -> None:
        """Start receiving what ``action`` will need from another rank (if anything), without waiting."""
        stage = self.chunks[action.chunk]
        if action.kind == "F" and not stage.first:
            what, src_chunk = "activation", action.chunk - 1
        elif action.kind in "BI" and not stage.last:
            what, src_chunk = "gradient", action.chunk + 1
        else:
            return
        key, src = (action.micro, action.chunk, what), rank_of(src_chunk, self.ranks)
        if src != self.rank and key not in self.posted:
            buffer = torch.empty(self.shape)
            work = dist.irecv(buffer, self._global(src), group=self.group, tag=self._tag(*key))
            self.posted[key] = (work, buffer)

    def receive(self, micro: int, chunk: int, what: str) -> torch.Tensor:
        src = rank_of(chunk - 1 if what == "activation" else chunk + 1, self.ranks)
        if src == self.rank:
            return self.local.pop((micro, chunk, what))
        self.post_receive(Action("F" if what == "activation" else "B", micro, chunk))
        work, buffer = self.posted.pop((micro, chunk, what))
        work.wait()
        return buffer

    def _global(self, rank: int) -> int:
        """The global rank of pipeline rank ``rank`` (they differ inside a pipeline ``group``)."""
        return global_rank(self.group, rank)

    # -- the three kinds of work ----------------------------------------------------------------------------

    @contextmanager
    def _work(self, action: Action, cost: float):
        """Trace the action's compute, and sleep ``delay * cost / v`` inside it (pretend compute)."""
        span = self.tracer.span(_label(action, self.virtual), self.lane, KINDS[action.kind]) if self.tracer else nullcontext()
        with span:
            yield
            if self.delay:
                time.sleep(self.delay * cost / self.virtual)

    def forward(self, action: Action) -> None:
        micro, chunk = action.micro, action.chunk
        stage = self.chunks[chunk]
        x = self.inputs[micro] if stage.first else self.receive(micro, chunk, "activation").requires_grad_()
        with self._work(action, 1.0), memory.saved_activation_bytes() as saved:
            out = stage(x)
            if stage.last:                                    # this micro-batch's share of the full-batch mean
                out = self.loss_fn(out, self.targets[micro]) / self.m
        if stage.last:
            self.loss = out.detach() if self.loss is None else self.loss + out.detach()
        else:
            self.send(out.detach(), micro, chunk + 1, "activation")
        nbytes = saved.bytes + (0 if stage.first else memory.storage_bytes([x]))   # a leaf: the hook skips it
        self.saved[(micro, chunk)] = (x, out, nbytes)
        self._count(+1, nbytes)

    def backward(self, action: Action) -> None:
        """B (input and weight gradients) or I (input gradient; the W work is queued for later)."""
        micro, chunk = action.micro, action.chunk
        stage = self.chunks[chunk]
        x, out, nbytes = self.saved.pop((micro, chunk))
        grad = None if stage.last else self.receive(micro, chunk, "gradient")
        with self._work(action, 2.0 if action.kind == "B" else 1.0):
            torch.autograd.backward(out, grad)
        if not stage.first:
            self.send(x.grad, micro, chunk - 1, "gradient")
        if action.kind == "I":
            self.weight_jobs[(micro, chunk)] = (list(stage.later), nbytes)
            stage.later.clear()
        else:
            self._count(-1, nbytes)

    def weight(self, action: Action) -> None:
        jobs, nbytes = self.weight_jobs.pop((action.micro, action.chunk))
        with self._work(action, 1.0):
            for job in jobs:
                job()
        self._count(-1, nbytes)

    def _count(self, micro_batches: int, nbytes: int) -> None:
        self.in_flight += micro_batches
        self.live_bytes += micro_batches * nbytes
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
