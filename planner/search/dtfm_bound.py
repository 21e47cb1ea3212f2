"""A lower bound on DTFM's objective from how often consecutive groups change their mix of classes.

Devices fall into classes (``planner.search.cpsat_dtfm.device_classes``: a host's GPUs, a region's);
a group's *profile* counts its devices per class. When every device is used, the profiles of the
``S`` groups add up to the class sizes. Along the pipeline, two consecutive groups with the same
profile can be matched class to class; two with different profiles must send some device to another
class, over a link between classes. So, with ``c`` the number of consecutive pairs whose profiles
differ:

- ``c = 0``: every group holds ``sizes / S`` (only where that is whole), whose exchange and
  class-to-class matching are computed exactly;
- ``c = 1``: a block of ``m`` groups of profile P, then ``S - m`` groups of profile Q with
  ``m P + (S - m) Q = sizes``; every such pair (P, Q) is enumerated and costed exactly (exchange of
  the dearer profile, matchings inside each block and one between them);
- ``c = 2``: three blocks, enumerated likewise among the profiles whose exchange is cheap enough
  for the allocation to beat the other cases' bounds;
- ``c >= 3``: COST_DP at least its floor (the member that pays most for its ``D - 1`` cheapest
  partners), three path edges at least the cheapest link between two classes, the rest at least
  the cheapest link.

The smallest of the three bounds every allocation. Costs between classes are the cheapest between
their members, so merged (not interchangeable) classes still give a bound. On DTFM's world-wide case
(8 regions of 8 GPUs) it is 39.67 s where CP-SAT's class model stays at 31.08 s after 60 s.
"""

import itertools

import numpy as np

from cost_models.comm import sharded_exchange_pair_s
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, bottleneck_matching

__all__ = ["profile_bound_s", "MAX_PROFILES"]

MAX_PROFILES = 20_000  # profiles enumerated for c = 1 at most; beyond, c >= 1 by the cheapest links
MAX_PAIRS = 2_500  # pairs of profiles enumerated for c = 2 at most; beyond, c = 2 by the cheapest links


def _class_costs_s(pair_s: np.ndarray, members: tuple, *, alone: float) -> np.ndarray:
    """Cheapest cost between a member of class k and another member of class l; ``alone`` within a
    one-device class (which has no second member)."""
    pair = np.array(pair_s, dtype=float)
    np.fill_diagonal(pair, np.inf)
    K = len(members)
    costs = np.empty((K, K))
    for k, l in itertools.product(range(K), repeat=2):
        costs[k, l] = pair[np.ix_(members[k], members[l])].min() if (k != l or len(members[k]) > 1) else alone
    return costs


def _profiles(sizes: np.ndarray, total: int, limit: int):
    """Every vector of ``len(sizes)`` whole counts adding to ``total``, each at most its size; None
    when there are more than ``limit``."""
    out = []

    def extend(prefix, k, left):
        if len(out) > limit:
            return
        if k == len(sizes) - 1:
            if left <= sizes[k]:
                out.append(prefix + [left])
            return
        for x in range(min(left, sizes[k]) + 1):
            extend(prefix + [x], k + 1, left - x)

    extend([], 0, total)
    return None if len(out) > limit else np.array(out, dtype=np.int64)


class _Costs:
    """A profile's COST_DP and the bottleneck matching between two profiles, at class costs."""

    def __init__(self, exchange: np.ndarray, edge: np.ndarray):
        self.exchange, self.edge = exchange, edge

    def dp(self, profile: np.ndarray) -> float:
        return float(self.dp_all(profile[None, :])[0])

    def dp_all(self, profiles: np.ndarray) -> np.ndarray:
        """COST_DP of each row of ``profiles``: its dearest present class's member."""
        member = profiles @ self.exchange.T - np.diag(self.exchange)[None, :]
        return np.where(profiles > 0, member, -np.inf).max(axis=1)

    def match(self, a: np.ndarray, b: np.ndarray) -> float:
        rows = np.repeat(np.arange(len(a)), a)
        cols = np.repeat(np.arange(len(b)), b)
        return bottleneck_matching(self.edge[np.ix_(rows, cols)])[0]


