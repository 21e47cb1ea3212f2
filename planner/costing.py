"""From a plan and its job to the numbers the simulator needs, and from the simulation to a Prediction.

This is the only place where the model/training specs meet the pure formulas of ``cost_models``.
"""

from dataclasses import dataclass

import numpy as np

from cost_models import comm, flops, memory
from cost_models.simulator import PipelineJob, Timeline, simulate
from planner.plan import Plan, Prediction

__all__ = ["OPTIMIZER_BYTES_PER_PARAMETER", "StageProfile", "stage_profile", "worker_memory_bytes",
           "ring_hops", "greedy_ring_order", "sync_time_s", "optimizer_time_s", "build_pipeline_job", "predict",
           "model_flops_per_iteration"]

# Bytes the optimizer update moves per parameter (read + write), a roofline estimate of a fused
# Adam step: fp32 master, m and v read and written (24 B), the 16-bit gradient read and the 16-bit
# weight written (4 B). SGD with momentum: master and momentum (16 B) plus the same 4 B.
OPTIMIZER_BYTES_PER_PARAMETER = {"adam": 28.0, "sgd": 20.0}


@dataclass(frozen=True, kw_only=True, eq=False)
class StageProfile:
    """Per-stage work for one micro-batch of ``micro_batch`` sequences (arrays of length S)."""

    forward_flops: np.ndarray
    backward_flops: np.ndarray
    parameters: np.ndarray
    activation_bytes: np.ndarray  # kept per in-flight micro-batch
    transient_bytes: np.ndarray  # one micro-batch's extra working set (recompute, logits gradient, buffers)
    boundary_bytes: np.ndarray  # length S-1
    gradient_bytes: np.ndarray  # what the stage's all-reduce moves
    head_forward_flops: np.ndarray  # the LM head's share of forward_flops (last stage only)


def stage_profile(model, training, layer_bounds, micro_batch: int) -> StageProfile:
    """Work, parameters and activations of each stage for one micro-batch (formulas in cost_models)."""
    b, s, h, a, v = micro_batch, model.sequence, model.hidden, model.heads, model.vocabulary
    bounds = np.asarray(layer_bounds)
    S = len(bounds) - 1
    layers = np.diff(bounds).astype(float)
    dtype = training.activation_bytes
    layer_fwd = flops.layer_forward_flops(b, s, h, model.ffn_hidden, gated_mlp=model.gated_mlp)
    head_fwd = flops.head_forward_flops(b, s, h, v)
    forward = layers * layer_fwd
    forward[-1] += head_fwd
    # Backward = 2x forward; recomputation re-runs the blocks' forward (not the head's).
    backward = 2.0 * forward + (layers * layer_fwd if training.recompute else 0.0)
    per_layer = flops.layer_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp, biases=model.biases)
    params = layers * per_layer
    params[0] += flops.embedding_parameters(v, h, s, learned_positions=model.learned_positions)
    params[-1] += flops.head_parameters(v, h, tied=model.tied_embeddings, biases=model.biases)
    if model.tied_embeddings and S > 1:
        params[-1] += v * h  # the last stage keeps its own copy of the tied embedding (Megatron-LM)
    kept = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention,
                                         recompute=training.recompute)
    full = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention)
    boundary = float(b * s * h * dtype)
    activation = layers * kept
    activation[0] += boundary  # embedding output
    activation[-1] += memory.logits_bytes(s, b, v)  # fp32 logits kept for the loss backward
    transient = np.full(S, 2.0 * boundary)  # send and receive buffers
    if training.recompute:
        transient += full  # one block's full set while it is recomputed
    transient[-1] += memory.logits_bytes(s, b, v)  # gradient of the logits
    return StageProfile(forward_flops=forward, backward_flops=backward, parameters=params,
                        activation_bytes=activation, transient_bytes=transient,
                        boundary_bytes=np.full(S - 1, boundary), gradient_bytes=params * dtype,
                        head_forward_flops=np.where(np.arange(S) == S - 1, head_fwd, 0.0))


