"""DTFM's own objective, for comparison on its own terms (Yuan et al., NeurIPS'22, sec. 3).

``COST = COST_DP + 2 * COST_PP`` over an allocation of devices into ``D_PP`` groups of ``D_DP``:
a sharded all-to-all within each group, plus an open travelling-salesman path over the groups whose
edge weights are bottleneck perfect matchings. No compute, memory or bubble term. Callers pass
the latency and bandwidth matrices of ``cost_models.network.Network`` (links capped by shared NICs).
"""

import itertools

import numpy as np
from scipy.optimize import linear_sum_assignment

from cost_models.comm import p2p_time_s, sharded_exchange_time_s

__all__ = ["DTFM_C_DP_BYTES", "DTFM_C_PP_BYTES", "dtfm_cost", "network_dtfm_cost", "dp_cost_s", "pp_edge_cost_s",
           "bottleneck_matching", "open_path_tsp", "DtfmCost"]

# Their released constants, verbatim: c_dp = 1.3e9 params * 4 B * 3/24 layers (GB); c_pp keeps the
# "2024" typo for hidden 2048 and divides by 2^30; their time formula multiplies GB by 8 and
# divides by Gbit/s, so the GB here are 1e9 bytes.
DTFM_C_DP_BYTES = 1.3e9 * 4 * 3 / 24
DTFM_C_PP_BYTES = 2024 * 2048 * 2 * (1.25e5 / 2048) / 2**30 * 1e9


class DtfmCost(tuple):
    """(total_s, dp_s, pp_s, stage order) as a named tuple-like result."""

    @property
    def total_s(self): return self[0]

    @property
    def dp_s(self): return self[1]

    @property
    def pp_s(self): return self[2]

    @property
    def order(self): return self[3]


def dp_cost_s(latency_s, bandwidth_bytes_per_s, groups, c_dp_bytes: float = DTFM_C_DP_BYTES) -> float:
    """``COST_DP = max_j max_{d in C_j} sum_{e != d} 2 (alpha[d][e] + c_dp / (D_DP beta[d][e]))``."""
    worst = 0.0
    for group in groups:
        g = np.asarray(group)
        worst = max(worst, sharded_exchange_time_s(c_dp_bytes, latency_s[np.ix_(g, g)],
                                                   bandwidth_bytes_per_s[np.ix_(g, g)]))
    return worst


def pp_edge_cost_s(latency_s, bandwidth_bytes_per_s, c_pp_bytes: float = DTFM_C_PP_BYTES) -> np.ndarray:
    """Edge cost of one device feeding another: ``alpha[d][e] + c_pp / beta[d][e]`` (seconds)."""
    with np.errstate(divide="ignore"):
        return p2p_time_s(c_pp_bytes, np.asarray(latency_s, dtype=float),
                          np.asarray(bandwidth_bytes_per_s, dtype=float))


def bottleneck_matching(cost: np.ndarray) -> tuple:
    """``min over bijections pi of max_d cost[d, pi(d)]`` and one optimal bijection.

    Binary search over the sorted distinct costs; a threshold admits a perfect matching iff the
    assignment problem on the 0/1 matrix "edge above threshold" has optimum 0 (Hungarian method in
    scipy). The returned matching minimises the sum among bottleneck-optimal ones.
    """
    values = np.unique(cost)
    # Every row's and every column's cheapest edge must be usable: a lower bound to start from.
    floor = max(cost.min(axis=1).max(), cost.min(axis=0).max())
    lo, hi = int(np.searchsorted(values, floor)), len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        blocked = (cost > values[mid]).astype(float)
        rows, cols = linear_sum_assignment(blocked)
        if blocked[rows, cols].sum() == 0:
            hi = mid
        else:
            lo = mid + 1
    bottleneck = values[lo]
    rows, cols = linear_sum_assignment(np.where(cost <= bottleneck, cost, 1e18))
    return float(bottleneck), cols


def open_path_tsp(weight: np.ndarray) -> tuple:
    """Shortest Hamiltonian path (any start, any end) by Held-Karp dynamic programming.

    Exact; ``O(2^n n^2)``, vectorised over all subsets of one size at a time; fine up to about 16
    groups. Returns (length, order).
    """
    weight = np.asarray(weight, dtype=float)
    n = weight.shape[0]
    if n == 1:
        return 0.0, [0]
    if n > 16:
        raise ValueError("open_path_tsp is exact and limited to 16 nodes")
    full = 1 << n
    dp = np.full((full, n), np.inf)
    parent = np.full((full, n), -1, dtype=np.int64)
    dp[1 << np.arange(n), np.arange(n)] = 0.0
    masks = np.arange(full)
    popcount = np.array([bin(m).count("1") for m in range(full)])
    bits = (masks[:, None] >> np.arange(n)[None, :]) & 1
    for size in range(1, n):
        layer = masks[popcount == size]
        # extend every path ending in j (in mask) by an unvisited k
        total = dp[layer][:, :, None] + weight[None, :, :]  # (m, j, k)
        best_j = total.argmin(axis=1)  # (m, k)
        best = np.take_along_axis(total, best_j[:, None, :], axis=1)[:, 0, :]
        free = bits[layer] == 0
        rows, ks = np.nonzero(free)
        targets = layer[rows] | (1 << ks)
        values = best[rows, ks]
        order = np.lexsort((values, targets * n + ks))
        targets, ks, values, js = targets[order], ks[order], values[order], best_j[rows, ks][order]
        keys = targets * n + ks
        first = np.ones(len(keys), dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        dp[targets[first], ks[first]] = values[first]
        parent[targets[first], ks[first]] = js[first]
    end = int(np.argmin(dp[full - 1]))
    order, mask = [end], full - 1
    while parent[mask, order[-1]] >= 0:
        previous = int(parent[mask, order[-1]])
        mask ^= 1 << order[-1]
        order.append(previous)
    return float(dp[full - 1, end]), order[::-1]


def dtfm_cost(latency_s, bandwidth_bytes_per_s, groups, *, c_dp_bytes: float = DTFM_C_DP_BYTES,
              c_pp_bytes: float = DTFM_C_PP_BYTES) -> DtfmCost:
    """``COST_DP + 2 * COST_PP`` for ``groups`` (one list of device indices per stage)."""
    latency_s = np.asarray(latency_s, dtype=float)
    bandwidth_bytes_per_s = np.asarray(bandwidth_bytes_per_s, dtype=float)
    dp = dp_cost_s(latency_s, bandwidth_bytes_per_s, groups, c_dp_bytes)
    edge = pp_edge_cost_s(latency_s, bandwidth_bytes_per_s, c_pp_bytes)
    n = len(groups)
    between = np.zeros((n, n))
    for a, b in itertools.permutations(range(n), 2):
        between[a, b] = bottleneck_matching(edge[np.ix_(groups[a], groups[b])])[0]
    pp, order = open_path_tsp(between)
    return DtfmCost((dp + 2.0 * pp, dp, pp, order))


def network_dtfm_cost(network, groups) -> DtfmCost:
    """``dtfm_cost`` over the links of a ``cost_models.network.Network`` (NIC-capped bandwidth,
    latency with the per-message overhead)."""
    return dtfm_cost(network.latency_s, network.bandwidth_bytes_per_s, groups)
