"""Why the search found no plan: one line naming the cause (the pinned degrees, the batch, a device's
memory, the network) and the fix, instead of one message for every cause."""

import math
from enum import StrEnum

import numpy as np

from cost_models.memory import peak_in_flight
from cost_models.schedule import run_depth
from planner.errors import InputError
from planner.inputs.units import format_bytes
from planner.prediction.stage_model import layer_costs, stage_memory_bytes
from planner.search.construct import choose_devices

__all__ = ["BudgetKnob", "OutOfBudget", "no_degrees_error", "too_few_micro_batches_error", "no_fit_error",
           "network_error", "out_of_budget_error", "stage_memory_floor", "too_large_error"]


class BudgetKnob(StrEnum):
    """The option a user sets the search's work budget with: ``--budget``, or ``--time-limit``, whose
    share for the search is the budget where ``--budget`` is not given."""

    BUDGET = "--budget"
    TIME_LIMIT = "--time-limit"


class OutOfBudget(InputError):
    """No plan that fits was found before the work budget or the clock ended the search, which had
    not tried every degree pair: a larger budget or limit may find one."""


def no_degrees_error(devices: int, layers: int, stages: int | None, replicas: int | None) -> InputError:
    """No (stages, replicas) pair allowed by the pins fits ``devices`` devices and ``layers`` layers."""
    most_stages = min(layers, devices)
    if stages and stages > layers:
        return InputError(f"{stages} stages for a model of {layers} layers (a stage holds at least one layer): "
                          f"use --stages {most_stages} or fewer", field="--stages")
    if stages and stages > devices:
        return InputError(f"{stages} stages need at least {stages} devices and the topology has {devices}: "
                          f"use --stages {most_stages} or fewer", field="--stages")
    if stages and replicas:
        return InputError(f"{stages} stages x {replicas} replicas need {stages * replicas} devices and the "
                          f"topology has {devices}: use --replicas {devices // stages} or fewer, or fewer stages",
                          field="--replicas")
    return InputError(f"{replicas} replicas need at least {replicas} devices (one stage each) and the topology has "
                      f"{devices}: use --replicas {devices} or fewer", field="--replicas")


def too_few_micro_batches_error(global_batch: int, micro_batch_size: int, replicas: int) -> InputError:
    """Every replica needs at least one micro-batch."""
    count = global_batch // micro_batch_size
    return InputError(f"the global batch of {global_batch} at micro-batch size {micro_batch_size} gives {count} "
                      f"micro-batches and each of the {replicas} replicas needs one: use --replicas {count} or "
                      "fewer, or a larger global batch", field="--replicas")


def stage_memory_floor(model, training, micro_batch_size: int, stages: int, replicas: int = 1) -> float:
    """Bytes that some device must hold in any plan of ``stages`` stages and at most ``replicas``
    replicas: one stage has at least ``ceil(layers / stages)`` layers and keeps at least one
    micro-batch in flight, its optimizer state sharded over as many replicas as allowed; the least
    of its possible positions (first and last stages carry the embeddings and the head)."""
    costs = layer_costs(model, training, micro_batch_size, stages, replicas)
    per_stage = math.ceil(model.layers / stages)
    return float(min(stage_memory_bytes(costs, per_stage, s, 1.0) for s in range(stages)))


