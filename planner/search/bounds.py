"""Lower bounds on the iteration time of any plan, so every heuristic answer reports a gap."""

import math

import numpy as np

from cost_models.network import Sync
from cost_models.schedule import Schedule
from planner.plan.sync import syncs_for
from planner.prediction.stage_model import iteration_flops, layer_costs, least_gradient_bytes_per_param

__all__ = ["lower_bound_s", "work_bound_s", "work_flops"]


def work_bound_s(topology, model, training) -> float:
    """Work bound: the iteration's training FLOPs spread perfectly over every device at its
    calibrated speed, with free communication: ``W / sum_d speed_d``."""
    return float(work_flops(topology, model, training) / np.sum(topology.effective_flops(training.precision)))


def lower_bound_s(topology, model, training) -> float:
    """A bound on the iteration time of every plan the search can return.

    For each degree pair (S stages x D replicas) a plan could use, the larger of
    - the work bound over the ``S * D`` fastest devices (each device computes at most at its speed);
    - the gradient sync of the largest stage (at least ``params / S``): a ring all-reduce moves
      ``2 (D - 1) / D * n`` bytes over its slowest hop (Patarasuk & Yuan 2009), and that hop is no
      faster than the D-th best device's fastest outgoing link (NIC-capped), since the ring's D
      members cannot all be among the D - 1 best; DTFM's sharded exchange sends as much from each
      member over its own links. A parameter server or a hierarchical all-reduce (where
      ``training.sync`` allows them) still sends ``n`` out of that slowest member, or ``n`` in
      the leads' ring where it leads a host (``cost_models.network.Sync``), so ``n`` replaces
      ``2 (D - 1) / D * n`` then;
    - with two stages or more, the activations of the busiest replica (at least ``B / D`` of the
      global batch's ``B`` sequences) crossing one directed link, no faster than the fastest link;
    - the stage with the most layers (at least ``ceil(L / S)``) computed then synchronised: its
      all-reduce starts after every replica's last backward there (formulas.md, Pipeline schedules),
      and the replica with the most sequences (at least ``B / D``) runs them through those layers
      on one device no faster than the fastest; then its gradients (at least ``ceil(L / S)``
      layers' parameters) cross the ring as above;
    minimised over the pairs whose largest stage's state fits on the largest device. Never below
    ``work_bound_s``'s reasoning applied to the devices a pair uses, so at least as tight as it.
    """
    work = work_flops(topology, model, training)
    speed = np.sort(topology.effective_flops(training.precision))[::-1]
    fastest = np.cumsum(speed)
    per_sequence = layer_costs(model, training, 1, 1)  # the stage model for one sequence, one stage
    params = per_sequence.layers * per_sequence.layer_params + per_sequence.first_params  # the whole model
    # The least state a device can hold: the model's sharded over every device if sharding is allowed.
    state = params * layer_costs(model, training, 1, 1, topology.size).state_bytes_per_param
    fewest_stages = max(1, math.ceil(state / float(topology.memory_bytes().max())))
    layer_params = per_sequence.layer_params
    # a block's FLOPs as the fastest-counting device counts them (Device.block_slowdown)
    sequence_layer_flops = per_sequence.layer_flops * _least_block_slowdown(topology, training)
    gradient_bytes = least_gradient_bytes_per_param(per_sequence)  # PowerSGD: the best-compressed part's rate
    best_out = np.sort(topology.network.fastest_out_bytes_per_s())[::-1]  # each device's fastest outgoing link, best first
    n = topology.size
    whole_message_syncs = any(s in (Sync.HIERARCHICAL, Sync.PARAMETER_SERVER) for s in syncs_for(training, 2))
    best = np.inf
    for stages in range(fewest_stages, min(model.layers, n) + 1):
        replicas = np.arange(1, min(n // stages, training.global_batch) + 1)
        if replicas.size == 0:
            break
        compute = work / fastest[stages * replicas - 1]
        share = 2.0 * (replicas - 1) / replicas
        if whole_message_syncs:
            share = np.minimum(share, 1.0)
        ring = share / np.where(replicas > 1, best_out[replicas - 1], 1.0)  # s/byte
        sync = params / stages * gradient_bytes * ring
        pipe = 0.0
        if stages > 1:
            pipe = np.ceil(training.global_batch / replicas) * per_sequence.boundary_bytes / best_out[0]
        deepest = math.ceil(model.layers / stages)
        widest_stage = (training.global_batch / replicas * deepest * sequence_layer_flops / speed[0]
                        + deepest * layer_params * gradient_bytes * ring)
        best = min(best, float(np.maximum.reduce([compute, sync, np.broadcast_to(pipe, compute.shape),
                                                  widest_stage]).min()))
    return best if np.isfinite(best) else work_bound_s(topology, model, training)


def work_flops(topology, model, training) -> float:
    """The iteration's training FLOPs as the cost model counts them (recomputation included; the
    head at the smallest calibrated head slowdown, never above 1: a faster head only lowers the bound;
    the blocks at the smallest ``Device.block_slowdown``)."""
    slowdown = min(float(topology.head_slowdowns().min()), 1.0)
    return iteration_flops(model, training.global_batch, recompute=training.recompute, head_slowdown=slowdown,
                           block_slowdown=_least_block_slowdown(topology, training))


def _least_block_slowdown(topology, training) -> float:
    """The smallest ``Device.block_slowdown`` of the topology under ``training``'s recomputation and
    schedule (ZB-H1's split backward where it is the schedule asked for)."""
    return float(topology.block_slowdowns(training.recompute, training.schedule == Schedule.ZERO_BUBBLE).min())
