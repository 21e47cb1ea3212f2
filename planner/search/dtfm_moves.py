"""Local search under DTFM's objective: structural moves on a partition of devices into groups,
scored incrementally, with bounded walks over equal-cost moves.

The moves (each changes the partition only; the path order and the matchings are exact):

- ``swap``: two devices of two groups trade places (DTFM's own neighbourhood).
- ``block``: the devices of one host (or region) in a group trade places, all at once, with as many
  devices of another group, those of one host (or region) there first.
- ``gather``: a host's (or region's) devices spread over several groups move into one of them,
  each trading places with a device of another host.
- ``spread``: a host's (or region's) devices in one group, all but one, move to as many other
  groups (one each), each trading places with a device there: groups built from one device of
  each host, which pipelines matched host by host need.

DTFM's objective is made of maxima and bottlenecks, so most moves tie. Ties are broken by a
smoother score (every group's exchange on average, and every pair of groups' mean matched edge,
which falls as two groups come to hold devices of the same hosts before their bottleneck does);
a move that ties on both is accepted, up to ``PLATEAU_STEPS`` in a row, after which the walk
returns to the best allocation. The search ends after ``STALE_FACTOR`` times the device count
moves without a strict improvement, on its evaluation budget, or at the deadline.
The random choices come from ``rng`` only: the same seed and budget give the same allocation.
"""

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from cost_models.comm import sharded_exchange_pair_s
from cost_models.dtfm import DTFM_C_DP_BYTES, bottleneck_matching, open_path_tsp, pp_edge_cost_s

__all__ = ["LocalResult", "local_search", "MOVES", "PLATEAU_STEPS", "STALE_FACTOR"]

MOVES = ("swap", "block", "gather", "spread")
MOVE_WEIGHTS = (0.4, 0.3, 0.15, 0.15)
PLATEAU_STEPS = 40  # equal-cost moves accepted in a row, at most, before the walk returns to the best
STALE_FACTOR = 3  # evaluations without a strict improvement, per device, that end the search
TIE = 1e-9  # relative difference below which two costs are equal


@dataclass(frozen=True, kw_only=True)
class LocalResult:
    groups: list
    cost_s: float
    moves_accepted: dict  # move name -> moves that improved the cost or walked a plateau


@dataclass(kw_only=True)
class _State:
    groups: list  # lists of device indices
    dp: np.ndarray  # per group: its slowest member's exchange (s)
    between: np.ndarray  # bottleneck matching cost of group a feeding group b (s)
    soft: np.ndarray  # mean edge of that matching (s)
    total_s: float  # DTFM's objective
    tie_break_s: float  # the mean group's exchange + twice S - 1 mean matching edges of all pairs of groups


class _Scorer:
    """DTFM's objective of a partition, recomputing only the groups a move changed (the same
    formulas as ``cost_models.dtfm.dtfm_cost``, on the same matrices)."""

    def __init__(self, network, replicas: int):
        self.pair = sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s,
                                            replicas)
        self.edge = pp_edge_cost_s(network.latency_s, network.bandwidth_bytes_per_s)
        self.symmetric = bool(np.array_equal(self.edge, self.edge.T))

    def _dp(self, group: list) -> float:
        return float(self.pair[np.ix_(group, group)].sum(axis=1).max()) if len(group) > 1 else 0.0

    def _match(self, a: list, b: list) -> tuple:
        """(``bottleneck_matching``'s value, the mean edge of its matching, which has the least sum
        among the bottleneck's matchings). Most pairs of groups match at the floor (every row's and
        every column's cheapest edge), which one assignment confirms."""
        cost = self.edge[np.ix_(a, b)]
        floor = max(cost.min(axis=1).max(), cost.min(axis=0).max())
        masked = np.where(cost <= floor, cost, np.inf)
        try:
            rows, cols = linear_sum_assignment(masked)
            return float(floor), float(cost[rows, cols].mean())
        except ValueError:  # no matching at the floor
            value, cols = bottleneck_matching(cost)
            return value, float(cost[np.arange(len(a)), cols].mean())

    def full(self, groups: list) -> _State:
        S = len(groups)
        between, soft = np.zeros((S, S)), np.zeros((S, S))
        for a in range(S):
            for b in range(S):
                if a == b:
                    continue
                if self.symmetric and b < a:
                    between[a, b], soft[a, b] = between[b, a], soft[b, a]
                else:
                    between[a, b], soft[a, b] = self._match(groups[a], groups[b])
        return self._state(groups, np.array([self._dp(g) for g in groups]), between, soft)

    def update(self, state: _State, groups: list, changed: set) -> _State:
        dp, between, soft = state.dp.copy(), state.between.copy(), state.soft.copy()
        for a in changed:
            dp[a] = self._dp(groups[a])
            for b in range(len(groups)):
                if b != a:
                    between[a, b], soft[a, b] = self._match(groups[a], groups[b])
                    if self.symmetric:
                        between[b, a], soft[b, a] = between[a, b], soft[a, b]
                    else:
                        between[b, a], soft[b, a] = self._match(groups[b], groups[a])
        return self._state(groups, dp, between, soft)

    @staticmethod
    def _state(groups, dp, between, soft) -> _State:
        S = len(groups)
        pp = open_path_tsp(between)[0] if S > 1 else 0.0
        mean_soft = float(soft.sum()) / (S * (S - 1)) if S > 1 else 0.0
        return _State(groups=groups, dp=dp, between=between, soft=soft, total_s=float(dp.max()) + 2.0 * pp,
                      tie_break_s=float(dp.mean()) + 2.0 * (S - 1) * mean_soft)


