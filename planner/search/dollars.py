"""What one iteration of a plan costs in US dollars: device-hours plus egress between regions.

``usd_per_iteration = iteration_s * sum(price_per_hour_usd of the charged devices) / 3600
+ sum over region pairs (bytes sent from one to the other per iteration / 1e9 * egress_usd_per_gb)``.

The charged devices are the plan's used devices: an idle device costs nothing (it is not rented),
unless ``charge_idle`` (a user renting the whole cluster pays for every device). The bytes are the
cost model's messages (``planner.prediction.stage_model``): each micro-batch's activation forward
and gradient backward across every stage boundary, and each stage's gradient sync, by the plan's
sync algorithm.
"""

from dataclasses import dataclass

import numpy as np

from planner.errors import InputError
from planner.prediction.predict import sync_members
from planner.prediction.stage_model import layer_costs, stage_profile

__all__ = ["Dollars", "usd_per_iteration", "egress_bytes", "price_per_hour_usd",
           "plan_dollars", "BYTES_PER_GB", "SECONDS_PER_HOUR"]

BYTES_PER_GB = 1e9  # cloud data transfer is billed per GB
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, kw_only=True)
class Dollars:
    """One iteration's price, split into device time and egress."""

    usd_per_iteration: float
    device_usd: float
    egress_usd: float
    egress_bytes: float  # bytes per iteration that cross from one region to another
    usd_per_million_tokens: float
    usd_per_hour: float  # the charged devices' prices per hour together
    devices_charged: int


def usd_per_iteration(iteration_s: float, usd_per_hour: float, egress_bytes, egress_usd_per_gb) -> float:
    """``iteration_s * usd_per_hour / 3600 + sum(egress_bytes * egress_usd_per_gb) / 1e9``.

    ``egress_bytes`` and ``egress_usd_per_gb`` are arrays of the same shape (per region pair)."""
    egress = float(np.sum(np.asarray(egress_bytes, dtype=float) * np.asarray(egress_usd_per_gb, dtype=float)))
    return iteration_s * usd_per_hour / SECONDS_PER_HOUR + egress / BYTES_PER_GB


def egress_bytes(plan, topology, model, training) -> np.ndarray:
    """``R x R`` bytes sent from region i to region j in one iteration of ``plan`` (regions in
    ``topology.regions`` order; the diagonal holds the traffic that stays inside a region)."""
    costs = layer_costs(model, training, plan.micro_batch_size, plan.stages, plan.replicas)
    profile = stage_profile(costs, plan.stage_bounds, plan.compression.message_mask(plan.stages),
                            np.array(plan.stage_tensor_degrees))
    region = topology.region_ids
    table = np.zeros((len(topology.regions), len(topology.regions)))
    for r, row in enumerate(plan.assignment):
        ids = [topology.index(d) for d in row]
        for s in range(plan.stages - 1):
            a, b = region[ids[s]], region[ids[s + 1]]
            message = float(profile.boundary_bytes[s]) * plan.micro_batches[r]
            table[a, b] += message  # activations forward
            table[b, a] += message  # their gradients backward
    for s in range(plan.stages):
        ring, server = sync_members(topology, plan, s)
        senders, receivers, sizes = topology.network.sync_flows(plan.sync, ring, float(profile.gradient_bytes[s]),
                                                                server)
        np.add.at(table, (region[senders], region[receivers]), sizes)  # the plan's algorithm's messages
    return table


def price_per_hour_usd(topology, names) -> float:
    """The devices' prices per hour together; an ``InputError`` naming the first without a price."""
    total = 0.0
    for name in names:
        device = topology.devices[topology.index(name)]
        if device.price_per_hour_usd is None:
            raise InputError(f"device {name} (type {device.type_name}) has no price: add price_per_hour_usd to its "
                             "devices entry (US dollars per hour; 0 for hardware you own)",
                             field="devices.price_per_hour_usd")
        total += device.price_per_hour_usd
    return total


def plan_dollars(plan, topology, model, training, *, charge_idle: bool = False) -> Dollars:
    """The price of one iteration of ``plan`` (which carries its prediction)."""
    charged = topology.names if charge_idle else plan.used_devices
    per_hour = price_per_hour_usd(topology, charged)
    moved = egress_bytes(plan, topology, model, training)
    iteration_s = plan.prediction.iteration_s
    total = usd_per_iteration(iteration_s, per_hour, moved, topology.egress_usd_per_gb)
    crossing = moved.copy()
    np.fill_diagonal(crossing, 0.0)
    tokens = plan.global_batch * model.sequence
    return Dollars(usd_per_iteration=total, device_usd=iteration_s * per_hour / SECONDS_PER_HOUR,
                   egress_usd=total - iteration_s * per_hour / SECONDS_PER_HOUR, egress_bytes=float(crossing.sum()),
                   usd_per_million_tokens=total / tokens * 1e6, usd_per_hour=per_hour, devices_charged=len(charged))
