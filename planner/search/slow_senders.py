"""Devices too slow to send a replica's messages: the lower bound's split by the slowest sender.

In a plan of ``S >= 2`` stages every micro-batch of a replica crosses each stage boundary once
each way: the first stage's cell sends its activations to the second, the last stage's sends its
gradients back, a middle one both (``cost_models.schedule.stage_ops``). A cell's messages leave
from its lead (``planner.plan.tensor``: pipeline messages go between leads), and each holds the
link it takes for ``bytes / bandwidth`` (``cost_models.simulator``), the link no faster than the
lead's fastest outgoing one (NIC caps included: ``Network.fastest_out_bytes_per_s``). So a replica
of ``n_r`` sequences whose cells hold device ``d`` sends at least ``n_r q`` bytes (``q`` a
sequence's least boundary bytes) from ``d`` or from the lead of ``d``'s tensor group, one device of
``d``'s host and type: at a rate of at most ``sigma_d``, the fastest outgoing link among them
(``sender_rates_bytes_per_s``); within the iteration, so ``n_r <= T sigma_d / q``.

A plan whose slowest ``sigma`` among its devices is below a cut ``c`` has one replica at
``beta < c`` at most and ``D - 1`` at the fastest ``sigma_max`` at most, and its ``D`` replicas
hold the batch's ``B`` sequences, so ``T >= B q / ((D - 1) sigma_max + beta)`` (``sender_floor_s``).
Every other plan uses only the devices of ``sigma >= c``, and any bound on the topology of those
devices alone holds for it. ``lower_bound_s`` (``planner.search.bounds``) takes the least of the
two: the first as a floor on each pair's bound over every device, the second over the faster
devices alone, cutting again there. A single home link with a 100 Mbit/s egress then no longer
lowers every pipeline's bound to what its compute would allow (``topologies/emulated/home-mini.yaml``).
"""

import numpy as np

__all__ = ["sender_rates_bytes_per_s", "sender_floor_s", "slow_cut_bytes_per_s", "without_devices"]


def sender_rates_bytes_per_s(topology, tensor: int) -> np.ndarray:
    """(N,) ``sigma_d``: the fastest outgoing link (B/s, NIC-capped) of any device that could send
    device d's pipeline messages: d itself, and with tensor groups of up to ``tensor > 1`` devices
    (one host, one type) any device of d's host and type, which may lead d's group."""
    out = np.asarray(topology.network.fastest_out_bytes_per_s(), dtype=float)
    if tensor <= 1:
        return out
    keys = [(d.host, d.type_name) for d in topology.devices]
    best = {}
    for key, rate in zip(keys, out.tolist()):
        best[key] = max(best.get(key, 0.0), rate)
    return np.array([best[key] for key in keys])


def sender_floor_s(stages: int, replicas: np.ndarray, *, batch: int, sequence_bytes: float,
                   slow_bytes_per_s: float, fastest_bytes_per_s: float) -> np.ndarray:
    """(D,) seconds: the least iteration of a plan of ``stages`` stages and ``replicas`` replicas one
    of whose devices sends at most ``slow_bytes_per_s`` (module description):
    ``B q / ((D - 1) sigma_max + beta)``; 0 with one stage (no pipeline messages)."""
    replicas = np.asarray(replicas, dtype=float)
    if stages < 2:
        return np.zeros_like(replicas)
    rate = (replicas - 1.0) * fastest_bytes_per_s + slow_bytes_per_s
    return batch * sequence_bytes / rate


def slow_cut_bytes_per_s(rates: np.ndarray, *, batch: int, sequence_bytes: float, bound_s: float) -> float | None:
    """The cut ``c`` worth splitting at: above every rate ``sigma`` at which one replica alone would
    send the batch's messages in more than ``bound_s`` (``B q / sigma > bound_s``), below every other
    rate; None where no device is that slow, or every device is."""
    rates = np.asarray(rates, dtype=float)
    slow = batch * sequence_bytes > bound_s * rates
    if not slow.any() or slow.all():
        return None
    return float(rates[~slow].min())


def without_devices(topology, keep: np.ndarray):
    """``topology`` with only the devices where ``keep`` is True, their links and NICs as they were
    (``Topology.on_devices``)."""
    return topology.on_devices(np.flatnonzero(keep))