def profile_bound_s(network, members: tuple, stages: int, replicas: int, *,
                    max_profiles: int = MAX_PROFILES, max_pairs: int = MAX_PAIRS) -> float:
    """This module's bound for ``stages`` groups of ``replicas`` over classes ``members`` that hold
    every device (0 where devices are left out or there is one group: the argument needs both)."""
    S, D = stages, replicas
    sizes = np.array([len(c) for c in members], dtype=np.int64)
    if S < 2 or int(sizes.sum()) != S * D:
        return 0.0
    pair = sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s, D)
    costs = _Costs(_class_costs_s(pair, members, alone=0.0),
                   _class_costs_s(network.transfer_matrix_s(DTFM_C_PP_BYTES), members, alone=np.inf))
    K = len(sizes)
    cheapest = float(costs.edge.min())
    between = float(min((costs.edge[k, l] for k in range(K) for l in range(K) if k != l), default=np.inf))
    floor = 0.0
    if D > 1:
        for k in range(K):
            partners = np.repeat(costs.exchange[k], sizes - (np.arange(K) == k))
            floor = max(floor, float(np.sort(partners)[:D - 1].sum()))
    options = []
    if not (sizes % S).any():  # c = 0
        even = sizes // S
        options.append(costs.dp(even) + 2.0 * (S - 1) * costs.match(even, even))
    profiles = _profiles(sizes, D, max_profiles)
    if profiles is None:  # c >= 1 by the cheapest links
        options.append(floor + 2.0 * ((S - 2) * cheapest + between))
        return float(min(options))
    dp = costs.dp_all(profiles)
    index = {p.tobytes(): i for i, p in enumerate(profiles)}
    if S - 1 >= 3:  # c >= 3
        options.append(floor + 2.0 * ((S - 4) * cheapest + 3 * between))
    for m in range(1, S):  # c = 1, where its cheapest links could beat the best so far
        rest = sizes[None, :] - m * profiles
        fits = np.flatnonzero((rest >= 0).all(axis=1) & ~(rest % (S - m)).any(axis=1))
        for i in fits:
            second = rest[i] // (S - m)
            j = index[second.tobytes()]
            if i != j and max(dp[i], dp[j]) + 2.0 * ((S - 2) * cheapest + between) < min(options, default=np.inf):
                options.append(_blocks_s(costs, [(m, profiles[i]), (S - m, second)]))
    if S - 1 >= 2:  # c = 2, among the profiles cheap enough to beat the best so far
        limit = min(options, default=np.inf) - 2.0 * ((S - 3) * cheapest + 2 * between)
        cheap = np.flatnonzero(dp < limit)
        if len(cheap) ** 2 > max_pairs:  # too many to enumerate: c = 2 by the cheapest links
            options.append(floor + 2.0 * ((S - 3) * cheapest + 2 * between))
            cheap = cheap[:0]
        for i, j in itertools.product(cheap, repeat=2):
            if i == j:
                continue
            for m1, m2 in itertools.product(range(1, S - 1), repeat=2):
                m3 = S - m1 - m2
                if m3 < 1:
                    continue
                rest = sizes - m1 * profiles[i] - m2 * profiles[j]
                if (rest < 0).any() or (rest % m3).any():
                    continue
                k = index[(rest // m3).tobytes()]
                if k != j and max(dp[i], dp[j], dp[k]) + 2.0 * ((S - 3) * cheapest + 2 * between) \
                        < min(options, default=np.inf):
                    options.append(_blocks_s(costs, [(m1, profiles[i]), (m2, profiles[j]), (m3, profiles[k])]))
    # Less a relative 1e-12: sums in another order than ``dtfm_cost``'s must not round above an optimum.
    return float(min(options)) * (1.0 - 1e-12) if options else 0.0


def _blocks_s(costs: _Costs, blocks: list) -> float:
    """DTFM's objective at class costs of consecutive blocks of ``m`` groups of one profile each."""
    dp = max(costs.dp(profile) for _, profile in blocks)
    inside = sum((m - 1) * costs.match(profile, profile) for m, profile in blocks if m > 1)
    across = sum(costs.match(a, b) for (_, a), (_, b) in zip(blocks, blocks[1:]))
    return dp + 2.0 * (inside + across)
