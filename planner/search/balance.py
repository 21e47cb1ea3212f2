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
from dataclasses import replace

import numpy as np

from cost_models.schedule import run_depth
from planner.prediction.stage_model import LayerCosts, peak_table, stage_memory_bytes

__all__ = ["split_layers", "split_batch"]


def _stage_limits(costs, stages, speed, capacity, peak, tensor):
    """Per stage: the slowest replica's speed and the most layers memory allows on every replica
    (``peak``: ``stage_model.peak_table``)."""
    slowest = speed.min(axis=0)
    by_memory = np.empty(stages, dtype=np.int64)
    for s in range(stages):
        at = {k: v[:, s] for k, v in peak.items()}
        mem_zero = stage_memory_bytes(costs, 0, s, tensor=tensor[:, s], **at)
        per_layer = stage_memory_bytes(costs, 1, s, tensor=tensor[:, s], **at) - mem_zero
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
                 micro_batches: np.ndarray, *, even: bool = False, head_slowdown: float = 1.0, tensor=None):
    """Optimal layer counts per stage (min of the max per-micro-batch stage time, memory respected).

    ``speed``, ``capacity_bytes`` and ``tensor`` (tensor degrees, 1 where None) are (R, S) arrays of
    the placed devices. Returns the list of
    counts, or None when no split fits in memory. ``even``: the most even split that fits instead.
    """
    R, S = speed.shape
    if S > costs.layers:
        return None
    if head_slowdown != 1.0:  # the head at its own efficiency: its FLOPs count that many times
        costs = replace(costs, head_flops=costs.head_flops * head_slowdown)
    tensor = np.ones((R, S)) if tensor is None else tensor
    limits = _stage_limits(costs, S, speed, capacity_bytes,
                           peak_table(schedule, S, micro_batches, costs.micro_batches_per_round,
                                      warmup_depth=run_depth(schedule, costs.warmup_depth)), tensor)
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
    (at most ``_BISECTIONS`` steps of O(R)) stops once at most 2R micro-batches are left undecided or
    the interval reaches adjacent floats; a greedy gives the rest to the replica that finishes earliest
    with them, several at a time where one replica stays earliest (a zero bottleneck takes them all at
    once), so no step depends on ``total``.
    """
    R = len(fill_s)
    cap = np.full(R, total, dtype=np.int64) if cap is None else np.minimum(cap, total)
    if total < R or (cap < 1).any() or cap.sum() < total:
        return None
    inverse = 1.0 / np.maximum(bottleneck_s, 1e-300)
    most = cap.astype(float)

    def count(limit):
        with np.errstate(over="ignore", invalid="ignore"):  # a zero bottleneck takes any number at its fill time
            more = np.floor((limit - fill_s) * inverse)
        return np.clip(more + 1.0, 1.0, most).astype(np.int64)

    lo, hi = float(fill_s.min()), float((fill_s + (cap - 1) * bottleneck_s).max())
    for _ in range(64):  # rounding may leave the last micro-batch just past hi
        if count(hi).sum() >= total:
            break
        hi = 2.0 * hi + 1e-300 if hi > 0 else hi + 1.0
    below, above = int(count(lo).sum()), int(count(hi).sum())
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if above - below <= 2 * R or not lo < mid < hi:
            break
        placed = int(count(mid).sum())
        if placed >= total:
            hi, above = mid, placed
        else:
            lo, below = mid, placed
    counts = count(lo)
    if counts.sum() > total:  # only at the first lo, when every replica takes one
        counts = np.ones(R, dtype=np.int64)
    left = int(total - counts.sum())
    heap = [(fill_s[r] + counts[r] * bottleneck_s[r], r) for r in range(R) if counts[r] < cap[r]]
    heapq.heapify(heap)
    while left > 0 and heap:
        finish, r = heapq.heappop(heap)
        take = 1
        if bottleneck_s[r] <= 0:
            take = left
        elif heap:  # as many as keep this replica the earliest to finish
            take = max(1, int(min(left, (heap[0][0] - finish) / bottleneck_s[r] + 1)))
        take = min(take, left, int(cap[r] - counts[r]))
        counts[r] += take
        left -= take
        if counts[r] < cap[r]:
            heapq.heappush(heap, (fill_s[r] + counts[r] * bottleneck_s[r], r))
    return counts if left == 0 else None


_BISECTIONS = 2200  # halving a float64 interval reaches adjacent floats well before this