def _even_split_worst(model, training, micro_batch_size: int, stages: int, replicas: int) -> tuple:
    """(stage, bytes) of the stage that needs the most under an even layer split (``ceil(layers /
    stages)`` each) with the micro-batches its schedule keeps in flight (1F1B at warm-up depth k
    ``k (S - s - 1) + 1`` at most, ZB-H1 ``k (S - 1) + 1``; GPipe: a round's;
    ``cost_models.memory.peak_in_flight``)."""
    costs = layer_costs(model, training, micro_batch_size, stages, replicas)
    per_replica = max(1, training.global_batch // (micro_batch_size * replicas))
    schedule = training.schedules[0]  # under auto 1F1B, which keeps fewer in flight than GPipe
    needs = [stage_memory_bytes(costs, math.ceil(model.layers / stages), s,
                                peak_in_flight(schedule, s, stages, per_replica, training.micro_batches_per_round,
                                               warmup_depth=run_depth(schedule, costs.warmup_depth)))
             for s in range(stages)]
    worst = int(np.argmax(needs))
    return worst, float(needs[worst])


def _state_bytes(model, training) -> float:
    """One copy of the whole model's weights, gradients and optimizer state: the cost model's own
    counts (``layer_costs`` of one stage and one replica)."""
    costs = layer_costs(model, training, 1, 1)
    return (model.layers * costs.layer_params + costs.first_params + costs.last_params) * costs.state_bytes_per_param


def _gib(value_bytes: float) -> str:
    return format_bytes(value_bytes)


def too_large_error(topology, model, training) -> InputError | None:
    """The model's state alone is more than every device holds together (``capacity``: usable bytes
    per device), so no plan can fit: known before any search, whatever its budget. Pipeline stages,
    tensor groups and sharding split the state but never shrink it below one copy."""
    whole, capacity = _state_bytes(model, training), topology.memory_bytes()
    if whole <= capacity.sum():
        return None
    return InputError(f"no plan fits in memory: the model's weights, gradients and optimizer state alone take "
                      f"{_gib(whole)}, more than all {topology.size} devices hold together "
                      f"({_gib(capacity.sum())} usable): add devices with more memory or plan a smaller model",
                      field="model")


def no_fit_error(topology, model, training, pairs: list, micro_batch_sizes: list, *, stages_pinned: bool,
                 speed: np.ndarray, capacity: np.ndarray) -> InputError:
    """No placement of any allowed (stages, replicas) pair fits in memory: name the device that cannot
    hold its share and the change that makes it fit.

    ``pairs``: the (stages, replicas) pairs the search tried; ``capacity``: usable bytes per device.
    """
    b = min(micro_batch_sizes)
    most = max(s for s, _ in pairs)
    most_replicas = max(d for _, d in pairs)  # the most shards any tried plan could spread its state over
    floor = stage_memory_floor(model, training, b, most, most_replicas)
    largest = int(np.argmax(capacity))
    recompute = {True: "full recomputation", "selective": "selective recomputation"}.get(training.recompute,
                                                                                       "recompute off")
    layers = math.ceil(model.layers / most)
    if floor > capacity[largest]:
        # No device can hold a stage at this stage count: more stages, recomputation, a smaller
        # micro-batch, or bigger devices are the only ways out.
        device = topology.devices[largest]
        cause = (f"no plan fits in memory: with {most} stage(s) a stage holds at least {layers} of {model.layers} "
                 f"layers and needs {_gib(floor)} at micro-batch size {b} ({recompute}), more than the largest "
                 f"device, {device.name} ({device.type_name}), holds ({_gib(capacity[largest])})")
        limit = min(model.layers, topology.size)
        enough = next((s for s in range(most + 1, limit + 1)
                       if stage_memory_floor(model, training, b, s, max(1, topology.size // s))
                       <= capacity[largest]), None)
        if stages_pinned and enough is not None:
            return InputError(f"{cause}: use --stages {enough} or more", field="--stages")
        if training.recompute is not True:  # off or selective: full recomputation keeps the least
            return InputError(f"{cause}: set recompute: true", field="training.recompute")
        if b > 1:
            return InputError(f"{cause}: lower micro_batch_size", field="training.micro_batch_size")
        return InputError(f"{cause}: add devices with more memory or plan a smaller model", field="model")
    # Some device could hold a stage, but every placement of the allowed pairs had to use smaller
    # ones: name the smallest device the fewest-replica pair with the most stages must use.
    s, r = min((p for p in pairs if p[0] == most), key=lambda p: p[1])
    chosen = choose_devices(speed, capacity, s * r)
    weakest = int(chosen[np.argmin(capacity[chosen])])
    device = topology.devices[weakest]
    stage, need = _even_split_worst(model, training, b, s, r)
    cause = (f"no plan fits in memory: {s} stage(s) x {r} replica(s) must use {device.name} ({device.type_name}, "
             f"{_gib(capacity[weakest])} usable), and a stage of {layers} layers needs at least "
             f"{_gib(stage_memory_floor(model, training, b, s, r))} at micro-batch size {b} ({recompute})"
             + (f"; split evenly, stage {stage} needs {_gib(need)} with the micro-batches it keeps in flight"
                if need > capacity[weakest] else ""))
    if training.schedule == "gpipe" and not training.micro_batches_per_round:
        return InputError(f"{cause}, and GPipe keeps the activations of all a replica's micro-batches: use "
                          "--schedule 1f1b or accumulation rounds (--micro-batches-per-round)", field="--schedule")
    if r > 1:
        return InputError(f"{cause}: use fewer replicas (--replicas) or more stages", field="--replicas")
    if training.recompute is not True:
        return InputError(f"{cause}: set recompute: true", field="training.recompute")
    if b > 1:
        return InputError(f"{cause}: lower micro_batch_size or add devices with more memory",
                          field="training.micro_batch_size")
    return InputError(f"{cause}: add devices with more memory or plan a smaller model", field="model")


def network_error(times_s: list) -> InputError:
    """Every plan that fits has a predicted iteration time that is not finite: some link or NIC on
    every path between the devices is too slow to carry a message in finite time."""
    return InputError(f"no plan finishes an iteration in finite time ({len(times_s)} plans simulated): a link or NIC "
                      "on every path between the devices is too slow; raise its bandwidth in the network section",
                      field="network")


def out_of_budget_error(tried: int, left: int, *, clock: bool, knob: BudgetKnob = BudgetKnob.BUDGET) -> OutOfBudget:
    """Construction ended on the work budget (``clock`` False) or on the time limit before any
    placement of the ``tried`` degree pairs it constructed fit in memory, ``left`` pairs not reached.
    ``knob``: the option that set the work budget (``--time-limit`` where ``--budget`` was not given)."""
    reached = f"{tried} degree pair(s) constructed, {left} not reached"
    if clock:
        return OutOfBudget(f"no plan that fits in memory was found before the time limit ended the search ({reached}): "
                           "raise --time-limit", field="--time-limit")
    if knob == BudgetKnob.TIME_LIMIT:
        return OutOfBudget(f"no plan that fits in memory was found within the search's work budget, which the time "
                           f"limit sets ({reached}): raise --time-limit (or set --budget)", field="--time-limit")
    return OutOfBudget(f"no plan that fits in memory was found within the search's work budget ({reached}): raise "
                       "--budget", field="--budget")