def worker_memory_bytes(profile: StageProfile, training, schedule: str, stage: int, microbatches: int) -> float:
    """Peak bytes on the device of ``stage`` in a replica of ``microbatches`` micro-batches
    (without the device's reserved memory): state + in-flight activations + transient set."""
    S = len(profile.parameters)
    state = profile.parameters[stage] * memory.state_bytes_per_parameter(training.precision, training.optimizer)
    in_flight = memory.in_flight_microbatches(schedule, stage, S, microbatches)
    return float(state + in_flight * profile.activation_bytes[stage] + profile.transient_bytes[stage])


def ring_hops(topology, members) -> tuple:
    """Latency and effective bandwidth of each hop ``members[i] -> members[i+1]`` (cyclic).

    A host's shared NIC is split evenly among the ring's hops that leave (or enter) that host.
    """
    idx = [topology.index(m) if isinstance(m, str) else int(m) for m in members]
    k = len(idx)
    if k <= 1:
        return np.zeros(0), np.zeros(0)
    nxt = idx[1:] + idx[:1]
    host = topology.host_ids
    latency = topology.latency_s[idx, nxt]
    bandwidth = topology.bandwidth_bytes_per_s[idx, nxt].astype(float)
    out_count, in_count = {}, {}
    for a, b in zip(idx, nxt):
        if host[a] != host[b]:
            out_count[host[a]] = out_count.get(host[a], 0) + 1
            in_count[host[b]] = in_count.get(host[b], 0) + 1
    for hop, (a, b) in enumerate(zip(idx, nxt)):
        if host[a] == host[b]:
            continue
        nic_a = topology.nic_of(topology.hosts[host[a]])
        nic_b = topology.nic_of(topology.hosts[host[b]])
        if nic_a:
            bandwidth[hop] = min(bandwidth[hop], nic_a[0] / out_count[host[a]])
        if nic_b:
            bandwidth[hop] = min(bandwidth[hop], nic_b[1] / in_count[host[b]])
    return latency, bandwidth


def greedy_ring_order(topology, members, *, improve: bool = True) -> list:
    """A ring order (indices into ``members``) that keeps slow links out of the ring.

    Nearest-neighbour by (bandwidth, -latency) from the first member, then (up to 16 members) 2-opt
    improvement of the ring's all-reduce time; ring order is a bottleneck TSP (formulas.md).
    """
    idx = [topology.index(m) for m in members]
    k = len(idx)
    if k <= 2:
        return list(range(k))
    score = topology.bandwidth_bytes_per_s[np.ix_(idx, idx)] - 1e-3 * topology.latency_s[np.ix_(idx, idx)]
    order, left = [0], set(range(1, k))
    while left:
        here = order[-1]
        best = max(left, key=lambda j: (score[here, j], -j))
        order.append(best)
        left.remove(best)

    def cost(o):
        lat, bw = ring_hops(topology, [idx[i] for i in o])
        return comm.ring_allreduce_time_s(1e9, lat, bw)

    best_cost = cost(order)
    improved = improve and k <= 16  # 2-opt costs O(k^3) per pass; larger rings keep the greedy order
    while improved:
        improved = False
        for i in range(1, k - 1):
            for j in range(i + 1, k):
                candidate = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
                c = cost(candidate)
                if c < best_cost - 1e-12:
                    order, best_cost, improved = candidate, c, True
    return order


def sync_time_s(topology, plan: Plan, profile: StageProfile, stage: int) -> float:
    """All-reduce time of ``stage``'s gradients over its replicas, by the plan's sync algorithm."""
    ring = plan.ring(stage)
    if plan.sync == "sharded":
        idx = [topology.index(d) for d in ring]
        return comm.sharded_exchange_time_s(profile.gradient_bytes[stage], topology.latency_s[np.ix_(idx, idx)],
                                            topology.bandwidth_bytes_per_s[np.ix_(idx, idx)])
    latency, bandwidth = ring_hops(topology, ring)
    return comm.ring_allreduce_time_s(profile.gradient_bytes[stage], latency, bandwidth)


