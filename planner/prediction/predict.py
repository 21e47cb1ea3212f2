"""From a plan to the simulator's input (``PipelineJob``), and from the simulation to a ``Prediction``.

Per-stage work and memory come from the stage model (``planner.prediction.stage_model``), messages
and collectives from the network model (``cost_models.network``).
"""

import math
from dataclasses import replace

import numpy as np

from cost_models import memory
from cost_models.schedule import Schedule
from cost_models.simulator import PipelineJob, Timeline, simulate
from planner.plan.plan import CostModel, Plan, Prediction
from planner.plan.recompute import mode_of, plan_modes, training_value
from planner.plan.sync_groups import grouped_sync, grouped_sync_bytes
from planner.plan.tensor import groups_of_plan
from planner.prediction.stage_model import (LayerCosts, StageProfile, iteration_flops, layer_costs, message_codec_s,
                                            optimizer_time_s, powersgd_pass_s, stage_compress_s, stage_memory_bytes,
                                            stage_parameters, stage_profile, stage_step_bytes, tensor_layer_s)

__all__ = ["sync_time_s", "sync_members", "build_pipeline_job", "mode_costs", "worker_memory_bytes", "predict",
           "estimated_prediction",
           "model_flops_per_iteration", "communication_bytes", "chunk_shares", "memory_compressed"]


def sync_time_s(topology, plan: Plan, profile: StageProfile, stage: int) -> float:
    """All-reduce time of ``stage``'s gradients over its replicas, by the plan's sync algorithm
    (``topology``: the plan's grouped view, ``planner.plan.tensor``, when it has tensor groups),
    per iteration: with local steps the whole sync (``profile.gradient_bytes`` x ``sync_every``
    bytes, latency included) happens once every ``sync_every`` iterations."""
    ring, server = sync_members(topology, plan, stage)
    H = plan.sync_every
    if plan.sync_groups:  # local steps in sync groups (``planner.plan.sync_groups``)
        return grouped_sync(topology.network, *_grouped_args(topology, plan, stage),
                            profile.gradient_bytes[stage] * H, H)[0]
    return topology.network.sync_s(plan.sync, profile.gradient_bytes[stage] * H, ring, server) / H


def _grouped_args(topology, plan: Plan, stage: int) -> tuple:
    """(each replica's device index at ``stage``, the stage's ring as replica indices, the groups)."""
    devices = [topology.index(row[stage]) for row in plan.assignment]
    order = list(plan.ring_orders[stage]) if plan.ring_orders else list(range(plan.replicas))
    return devices, order, plan.sync_groups


def sync_members(topology, plan: Plan, stage: int) -> tuple:
    """``stage``'s replicas as device indices of ``topology`` in the plan's ring order, and its
    parameter server's index (None unless the plan's sync is parameter-server)."""
    ring = [topology.index(d) for d in plan.ring(stage)]
    server = plan.server(stage)
    return ring, (topology.index(server) if server is not None else None)


def mode_costs(plan: Plan, model, training, *, compiled: bool = True) -> dict:
    """The stage model's costs of each recomputation mode ``plan``'s workers run
    (``planner.plan.recompute.plan_modes``), by mode name."""
    modes = sorted({m for row in plan_modes(plan, training) for m in row})
    return {m: layer_costs(model, replace(training, recompute=training_value(m)), plan.micro_batch_size, plan.stages,
                           plan.replicas, compiled=compiled) for m in modes}


def build_pipeline_job(plan: Plan, topology, model, training, costs: LayerCosts | None = None) -> PipelineJob:
    """The simulator's input for ``plan`` (``costs``: the stage model's, when the caller has them and
    every worker runs the training's recomputation).

    Where the plan's workers differ in recomputation (``Plan.recompute``), each worker's forward and
    backward are those of its own mode's job: a mode changes nothing but its workers' blocks (their
    FLOPs, tensor all-reduces and efficiency) and memory."""
    table = plan_modes(plan, training)
    modes = sorted({m for row in table for m in row})
    if len(modes) == 1:
        uniform = replace(training, recompute=training_value(modes[0]))
        return _uniform_job(replace(plan, recompute=()), topology, model, uniform,
                            costs if mode_of(training.recompute) == modes[0] else None)
    uniform_plan = replace(plan, recompute=())
    jobs = {m: _uniform_job(uniform_plan, topology, model, replace(training, recompute=training_value(m))) for m in modes}
    cell = np.array(table)  # (R, S) mode names
    first = jobs[modes[0]]

    def blend(name):
        return sum(np.where(cell == m, getattr(job, name), 0.0) for m, job in jobs.items())
    return replace(first, forward_s=blend("forward_s"), backward_s=blend("backward_s"),
                   weight_gradient_share=blend("weight_gradient_share"))


