"""Zero bubble: split a backward pass in two, the input gradient now and the weight gradient later.

The previous stage waits for the gradient of this stage's *input* (the ``I`` pass); nobody
waits for the gradient of its *weights* (the ``W`` pass), which only the optimizer needs. A
stage whose linear layers defer their weight gradients (:func:`defer_weight_gradients`) can
answer the ``I`` quickly and run the ``W`` work when it would otherwise sit idle (Qi et al.,
2023, "Zero Bubble Pipeline Parallelism").
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab.pipeline_parallel.stages import Stage


class _LinearWeightGradientLater(torch.autograd.Function):
    """``y = x @ W.T + b`` whose backward returns ``dL/dx`` now and queues ``dL/dW``, ``dL/db`` for later.

    The input gradient ``dy @ W`` is what the previous stage is waiting for; the weight gradient
    ``dy.T @ x`` is needed only by the optimizer. Backward keeps ``dy`` and ``x`` in a closure
    (so the memory of ``x`` is held until the W pass) and returns ``None`` for the weight, which
    leaves ``.grad`` untouched until the closure runs.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, later):
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias, ctx.later = weight, bias, later    # the parameters themselves: .grad goes there
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        (x,), weight, bias = ctx.saved_tensors, ctx.weight, ctx.bias

        def weight_gradient():
            flat_dy, flat_x = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
            _accumulate(weight, flat_dy.t() @ flat_x)
            if bias is not None:
                _accumulate(bias, flat_dy.sum(0))

        ctx.later.append(weight_gradient)
        return (dy @ weight if ctx.needs_input_grad[0] else None), None, None, None


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    param.grad = grad if param.grad is None else param.grad + grad


class DeferredLinear(nn.Module):
    """Stands in for an ``nn.Linear`` (same ``weight`` and ``bias`` objects, same names) in a zero-bubble stage."""

    def __init__(self, linear: nn.Linear, later: list):
        super().__init__()
        self.weight, self.bias, self.later = linear.weight, linear.bias, later

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearWeightGradientLater.apply(x, self.weight, self.bias, self.later)


def defer_weight_gradients(stage: Stage) -> Stage:
    """Replace every ``nn.Linear`` of ``stage`` by a :class:`DeferredLinear` sharing ``stage.later``.

    After a backward through the stage, ``stage.later`` holds one job per linear layer; running
    them is the stage's W pass. The LayerNorms and embeddings still get their weight gradients
    during backward (a sum and a scatter-add: cheap), as in the zero-bubble paper's
    implementation: the linear layers' matrix products are where the time goes.
    """
    stage.later = []
    for parent in list(stage.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, DeferredLinear(child, stage.later))
    return stage
