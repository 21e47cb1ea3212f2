"""A backward split in two, for zero-bubble schedules (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", sec. 2): first the gradient of the stage's input, which the stage upstream waits for,
then, later, the gradients of the weights.

torch's own split is used (``torch.distributed.pipelining._backward``, what its zero-bubble
schedules run): the input pass walks the autograd graph once, computes the input's gradient and
keeps the gradients that arrive at the nodes leading to weights; the weight pass starts from those,
so no part of the backward runs twice. Works on eager modules: a compiled block's backward is one
node that yields input and weight gradients together (``plan launch`` runs these plans eager).
"""

import torch

__all__ = ["backward_input", "backward_weight"]


def _torch_split():
    try:
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    except ImportError as error:  # the split arrived with torch's pipelining package (2.4)
        raise RuntimeError(f"this torch ({torch.__version__}) has no split backward for zero-bubble schedules: "
                           "install torch 2.5 or later, or plan with --schedule 1f1b") from error
    return stage_backward_input, stage_backward_weight


def backward_input(output: torch.Tensor, output_grad: torch.Tensor | None, stage_input: torch.Tensor,
                   parameters: list) -> list:
    """Put the gradient of ``stage_input`` in its ``.grad`` from ``output`` (a loss when
    ``output_grad`` is None) and return what ``backward_weight`` needs to finish the backward."""
    forward_input, _ = _torch_split()
    _, pending = forward_input([output], None if output_grad is None else [output_grad], [stage_input],
                               iter(parameters))
    return pending


def backward_weight(parameters: list, pending: list) -> None:
    """Add the weights' gradients of the micro-batch whose ``backward_input`` returned ``pending``
    to the parameters' ``.grad``."""
    _, weight = _torch_split()
    weight(iter(parameters), pending)