def _uniform_job(plan: Plan, topology, model, training, costs: LayerCosts | None = None) -> PipelineJob:
    """The simulator's input for ``plan`` whose workers all run the training's recomputation.

    A tensor group runs as one device of its members' summed FLOP/s for the blocks (the head at one
    member's speed), plus each block's all-reduces among its members, forward and backward; each
    member's optimizer step covers its share of the stage's parameters (``planner.plan.tensor``)."""
    costs = costs or layer_costs(model, training, plan.micro_batch_size, plan.stages, plan.replicas)
    profile = stage_profile(costs, plan.stage_bounds, plan.compression.message_mask(plan.stages),
                            np.array(plan.stage_tensor_degrees))
    groups = groups_of_plan(topology, plan)
    topology = groups.virtual
    S = plan.stages
    device = np.array([[topology.index(d) for d in row] for row in plan.assignment])
    speed = topology.effective_flops(training.precision, device)  # (R, S), the plan's devices only
    # The head runs at its own calibrated efficiency: its FLOPs count ``slowdown`` times.
    extra_head = profile.head_forward_flops[None, :] * (topology.head_slowdowns()[device] - 1.0)
    # A block's forward and backward at the device's calibrated block slowdown (with recomputation,
    # measured): its FLOPs count that many times, the difference in backward, where the recomputation runs.
    block_slowdown = topology.block_slowdowns(training.recompute,
                                              plan.schedule == Schedule.ZERO_BUBBLE)[device]  # (R, S)
    extra_blocks = profile.layer_counts[None, :] * costs.layer_flops * (block_slowdown - 1.0)
    mem_bw = topology.memory_bandwidths()[device]
    codec_bw = topology.codec_bandwidths()[device]
    tensor = groups.degree[device]
    member_params = stage_parameters(costs, profile.layer_counts[None, :], np.arange(S)[None, :], tensor)
    optimizer = optimizer_time_s(stage_step_bytes(costs, member_params, np.arange(S)[None, :]), mem_bw)
    if costs.powersgd_rank and plan.replicas > 1:  # PowerSGD's products run before the step, on each device
        optimizer = optimizer + stage_compress_s(costs, profile.layer_counts[None, :], np.arange(S)[None, :], speed,
                                                 tensor) + powersgd_pass_s(costs, member_params, codec_bw)
    # A group's block beyond its compute (all-reduces or issue floor), split as its all-reduces are.
    beyond = tensor_layer_s(costs, groups.allreduce_per_byte_s[device], groups.allreduce_latency_s[device],
                            costs.layer_flops * block_slowdown / speed, tensor,
                            *groups.placed(device, costs.micro_batch_size, plan.virtual_stages,
                                          plan.schedule == Schedule.ZERO_BUBBLE), block_slowdown)
    forward_share = costs.tensor_allreduces_forward / (costs.tensor_allreduces_forward + costs.tensor_allreduces_backward)
    tensor_forward = profile.layer_counts[None, :] * forward_share * beyond
    tensor_backward = profile.layer_counts[None, :] * (1.0 - forward_share) * beyond
    # compressed messages' encode and decode
    codec_forward, codec_backward = message_codec_s(costs, codec_bw, plan.compression.message_mask(S))
    sync = np.array([sync_time_s(topology, plan, profile, s) for s in range(S)])
    links, holds = [], []
    for s in range(S):
        ring, server = sync_members(topology, plan, s)
        links.append(tuple(zip(ring, ring[1:] + ring[:1])) if len(ring) > 1 else ())
        if plan.sync_groups:
            holds.append(tuple(grouped_sync(topology.network, *_grouped_args(topology, plan, s),
                                            float(profile.gradient_bytes[s]) * plan.sync_every, plan.sync_every)[1]))
            continue
        holds.append(tuple(topology.network.sync_holds(plan.sync, ring, float(profile.gradient_bytes[s]),
                                                       float(sync[s]), server)) if len(ring) > 1 else ())
    return PipelineJob(schedule=plan.schedule, device=device, micro_batches=np.array(plan.micro_batches),
                       forward_s=(profile.forward_flops[None, :] + extra_head) / speed + tensor_forward + codec_forward,
                       backward_s=(profile.backward_flops[None, :] + 2.0 * extra_head + extra_blocks) / speed
                       + tensor_backward
                       + codec_backward,
                       boundary_bytes=profile.boundary_bytes, network=topology.network, sync_s=sync,
                       sync_links=tuple(links), sync_holds=tuple(holds), sync_bytes=profile.gradient_bytes,
                       micro_batches_per_round=plan.micro_batches_per_round,
                       weight_gradient_share=np.repeat(profile.weight_gradient_share[None, :], plan.replicas, axis=0),
                       optimizer_s=optimizer, virtual_stages=plan.virtual_stages, warmup_depth=plan.warmup_depth,
                       chunk_share=chunk_shares(plan, costs) if plan.virtual_stages > 1 else None)


