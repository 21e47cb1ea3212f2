"""Lower bounds on the iteration time of any plan, so every heuristic answer reports a gap."""

import numpy as np

from cost_models import flops

__all__ = ["lower_bound_s", "work_flops"]


def lower_bound_s(topology, model, training) -> float:
    """Work bound: the iteration's training FLOPs spread perfectly over every device at its
    calibrated speed, with free communication: ``W / sum_d speed_d``. Valid for every plan the
    cost model can score, since each device computes at most at its speed and all work must be done.
    """
    return float(work_flops(topology, model, training) / np.sum(topology.effective_flops(training.precision)))


def work_flops(topology, model, training) -> float:
    """The iteration's training FLOPs as the cost model counts them (recomputation included; the
    head at the smallest calibrated head slowdown, never above 1)."""
    b = training.global_batch
    layer = flops.layer_forward_flops(b, model.sequence, model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp)
    head = flops.head_forward_flops(b, model.sequence, model.hidden, model.vocabulary)
    slowdown = min(float(topology.head_slowdowns().min()), 1.0)  # a faster head only lowers the bound
    return float(model.layers * layer * flops.training_flops_multiplier(training.recompute) + 3.0 * head * slowdown)