def _swap(groups, a, i, b, k):
    groups[a][i], groups[b][k] = groups[b][k], groups[a][i]


def _move_swap(groups, unit, rng) -> set:
    a, b = (int(x) for x in rng.choice(len(groups), size=2, replace=False))
    _swap(groups, a, int(rng.integers(len(groups[a]))), b, int(rng.integers(len(groups[b]))))
    return {a, b}


def _move_block(groups, unit, rng) -> set:
    a, b = (int(x) for x in rng.choice(len(groups), size=2, replace=False))
    mine = unit[groups[a]]
    h = mine[int(rng.integers(len(mine)))]
    block = [i for i, u in enumerate(mine) if u == h]
    theirs = unit[groups[b]]
    others = [k for k, u in enumerate(theirs) if u != h]
    if not others:
        return set()
    h2 = theirs[others[int(rng.integers(len(others)))]]
    first = [k for k in others if theirs[k] == h2]
    rest = [k for k in others if theirs[k] != h2]
    partners = first + [rest[int(x)] for x in rng.permutation(len(rest))]
    for i, k in zip(block, partners):
        _swap(groups, a, i, b, k)
    return {a, b}


def _move_gather(groups, unit, rng) -> set:
    where = {}
    for g, group in enumerate(groups):
        for i, d in enumerate(group):
            where.setdefault(unit[d], []).append((g, i))
    spread = [h for h, places in where.items() if len({g for g, _ in places}) > 1]
    if not spread:
        return set()
    h = spread[int(rng.integers(len(spread)))]
    places = where[h]
    b = places[int(rng.integers(len(places)))][0]
    room = [k for k, d in enumerate(groups[b]) if unit[d] != h]
    outside = [(g, i) for g, i in places if g != b]
    picked = rng.permutation(len(outside))[:len(room)]
    slots = rng.permutation(room)
    changed = {b}
    for (g, i), k in zip((outside[int(x)] for x in picked), slots):
        _swap(groups, g, i, b, int(k))
        changed.add(g)
    return changed


def _move_spread(groups, unit, rng) -> set:
    crowded = [(g, h) for g, group in enumerate(groups) for h in set(unit[group].tolist())
               if int((unit[group] == h).sum()) > 1]
    if not crowded:
        return set()
    a, h = crowded[int(rng.integers(len(crowded)))]
    members = [i for i, d in enumerate(groups[a]) if unit[d] == h][1:]
    targets = [g for g in rng.permutation(len(groups)).tolist() if g != a][:len(members)]
    changed = {a}
    for i, c in zip(members, targets):
        options = [k for k, d in enumerate(groups[c]) if unit[d] != h]
        if options:
            _swap(groups, a, i, c, options[int(rng.integers(len(options)))])
            changed.add(c)
    return changed


_MOVE_FUNCTIONS = {"swap": _move_swap, "block": _move_block, "gather": _move_gather, "spread": _move_spread}


def _units(topology) -> list:
    """The locality levels the structural moves act on: hosts, then regions (those that group devices)."""
    levels = []
    for ids in (topology.host_ids, topology.region_ids):
        if len(np.unique(ids)) < topology.size and not any(np.array_equal(ids, level) for level in levels):
            levels.append(np.asarray(ids))
    return levels or [np.arange(topology.size)]


def _compare(a: _State, b: _State) -> int:
    """-1, 0 or 1 as ``a`` is better than, ties or is worse than ``b``: DTFM's objective first (equal
    within ``TIE``), then the tie-break, which tells apart allocations that the objective's maxima
    and bottlenecks do not (one more pair of groups matched inside hosts, one cheaper group)."""
    for x, y in ((a.total_s, b.total_s), (a.tie_break_s, b.tie_break_s)):
        if x < y - TIE * abs(y):
            return -1
        if x > y + TIE * abs(y):
            return 1
    return 0


def local_search(topology, groups: list, rng, budget: int, deadline: float) -> tuple:
    """(``LocalResult``, evaluations, whether the clock ended it) from ``groups`` (this module's
    description); at most ``budget`` evaluations."""
    scorer = _Scorer(topology.network, len(groups[0]))
    levels = _units(topology)
    best = current = scorer.full([list(g) for g in groups])
    accepted = dict.fromkeys(MOVES, 0)
    evaluations, stale, plateau = 0, 0, 0
    stale_limit = STALE_FACTOR * sum(len(g) for g in groups)
    while evaluations < budget and stale < stale_limit:
        if time.perf_counter() >= deadline:
            return LocalResult(groups=best.groups, cost_s=best.total_s, moves_accepted=accepted), evaluations, True
        name = MOVES[int(rng.choice(len(MOVES), p=MOVE_WEIGHTS))]
        unit = levels[int(rng.integers(len(levels)))]
        trial = [list(g) for g in current.groups]
        changed = _MOVE_FUNCTIONS[name](trial, unit, rng)
        stale += 1
        if not changed or all(sorted(trial[g]) == sorted(current.groups[g]) for g in changed):
            continue
        evaluations += 1
        state = scorer.update(current, trial, changed)
        step = _compare(state, current)
        if step < 0 or (step == 0 and plateau < PLATEAU_STEPS):
            plateau = 0 if step < 0 else plateau + 1
            current = state
            accepted[name] += 1
            if _compare(current, best) < 0:
                best, stale = current, 0
        elif plateau >= PLATEAU_STEPS:
            current, plateau = best, 0
    return LocalResult(groups=best.groups, cost_s=best.total_s, moves_accepted=accepted), evaluations, False