def chunk_shares(plan: Plan, costs: LayerCosts) -> np.ndarray:
    """(S, v): each chunk's share of its stage's forward FLOPs (its blocks, the head on the last
    piece), the share the simulator gives it of the stage's forward and backward."""
    S, v = plan.stages, plan.virtual_stages
    work = np.zeros((S, v))
    for s in range(S):
        for c, (first, end) in enumerate(plan.chunk_layers(s)):
            work[s, c] = (end - first) * costs.layer_forward_flops
            if end == plan.layer_bounds[-1]:
                work[s, c] += costs.head_forward_flops
    return work / work.sum(axis=1, keepdims=True)


def communication_bytes(plan: Plan, model, training) -> dict:
    """Bytes every worker sends per iteration, and per token trained, between workers: the pipeline's
    activations forward and gradients backward (each micro-batch across each stage boundary), and
    the data-parallel sync, ``2 (k - 1)`` times a stage's gradient bytes among its ``k`` replicas
    whatever the algorithm (``Network.sync_flows``: a ring's ``k`` hops of ``2 (k - 1) / k`` of the
    message, Patarasuk & Yuan 2009; a parameter server's ``k - 1`` messages each way; a
    hierarchical all-reduce's, and DTFM's sharded exchange's, the same total), per iteration: with local
    steps the parameter deltas, ``sync_every`` times fewer; with sync groups, the groups' rings every
    iteration and the leads' ring every ``sync_every`` (``planner.plan.sync_groups.grouped_sync_bytes``:
    ``within_groups`` and ``across_groups`` split the data-parallel bytes).
    A tensor group's all-reduces inside its host are not counted."""
    costs = layer_costs(model, training, plan.micro_batch_size, plan.stages, plan.replicas)
    profile = stage_profile(costs, plan.stage_bounds, plan.compression.message_mask(plan.stages),
                            np.array(plan.stage_tensor_degrees))
    pipeline = 2.0 * float(profile.boundary_bytes.sum()) * sum(plan.micro_batches)
    if plan.virtual_stages > 1:  # a message across each of the S v - 1 piece boundaries (all of one size)
        pieces = plan.stages * plan.virtual_stages
        pipeline = 2.0 * float(profile.boundary_bytes[0]) * (pieces - 1) * sum(plan.micro_batches)
    k = plan.replicas
    data_parallel = 2.0 * (k - 1) * float(profile.gradient_bytes.sum())
    tokens = plan.global_batch * model.sequence
    groups = {}
    if plan.sync_groups:
        H = plan.sync_every
        within, across = grouped_sync_bytes(plan.sync_groups, float(profile.gradient_bytes.sum()) * H, H)
        data_parallel = within + across
        groups = {"within_groups_bytes_per_token": within / tokens, "across_groups_bytes_per_token": across / tokens}
    return {"sync_every": costs.sync_every, **groups, "pipeline_bytes_per_iteration": pipeline,
            "data_parallel_bytes_per_iteration": data_parallel, "bytes_per_iteration": pipeline + data_parallel,
            "bytes_per_token": (pipeline + data_parallel) / tokens,
            "data_parallel_bytes_per_token": data_parallel / tokens}


def model_flops_per_iteration(model, global_batch: int) -> float:
    """Model FLOPs of one iteration (forward + backward, no recomputation): the MFU numerator."""
    return iteration_flops(model, global_batch, recompute=False)


