"""A backward split in two, for zero-bubble schedules (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", sec. 2): first the gradient of the stage's input, which the stage upstream waits for,
then, later, the gradients of the weights.

Each linear layer's backward (``Y = X W^T + b``) computes ``dX = dY W`` at once and, while a
``WeightGradients`` store defers, keeps ``(X, dY)`` so that ``dW = dY^T X`` (and ``db``) run later
in the weight pass: the approach of the zero-bubble authors' Megatron-LM code (its
``WeightGradStore``). torch's own split (``torch.distributed.pipelining._backward``) walks the
autograd graph in Python for every micro-batch to find the weights' nodes; on 2x H100 (GPT-3 XL,
12 blocks a stage) that host work left the GPUs waiting: a zb-h1 iteration took 0.34-0.54 s against
0.355 s for 1F1B (``benchmarks/runtime_gpu.py``), so the split is done at the linear layers instead.
Norms and embeddings, a small share of the FLOPs, keep their weight gradients in the input pass.
A compiled block's backward is one node that cannot be split: under ZB-H1 ``plan launch`` compiles
only what lies between the linear layers (``planner.runtime.gpt.compile_between_linears``).
"""

import types

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["WeightGradients", "defer_weight_gradients"]


class WeightGradients:
    """The weight gradients a stage's linear layers left for later, in the order they arose."""

    def __init__(self):
        self.deferring = False
        self.pending = []  # (weight, bias or None, input X, output gradient dY)

    def take(self) -> list:
        """The weight gradients deferred since the last ``take`` (one micro-batch's input pass)."""
        work, self.pending = self.pending, []
        return work

    @staticmethod
    @torch.no_grad()
    def apply(work: list) -> None:
        """Add ``dW = dY^T X`` and ``db = sum dY`` of every deferred layer to its ``.grad``."""
        for weight, bias, x, grad in work:
            _accumulate(weight, _weight_grad(x, grad))
            if bias is not None:
                _accumulate(bias, grad.flatten(0, -2).sum(0))


def _weight_grad(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return grad.flatten(0, -2).t() @ x.flatten(0, -2)


def _accumulate(parameter: torch.Tensor, grad: torch.Tensor) -> None:
    if parameter.grad is None:
        parameter.grad = grad.to(parameter.dtype)
    else:
        parameter.grad.add_(grad)


class _SplitLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        # The parameters themselves: under recomputation saved tensors come back as other tensors.
        ctx.weight, ctx.bias, ctx.store = weight, bias, store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight
        if not ctx.needs_input_grad[1]:  # a weight that takes no gradient (a tensor group's follower's head)
            return grad_x, None, None, None
        if ctx.store.deferring:
            ctx.store.pending.append((ctx.weight, ctx.bias, x, grad))
            return grad_x, None, None, None
        grad_bias = grad.flatten(0, -2).sum(0) if ctx.bias is not None else None
        return grad_x, _weight_grad(x, grad), grad_bias, None


def defer_weight_gradients(module: nn.Module) -> WeightGradients:
    """Route every linear layer of ``module`` (its LM head's ``head_linear`` and row-parallel layers'
    ``matmul`` too) through the split
    backward; returns the store whose ``deferring`` flag holds their weight gradients back."""
    store = WeightGradients()

    def linear(x, weight, bias=None):
        return _SplitLinear.apply(x, weight, bias, store)

    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            layer.forward = types.MethodType(lambda self, x: linear(x, self.weight, self.bias), layer)
        elif callable(getattr(layer, "matmul", None)):  # a layer that names its product (a row-parallel one)
            layer.matmul = linear
    if hasattr(module, "head_linear"):
        module.head_linear = linear
    return store
