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

The split product's backward is a custom op (``split_linear_input_gradient``, ``torch.library``):
the compiler traces an ``autograd.Function``'s backward into the block's backward graph, where it
could not hand ``(X, dY)`` to a store, but calls an opaque op as it is, side effects included, so
each block compiles whole (``planner.runtime.gpt.compile_split_stage``) and the product itself, in
forward, is the graph's own kernel (``split_linear``: an ``autograd.Function`` around ``F.linear``).
Compiled between its linear layers instead (five compiled pieces and four eager products a block),
a ZB-H1 stage's forward took its host 0.151-0.175 s an iteration against 0.060 s for 1F1B's whole
compiled blocks (2x H200, GPT-3 XL, 12 blocks at micro-batch 2, ``plan launch --profile``), and the
host set the iteration's pace; with the product a custom op in forward too, 0.067 s
(``benchmarks/split_host.py`` times the host's share on a CPU).
"""

import types
import weakref
from typing import Optional

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
        """Add ``dW = dY^T X`` and ``db = sum dY`` of every deferred layer to its ``.grad``: a
        gradient already there takes the product in place (one ``addmm_``, no product tensor)."""
        for weight, bias, x, grad in work:
            grad, x = grad.flatten(0, -2), x.flatten(0, -2)
            if weight.grad is not None and weight.grad.dtype == grad.dtype == x.dtype:
                weight.grad.addmm_(grad.t(), x)
            else:
                _accumulate(weight, grad.t() @ x)
            if bias is not None:
                _accumulate(bias, grad.sum(0))


def _accumulate(parameter: torch.Tensor, grad: torch.Tensor) -> None:
    if parameter.grad is None:
        parameter.grad = grad.to(parameter.dtype)
    else:
        parameter.grad.add_(grad)


# Each product's backward finds its layer by its weight's storage (``_layer``): inside a compiled
# graph the op sees tensors, not the module's parameters. A parameter's storage may move after it
# was registered (a tensor group's whole parameters join a flat buffer at the first broadcast,
# ``planner.runtime.tensor_parallel``), so a miss looks the registered layers up again. Weak
# references, so that a stage (or a ``plan calibrate`` probe) that goes frees its layers.
_REGISTERED = []  # (store, weight, bias or None), each a weakref.ref
_BY_STORAGE = {}  # weight.data_ptr() -> its entry of _REGISTERED, as last looked up


@torch.library.custom_op("planner::split_linear_input_gradient", mutates_args=())
def _input_gradient(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``dX = dY W``; while the layer's store defers, ``(X, dY)`` wait in it for the weight pass,
    else ``dW`` (and ``db``) are added to the layer's parameters at once."""
    store, parameter, bias = _layer(weight)
    if parameter.requires_grad:
        bias = bias if bias is not None and bias.requires_grad else None
        if store.deferring:
            store.pending.append((parameter, bias, x, grad))
        else:
            store.apply([(parameter, bias, x, grad)])
    return grad @ weight


@_input_gradient.register_fake
def _(grad, x, weight):
    return x.new_empty(x.shape)


# Its weight gradients are a side effect: a compiled graph whose ``dX`` nobody uses (an input that
# takes no gradient) must still call it, not drop it as dead code.
torch.fx.node.has_side_effect(torch.ops.planner.split_linear_input_gradient.default)


class _SplitLinear(torch.autograd.Function):
    """``F.linear`` whose backward is ``_input_gradient``: the input's gradient, the weights' deferred
    or added by the op itself. The compiler traces both halves into the block's graphs: the product
    in forward as its own kernel, the op in backward as an opaque call."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return _input_gradient(grad, x, weight), None, None


def split_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` whose backward gives the input's gradient and defers or adds the weights'."""
    return _SplitLinear.apply(x, weight, bias)


def _register(store: WeightGradients, weight: nn.Parameter, bias) -> None:
    entry = tuple(weakref.ref(t) if t is not None else _none for t in (store, weight, bias))
    _REGISTERED.append(entry)
    _BY_STORAGE[weight.data_ptr()] = entry  # routed again: the latest store takes the gradients


def _none():
    return None


def _layer(weight: torch.Tensor) -> tuple:
    """(store, weight parameter, bias parameter or None) of the layer whose weight is ``weight``."""
    entry = _BY_STORAGE.get(weight.data_ptr())
    layer = _live(entry, weight)
    if layer is None:  # its storage moved (or another layer's went): look every live layer up again
        _REGISTERED[:] = [e for e in _REGISTERED if e[0]() is not None and e[1]() is not None]
        _BY_STORAGE.clear()
        for e in _REGISTERED:  # the latest registration of a weight wins, as in ``_register``
            _BY_STORAGE[e[1]().data_ptr()] = e
        layer = _live(_BY_STORAGE.get(weight.data_ptr()), weight)
        if layer is None:
            raise RuntimeError("split_linear: a weight of no layer that defer_weight_gradients routed")
    return layer


def _live(entry, weight: torch.Tensor):
    """The entry's (store, weight, bias) where its store and weight live and the weight is ``weight``'s
    tensor (the same storage, shape and type), else None."""
    if entry is None:
        return None
    layer = tuple(ref() for ref in entry)
    store, parameter = layer[0], layer[1]
    if store is None or parameter is None or parameter.data_ptr() != weight.data_ptr() \
            or parameter.shape != weight.shape or parameter.dtype != weight.dtype:
        return None
    return layer


def defer_weight_gradients(module: nn.Module) -> WeightGradients:
    """Route every linear layer of ``module`` (its LM head's ``head_linear`` and row-parallel layers'
    ``matmul`` too) through ``split_linear``; returns the store whose ``deferring`` flag holds their
    weight gradients back (the module keeps it alive, as ``weight_gradients``; routed again, a new
    store takes them)."""
    store = WeightGradients()
    module.weight_gradients = store  # the registry holds stores weakly

    def linear(x, weight, bias=None):
        return split_linear(x, weight, bias)

    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            _register(store, layer.weight, layer.bias)
            layer.forward = types.MethodType(lambda self, x: linear(x, self.weight, self.bias), layer)
        elif callable(getattr(layer, "matmul", None)):  # a layer that names its product (a row-parallel one)
            _register(store, layer.weight, None)
            layer.matmul = linear
    if getattr(module, "is_last", False) and hasattr(module, "head_linear"):
        _register(store, module.head.weight if hasattr(module, "head") else module.embed.weight, None)
        module.head_linear = linear
    return store
