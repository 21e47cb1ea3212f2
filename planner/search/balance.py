"""Exact layer split and batch split for a fixed placement (the inner problems of the search).

Layer split: stage boundaries shared by all replicas; minimise the slowest (replica, stage) time per
micro-batch subject to memory on every device. Every stage's constraints depend only on its own
layer count, so a greedy fill that gives each stage as many layers as the threshold allows decides
feasibility exactly, and a binary search over the candidate thresholds gives the optimum (the
linear-partition / line-balancing problem; cf. OR-Tools' line_balancing_sat example, which
``planner.search.cpsat.exact_layer_split`` solves as a CP-SAT model for cross-checking).

Batch split: replica r with ``M`` micro-batches takes about ``fill_r + (M - 1) * bottleneck_r``
(flow-shop makespan for identical jobs, formulas.md with per-stage times); giving micro-batches one
at a time to the replica that finishes earliest with one more is optimal for this min-max.
"""

import heapq
from dataclasses import dataclass, replace

import numpy as np

from cost_models import flops, memory

__all__ = ["LayerCosts", "layer_costs", "stage_seconds", "stage_memory_bytes", "in_flight_microbatches", "split_layers",
           "split_batch"]


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerCosts:
    """Per-layer and per-stage-extra work and memory for one micro-batch of ``micro_batch`` sequences."""

    layers: int
    layer_flops: float  # forward + backward (+ recompute) of one block
    head_flops: float  # forward + backward of the LM head, last stage
    layer_params: float
    first_params: float  # embeddings
    last_params: float  # final norm + head (+ tied copy)
    layer_kept_bytes: float
    first_kept_bytes: float
    last_kept_bytes: float
    transient_bytes: float
    last_transient_bytes: float
    state_bytes_per_param: float
    boundary_bytes: float


def layer_costs(model, training, micro_batch: int, stages: int) -> LayerCosts:
    b, s, h, a, v = micro_batch, model.sequence, model.hidden, model.heads, model.vocabulary
    dtype = training.activation_bytes
    fwd = flops.layer_forward_flops(b, s, h, model.ffn_hidden, gated_mlp=model.gated_mlp)
    kept = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention,
                                         recompute=training.recompute)
    full = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention)
    boundary = float(b * s * h * dtype)
    last_params = flops.head_parameters(v, h, tied=model.tied_embeddings, biases=model.biases)
    if model.tied_embeddings and stages > 1:
        last_params += v * h
    first_params = flops.embedding_parameters(v, h, s, learned_positions=model.learned_positions)
    if stages == 1:
        first_params += last_params
        last_params = 0.0
    transient = 2.0 * boundary + (full if training.recompute else 0.0)
    return LayerCosts(
        layers=model.layers, layer_flops=fwd * flops.training_flops_multiplier(training.recompute),
        head_flops=3.0 * flops.head_forward_flops(b, s, h, v),
        layer_params=float(flops.layer_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp,
                                                  biases=model.biases)),
        first_params=float(first_params), last_params=float(last_params), layer_kept_bytes=kept,
        first_kept_bytes=boundary, last_kept_bytes=memory.logits_bytes(s, b, v), transient_bytes=transient,
        last_transient_bytes=memory.logits_bytes(s, b, v),
        state_bytes_per_param=memory.state_bytes_per_parameter(training.precision, training.optimizer),
        boundary_bytes=boundary)


def stage_seconds(costs: LayerCosts, n_layers, stage: int, stages: int, speed):
    """Forward+backward seconds per micro-batch of a stage with ``n_layers`` on devices of ``speed`` FLOP/s."""
    work = n_layers * costs.layer_flops + (costs.head_flops if stage == stages - 1 else 0.0)
    return work / speed


def stage_memory_bytes(costs: LayerCosts, n_layers, stage: int, stages: int, in_flight):
    """Peak bytes of a stage with ``n_layers`` (state + in-flight activations + transient)."""
    params = n_layers * costs.layer_params + (costs.first_params if stage == 0 else 0.0) \
        + (costs.last_params if stage == stages - 1 else 0.0)
    kept = n_layers * costs.layer_kept_bytes + (costs.first_kept_bytes if stage == 0 else 0.0) \
        + (costs.last_kept_bytes if stage == stages - 1 else 0.0)
    transient = costs.transient_bytes + (costs.last_transient_bytes if stage == stages - 1 else 0.0)
    return params * costs.state_bytes_per_param + in_flight * kept + transient


def in_flight_microbatches(schedule: str, stages: int, microbatches: np.ndarray) -> np.ndarray:
    """(R, S) in-flight micro-batches per worker (``memory.in_flight_microbatches``, vectorised)."""
    m = np.asarray(microbatches, dtype=np.int64)[:, None]
    if schedule == "gpipe":
        return np.repeat(m, stages, axis=1)
    if schedule == "1f1b":
        return np.minimum(stages - np.arange(stages)[None, :], m)
    raise ValueError(f"unknown schedule {schedule!r}")