def predict(plan: Plan, topology, model, training, *, keep_records: bool = False,
            deadline: float = math.inf, compiled: bool = True) -> tuple:
    """Simulate ``plan``: returns (Prediction, Timeline); ``cost_models.simulator.SimulationCut``
    when ``time.perf_counter()`` passes ``deadline`` before the simulation ends. ``compiled``: the
    runtime compiles the loss (memory: ``cost_models.memory.loss_bytes``), as ``plan launch`` does
    on GPUs; False for an eager run (``--compile off``)."""
    costs = mode_costs(plan, model, training, compiled=compiled)
    job = build_pipeline_job(plan, topology, model, training, _only(costs))
    timeline: Timeline = simulate(job, keep_records=keep_records, deadline=deadline)
    prediction = _prediction(plan, topology, model, training, costs, float(timeline.iteration_s),
                             {k: float(v) for k, v in timeline.breakdown_s.items()})
    return prediction, timeline


def estimated_prediction(plan: Plan, topology, model, training, iteration_s: float) -> Prediction:
    """The ``Prediction`` of ``plan`` with the search's estimate ``iteration_s`` in place of a
    simulation (no breakdown; memory from the stage model, as ``predict``'s): for a plan whose
    simulation the time limit did not hold."""
    return _prediction(plan, topology, model, training, mode_costs(plan, model, training), float(iteration_s), {},
                       cost_model=CostModel.ESTIMATE)


def _only(costs: dict) -> LayerCosts | None:
    """The costs of the one mode in ``costs``, None where the plan's workers run several."""
    return next(iter(costs.values())) if len(costs) == 1 else None


def memory_compressed(plan: Plan) -> list:
    """(S - 1,) booleans: the boundaries whose messages the runtime sends int8 (the plan's
    ``compression.message_mask``; none under interleaved 1F1B, whose messages wrap from the last
    stage to the first, ``planner.runtime.engine``)."""
    if plan.virtual_stages > 1:
        return [False] * (plan.stages - 1)
    return plan.compression.message_mask(plan.stages)


def worker_memory_bytes(plan: Plan, topology, costs: dict, table) -> tuple:
    """(used, capacity): each used device's predicted peak bytes (its reserve included) and its
    memory, each worker at the stage model's ``costs[table[r][s]]`` (``mode_costs``; ``table``: the
    workers' recomputation modes, ``plan_modes``)."""
    counts = np.diff(plan.stage_bounds)
    used, capacity = {}, {}
    compressed = memory_compressed(plan)
    for r, row in enumerate(plan.assignment):
        for s, name in enumerate(row):
            order = (plan.schedule, s, plan.stages, plan.micro_batches[r], plan.micro_batches_per_round,
                     plan.virtual_stages)
            chunks = tuple(end - first for first, end in plan.chunk_layers(s))
            depth = plan.warmup_depth
            in_flight = memory.peak_in_flight(*order, chunk_layers=chunks, warmup_depth=depth)
            outputs, gradients = memory.held_messages(*order, chunk_layers=chunks, warmup_depth=depth)
            heads = memory.head_in_flight(*order, chunk_layers=chunks, warmup_depth=depth) \
                if s == plan.stages - 1 else in_flight
            members = plan.members(name)
            for k, member in enumerate(members):  # the lead also steps the whole parameters
                need = float(stage_memory_bytes(costs[table[r][s]], counts[s], s, in_flight, len(members),
                                                lead=k == 0, outputs=outputs, gradients=gradients, heads=heads,
                                                compressed=compressed))
                dev = topology.devices[topology.index(member)]
                used[member] = need + dev.memory_reserved_bytes
                capacity[member] = dev.memory_bytes
    return used, capacity


def _prediction(plan, topology, model, training, costs: dict, seconds: float, breakdown_s: dict,
                cost_model: CostModel = CostModel.SIMULATOR) -> Prediction:
    """``costs``: ``mode_costs``'s, each worker's memory by its own mode's."""
    used, capacity = worker_memory_bytes(plan, topology, costs, plan_modes(plan, training))
    model_flops = model_flops_per_iteration(model, plan.global_batch)
    peak = sum(topology.devices[topology.index(d)].peak_flops_for(training.precision) for d in plan.used_devices)
    return Prediction(
        iteration_s=seconds, breakdown_s=breakdown_s,
        tokens_per_s=plan.global_batch * model.sequence / seconds, achieved_flops=model_flops / seconds,
        mfu=model_flops / seconds / peak, memory_bytes=used, capacity_bytes=capacity, cost_model=cost_model)
