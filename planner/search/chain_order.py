"""The order of a plan's stage groups along its pipelines: the widest Hamiltonian path over the groups.

Every replica sends each micro-batch's activation down, and its gradient back, over every link
between consecutive stages, so a pipeline's steady period is at least its slowest link's transfer
(``planner.search.evaluate._pipeline_shape``: the busiest link is a machine of the flow shop).
When each stage's data-parallel group sits in its own cluster (a region), the clusters' order is
the pipeline's chain of links: the order here makes the chain's slowest link as fast as any order
can (the bottleneck travelling-salesman path, Garfinkel and Gilbert 1978), then, among those, the
least summed time per byte over the chain (each link's transfer in the pipeline's fill).
"""

import numpy as np

from cost_models.dtfm import open_path_tsp

__all__ = ["widest_chain", "group_bandwidth", "MAX_CHAIN_GROUPS"]

MAX_CHAIN_GROUPS = 12  # Held-Karp is O(2^k k^2) per threshold tried


def group_bandwidth(bandwidth_bytes_per_s: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(k, k) typical bandwidth between ``k`` groups (rows of ``groups``: positions into the square
    ``bandwidth_bytes_per_s``): the median of the links from one group's members to the other's, so
    that one fast pair does not stand for a group of slow ones."""
    k = len(groups)
    between = np.zeros((k, k))
    for a in range(k):
        for b in range(a + 1, k):
            between[a, b] = between[b, a] = float(np.median(bandwidth_bytes_per_s[np.ix_(groups[a], groups[b])]))
    return between


def widest_chain(between: np.ndarray) -> list:
    """An order of the ``k`` groups whose slowest consecutive link (``between``, symmetric bandwidth)
    is the fastest of any order; ties: the least sum of ``1 / bandwidth`` over the chain. A bisection
    over the distinct bandwidths, each step an exact open-path search on the links below it (a path
    of zero such links exists iff the threshold is reachable)."""
    between = np.asarray(between, dtype=float)
    k = between.shape[0]
    if k <= 2:
        return list(range(k))
    if k > MAX_CHAIN_GROUPS:
        raise ValueError(f"widest_chain is exact and limited to {MAX_CHAIN_GROUPS} groups")
    off = ~np.eye(k, dtype=bool)
    values = np.unique(between[off])
    lo, hi = 0, len(values) - 1  # values[lo] is always reachable (every link is at least the slowest)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        below = np.where(off & (between < values[mid]), 1.0, 0.0)
        if open_path_tsp(below)[0] == 0.0:
            lo = mid
        else:
            hi = mid - 1
    with np.errstate(divide="ignore"):
        per_byte = np.where(off, 1.0 / between, 0.0)
    # Links below the threshold cost more than any whole chain above it.
    penalty = k * float(per_byte[off & (between >= values[lo])].max()) + 1.0
    weight = np.where(off & (between < values[lo]), penalty, per_byte)
    return [int(g) for g in open_path_tsp(weight)[1]]