def _stage_limits(costs, stages, speed, capacity, in_flight):
    """Per stage: the slowest replica's speed and the most layers memory allows on every replica."""
    slowest = speed.min(axis=0)
    by_memory = np.empty(stages, dtype=np.int64)
    for s in range(stages):
        mem_zero = stage_memory_bytes(costs, 0, s, stages, in_flight[:, s])
        per_layer = costs.layer_params * costs.state_bytes_per_param + in_flight[:, s] * costs.layer_kept_bytes
        by_memory[s] = int(max(np.floor((capacity[:, s] - mem_zero) / per_layer + 1e-9).min(), -1))
    return slowest.tolist(), np.minimum(by_memory, costs.layers).tolist()


def _fill(costs, stages, slowest, by_memory, limit_s):
    """Layer counts within ``limit_s`` and memory, as even as the limits allow (None if they cannot all fit).

    Stage s may take at most ``most[s]`` layers; it takes about an even share of what is left, but
    never so few that the stages after it cannot hold the rest (their suffix capacity).
    """
    most = []
    for s in range(stages):
        head = costs.head_flops if s == stages - 1 else 0.0
        by_time = np.floor((limit_s * slowest[s] - head) / costs.layer_flops + 1e-9)
        most.append(int(min(by_time, by_memory[s])))
    if min(most) < 1 or sum(most) < costs.layers:
        return None
    suffix = np.concatenate([np.cumsum(most[::-1])[::-1], [0]])
    counts, left = [], costs.layers
    for s in range(stages):
        remaining = stages - s
        take = min(most[s], max(-(-left // remaining), left - int(suffix[s + 1])))
        take = min(take, left - (remaining - 1))
        if take < 1:
            return None
        counts.append(take)
        left -= take
    return counts if left == 0 else None


def split_layers(costs: LayerCosts, schedule: str, speed: np.ndarray, capacity_bytes: np.ndarray,
                 microbatches: np.ndarray, *, even: bool = False, head_slowdown: float = 1.0):
    """Optimal layer counts per stage (min of the max per-micro-batch stage time, memory respected).

    ``speed`` and ``capacity_bytes`` are (R, S) arrays of the placed devices. Returns the list of
    counts, or None when no split fits in memory. ``even``: the most even split that fits instead.
    """
    R, S = speed.shape
    if S > costs.layers:
        return None
    if head_slowdown != 1.0:  # the head at its own efficiency: its FLOPs count that many times
        costs = replace(costs, head_flops=costs.head_flops * head_slowdown)
    limits = _stage_limits(costs, S, speed, capacity_bytes, in_flight_microbatches(schedule, S, microbatches))
    slowest, by_memory = limits
    if even:  # the most even split memory allows, whatever the compute balance
        return _fill(costs, S, slowest, by_memory, np.inf)
    n = np.arange(1, costs.layers - S + 2)
    candidates = [(n * costs.layer_flops + (costs.head_flops if s == S - 1 else 0.0)) / slowest[s] for s in range(S)]
    values = np.unique(np.concatenate(candidates))
    if _fill(costs, S, slowest, by_memory, values[-1]) is None:
        return None
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _fill(costs, S, slowest, by_memory, values[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _fill(costs, S, slowest, by_memory, values[lo])


def split_batch(total: int, fill_s: np.ndarray, bottleneck_s: np.ndarray, cap: np.ndarray | None = None):
    """Micro-batch counts per replica minimising ``max_r fill_r + (M_r - 1) * bottleneck_r``.

    ``cap[r]`` bounds ``M_r`` (GPipe keeps every micro-batch in flight). None when ``total`` cannot
    be placed (fewer micro-batches than replicas, or caps too small). A bisection on the finish time
    places all but a few micro-batches at once; the greedy finishes the rest one at a time.
    """
    R = len(fill_s)
    cap = np.full(R, total, dtype=np.int64) if cap is None else np.minimum(cap, total)
    if total < R or (cap < 1).any() or cap.sum() < total:
        return None
    step = np.maximum(bottleneck_s, 1e-300)

    def count(limit):
        return np.clip(np.floor((limit - fill_s) / step).astype(np.int64) + 1, 1, cap)

    lo, hi = float(fill_s.min()), float((fill_s + (total - 1) * step).max())
    for _ in range(32):
        mid = 0.5 * (lo + hi)
        if count(mid).sum() >= total:
            hi = mid
        else:
            lo = mid
    counts = count(lo)
    if counts.sum() > total:
        counts = np.ones(R, dtype=np.int64)
    heap = [(fill_s[r] + counts[r] * bottleneck_s[r], r) for r in range(R) if counts[r] < cap[r]]
    heapq.heapify(heap)
    for _ in range(int(total - counts.sum())):
        if not heap:
            return None
        _, r = heapq.heappop(heap)
        counts[r] += 1
        if counts[r] < cap[r]:
            heapq.heappush(heap, (fill_s[r] + counts[r] * bottleneck_s[r], r))
    return counts