def optimizer_time_s(parameters: float, optimizer: str, memory_bandwidth_bytes_per_s: float) -> float:
    """The optimizer update is memory-bound: bytes moved / memory bandwidth (roofline, Williams et al. 2009)."""
    return parameters * OPTIMIZER_BYTES_PER_PARAMETER[optimizer] / memory_bandwidth_bytes_per_s


def build_pipeline_job(plan: Plan, topology, model, training, profile: StageProfile | None = None) -> PipelineJob:
    """The simulator's input for ``plan``."""
    profile = profile or stage_profile(model, training, plan.layer_bounds, plan.micro_batch_size)
    S = plan.stages
    device = np.array([[topology.index(d) for d in row] for row in plan.assignment])
    speed = topology.effective_flops(training.precision)[device]  # (R, S)
    # The head runs at its own calibrated efficiency: its FLOPs count ``slowdown`` times.
    extra_head = profile.head_forward_flops[None, :] * (topology.head_slowdowns()[device] - 1.0)
    mem_bw = np.array([d.memory_bandwidth_bytes_per_s for d in topology.devices])[device]
    optimizer = optimizer_time_s(profile.parameters[None, :], training.optimizer, mem_bw)
    hosts = len(topology.hosts)
    egress = np.full(hosts, np.inf)
    ingress = np.full(hosts, np.inf)
    for h, name in enumerate(topology.hosts):
        nic = topology.nic_of(name)
        if nic:
            egress[h], ingress[h] = nic
    sync = np.array([sync_time_s(topology, plan, profile, s) for s in range(S)])
    links = []
    for s in range(S):
        ring = [topology.index(d) for d in plan.ring(s)]
        links.append(tuple(zip(ring, ring[1:] + ring[:1])) if len(ring) > 1 else ())
    return PipelineJob(schedule=plan.schedule, device=device, microbatches=np.array(plan.microbatches),
                       forward_s=(profile.forward_flops[None, :] + extra_head) / speed,
                       backward_s=(profile.backward_flops[None, :] + 2.0 * extra_head) / speed,
                       boundary_bytes=profile.boundary_bytes, latency_s=topology.latency_s,
                       bandwidth_bytes_per_s=topology.bandwidth_bytes_per_s, host=topology.host_ids,
                       nic_egress=egress, nic_ingress=ingress, sync_s=sync, sync_links=tuple(links),
                       optimizer_s=optimizer)


def model_flops_per_iteration(model, global_batch: int) -> float:
    """Model FLOPs of one iteration (forward + backward, no recomputation): the MFU numerator."""
    profile_layer = flops.layer_forward_flops(global_batch, model.sequence, model.hidden, model.ffn_hidden,
                                              gated_mlp=model.gated_mlp)
    head = flops.head_forward_flops(global_batch, model.sequence, model.hidden, model.vocabulary)
    return 3.0 * (model.layers * profile_layer + head)


def predict(plan: Plan, topology, model, training, *, keep_records: bool = False) -> tuple:
    """Simulate ``plan``: returns (Prediction, Timeline)."""
    profile = stage_profile(model, training, plan.layer_bounds, plan.micro_batch_size)
    job = build_pipeline_job(plan, topology, model, training, profile)
    timeline: Timeline = simulate(job, keep_records=keep_records)
    used, capacity = {}, {}
    for r, row in enumerate(plan.assignment):
        for s, name in enumerate(row):
            dev = topology.devices[topology.index(name)]
            used[name] = worker_memory_bytes(profile, training, plan.schedule, s, plan.microbatches[r]) \
                + dev.memory_reserved_bytes
            capacity[name] = dev.memory_bytes
    seconds = timeline.iteration_s
    model_flops = model_flops_per_iteration(model, plan.global_batch)
    peak = sum(topology.devices[topology.index(d)].peak_flops_for(training.precision)
               for row in plan.assignment for d in row)
    prediction = Prediction(
        iteration_s=float(seconds), breakdown_s={k: float(v) for k, v in timeline.breakdown_s.items()},
        tokens_per_s=plan.global_batch * model.sequence / seconds, achieved_flops=model_flops / seconds,
        mfu=model_flops / seconds / peak, memory_bytes=used, capacity_bytes=capacity)
    return prediction, timeline
