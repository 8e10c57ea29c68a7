"""torch's own ring attention (``torch.distributed.tensor.experimental``), run on the CPU beside ours.

torch 2.13's public API is a context manager::

    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

It shards the buffers along the sequence in place (with its head-tail load balancer: rank ``r``
gets chunks ``r`` and ``2N-1-r``, our :func:`~distlab.context_parallel.balance.balanced`),
replaces ``F.scaled_dot_product_attention`` with a version that wraps its inputs as DTensors
sharded along the sequence, and lets DTensor's dispatcher send the attention *kernels* to its
ring. It only knows the GPU kernels (flash, memory-efficient, cuDNN). On the CPU, SDPA calls
``_scaled_dot_product_flash_attention_for_cpu``, which the ring does not handle, so:

* causal attention raises ``NotImplementedError`` (the CPU kernel "does not have a sharding
  strategy registered");
* non-causal attention runs, but not as a ring: DTensor propagates shardings through the CPU
  kernel's decomposition op by op (minutes for a 16-token example on this machine's loaded
  cores), then all-gathers the keys and values and attends locally (two
  ``all_gather_into_tensor`` seen by ``CommDebugMode``).

The ring itself is kernel-agnostic: ``_templated_ring_attention(group, seq_dim, op, q, k, v,
is_causal)`` takes the attention kernel as an argument and needs only its ``(out, lse)``, and
its backward the kernel's backward. :func:`torch_ring_attention` hands it the CPU kernels, so the
same code torch runs on GPUs runs here, on the same shards as ours (these are private names of
torch 2.13, pinned by the project; a later torch may move them). What to notice beside ours:

* by default it does not pass blocks from neighbour to neighbour: it **all-gathers** every
  key/value block once (``_RotateMethod.ALL_GATHER``, as Llama 3 does), and only the gradient
  accumulators go round the ring (an ``all_to_all`` standing in for a shift by one);
* its merge, ``out - sigmoid(lse_b - lse)(out - out_b)``, is ours rewritten (``w_b`` is
  ``sigmoid(lse_b - lse_a)``), and runs in float32 whatever the inputs (``convert_to_f32``);
* its load balance works on two halves of a rank's tokens, our ring on its chunks: the same
  pairs of chunks are skipped.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def cp_options(**changes):
    """Set fields of torch's ``_cp_options`` (``enable_load_balance``, ``convert_to_f32``, ``rotate_method``)
    meanwhile, and put them back."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    before = {name: getattr(cp._cp_options, name) for name in changes}
    for name, value in changes.items():
        setattr(cp._cp_options, name, value)
    try:
        yield cp._cp_options
    finally:
        for name, value in before.items():
            setattr(cp._cp_options, name, value)


class TorchRingAttention(torch.autograd.Function):
    """torch's templated ring forward and backward, with the CPU flash-attention kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, group, options: dict):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp

        with cp_options(**options):
            out, lse = cp._templated_ring_attention(group, 2, cp.aten._scaled_dot_product_flash_attention_for_cpu,
                                                    q, k, v, is_causal=causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.group, ctx.options = causal, group, options
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp

        q, k, v, out, lse = ctx.saved_tensors
        with cp_options(**ctx.options):          # backward runs long after forward's options were put back
            grad_q, grad_k, grad_v = cp._templated_ring_attention_backward(
                ctx.group, 2, cp.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                grad_out.contiguous(), "grad_out", q, k, v, out, lse, ctx.causal, dropout_p=0.0)
        return grad_q, grad_k, grad_v, None, None, None


def torch_ring_attention(q, k, v, causal: bool = False, group=None, merge_in_float32: bool = True):
    """torch's ring attention of this rank's shard, differentiable; CPU tensors of ``(batch, heads, tokens, d)``.

    Causal: the shards must be in the balanced layout (torch's load balancer is on). Not
    causal: any equal split in rank order (contiguous), with load balancing off, as torch requires.
    """
    group = dist.group.WORLD if group is None else group
    options = {"enable_load_balance": causal, "convert_to_f32": merge_in_float32}
    return TorchRingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, group, options)
