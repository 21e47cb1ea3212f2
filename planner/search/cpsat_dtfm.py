"""DTFM's allocation problem solved exactly by CP-SAT (OR-Tools), per device or per class of devices.

DTFM (Yuan et al., NeurIPS'22, sec. 3) allocates ``S x D`` devices to ``S`` groups of ``D`` (one
group per pipeline stage) to minimise ``COST_DP + 2 * COST_PP`` (``cost_models.dtfm``): the slowest
member's sharded exchange within any group, plus an open travelling-salesman path over the groups
whose edges are bottleneck perfect matchings between consecutive groups. Groups are numbered by
their position on the path, which removes the path-order variables.

Two models:

- ``exact_dtfm_allocation``, per device (small instances): ``member[d, p]`` puts device d in the
  p-th group, ``match[d, e, p]`` pairs d in group p with e in group p + 1 (a perfect matching per
  consecutive pair), and each consecutive pair pays its matching's bottleneck edge. Devices that
  are interchangeable in the network (``device_classes``) are ordered by position, which removes
  the orderings of one host's identical GPUs.
- ``class_dtfm_allocation``, per class of devices (64 devices and more): a class is a set of
  devices that the network cannot tell apart (the GPUs of one host, the standalone GPUs of one
  data centre, a region's GPUs). The model counts how many devices of each class each group holds
  (``count[p, k]``) and routes a transport between consecutive groups' counts (``flow[p, k, l]``),
  whose bottleneck is the bottleneck perfect matching of the devices. With exact classes its
  optimum is DTFM's optimum. Where classes are merged (too many classes), every cost between two
  classes is the cheapest link between their members, so its bound is still a bound on DTFM's
  objective: a group must pay for the weak links between the classes it mixes, which the pair-by-
  pair bound of the cheapest links cannot see. Identical classes are ordered and the path's
  reversal is broken, both as lexicographic-leader constraints over one variable order.

Times are whole ``RESOLUTION_S``; every answer is re-scored with ``dtfm_cost``.
"""

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from cost_models.comm import sharded_exchange_pair_s
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, bottleneck_matching, network_dtfm_cost
from planner.search.cpsat import RESOLUTION_S, make_solver

__all__ = ["ExactDtfm", "DeviceClasses", "device_classes", "model_classes", "exact_dtfm_allocation",
           "class_dtfm_allocation", "MAX_CLASSES"]

MAX_CLASSES = 24  # the class model's classes at most; beyond, classes are merged by region
KEY_LIMIT = 2**60  # lexicographic keys are kept below this (CP-SAT's integers are 64-bit)


@dataclass(frozen=True, kw_only=True)
class ExactDtfm:
    status: str  # optimal, feasible (time limit), unknown (nothing found in time)
    groups: list | None  # device indices per stage, in path order
    cost_s: float  # DTFM's cost of ``groups`` (``dtfm_cost``), inf when none
    bound_s: float  # proven lower bound on DTFM's cost of any allocation of this shape
    wall_s: float
    exact: bool = True  # the model is DTFM's problem itself (not a relaxation over merged classes)
    work: float = 0.0  # CP-SAT's deterministic time spent


@dataclass(frozen=True, kw_only=True)
class DeviceClasses:
    """A partition of the devices; ``exact``: the devices of each class are interchangeable."""

    members: tuple  # one tuple of device indices per class, ascending
    exact: bool


def device_classes(latency_s: np.ndarray, bandwidth_bytes_per_s: np.ndarray) -> DeviceClasses:
    """Devices the network cannot tell apart: d and e share a class when exchanging them maps both
    link matrices onto themselves (same links to every other device, both directions, and a
    symmetric link between them). Candidates are bucketed by the sorted values of their links
    (which interchangeable devices share) and then compared."""
    n = latency_s.shape[0]
    matrices = [np.asarray(latency_s, dtype=float), np.asarray(bandwidth_bytes_per_s, dtype=float)]
    off = ~np.eye(n, dtype=bool)
    buckets = {}
    for d in range(n):
        key = b"".join(np.sort(m[d][off[d]]).tobytes() + np.sort(m[:, d][off[d]]).tobytes() for m in matrices)
        buckets.setdefault(key, []).append(d)
    classes = []
    for bucket in buckets.values():
        left = np.array(bucket)
        while left.size:
            d, rest = int(left[0]), left[1:]
            same = np.ones(rest.size, dtype=bool)
            for m in matrices:
                rows, cols = m[rest] == m[d], m[:, rest].T == m[:, d]
                for eq in (rows, cols):
                    eq[:, d] = True
                    eq[np.arange(rest.size), rest] = True
                same &= rows.all(axis=1) & cols.all(axis=1) & (m[d, rest] == m[rest, d])
            classes.append((d, *rest[same].tolist()))
            left = rest[~same]
    return DeviceClasses(members=tuple(sorted(classes)), exact=True)


def model_classes(topology) -> DeviceClasses:
    """The class model's classes, at most ``MAX_CLASSES``: the exact ones, else the regions, else one."""
    network = topology.network
    classes = device_classes(network.latency_s, network.bandwidth_bytes_per_s)
    if len(classes.members) <= MAX_CLASSES:
        return classes
    regions = topology.region_ids
    if len(set(regions.tolist())) <= MAX_CLASSES:
        members = tuple(tuple(np.flatnonzero(regions == r).tolist()) for r in sorted(set(regions.tolist())))
        return DeviceClasses(members=members, exact=False)
    return DeviceClasses(members=(tuple(range(topology.size)),), exact=False)


def _class_costs_ns(pair_s: np.ndarray, members: tuple) -> np.ndarray:
    """``K x K`` cheapest cost between a member of class k and another member of class l, rounded
    down to whole ``RESOLUTION_S`` (so the class model never overstates a device allocation); 0
    within a one-device class (no second member)."""
    pair = np.array(pair_s, dtype=float)
    np.fill_diagonal(pair, np.inf)
    K = len(members)
    costs = np.zeros((K, K), dtype=np.int64)
    for k, l in itertools.product(range(K), repeat=2):
        cheapest = pair[np.ix_(members[k], members[l])].min()
        costs[k, l] = int(math.floor(cheapest / RESOLUTION_S)) if np.isfinite(cheapest) else 0
    return costs


class _ClassModel:
    """The class model's variables and constraints, built by the ``_add_*`` methods."""

    def __init__(self, sizes: list, exchange_ns: np.ndarray, edge_ns: np.ndarray, stages: int, replicas: int,
                 every_device: bool):
        self.sizes, self.exchange_ns, self.edge_ns = sizes, exchange_ns, edge_ns
        self.stages, self.replicas, self.every_device = stages, replicas, every_device
        self.model = cp_model.CpModel()
        self.count, self.present, self.flow, self.below, self.bottleneck = {}, {}, {}, {}, []
        self._add_counts()
        self.dp = self._add_dp()
        self._add_transport()
        self._add_symmetry_breaking()
        self.model.minimize(self.dp + 2 * sum(self.bottleneck))

    @property
    def classes(self) -> range:
        return range(len(self.sizes))

    def _add_counts(self):
        m, S, D = self.model, self.stages, self.replicas
        for p, k in itertools.product(range(S), self.classes):
            self.count[p, k] = m.new_int_var(0, min(D, self.sizes[k]), f"count_group{p}_class{k}")
            self.present[p, k] = m.new_bool_var(f"present_group{p}_class{k}")
            m.add(self.count[p, k] >= 1).only_enforce_if(self.present[p, k])
            m.add(self.count[p, k] == 0).only_enforce_if(~self.present[p, k])
        for p in range(S):
            m.add(sum(self.count[p, k] for k in self.classes) == D)
        for k in self.classes:
            used = sum(self.count[p, k] for p in range(S))
            m.add(used == self.sizes[k]) if self.every_device else m.add(used <= self.sizes[k])

    def _add_dp(self):
        """COST_DP: a member of class k in group p exchanges with every other member of its group."""
        m, ex = self.model, self.exchange_ns
        horizon = int(ex.max(initial=0)) * max(self.replicas - 1, 0)
        dp = m.new_int_var(min(self._dp_floor_ns(), horizon), horizon, "cost_dp_ns")
        if self.replicas > 1:
            for p, k in itertools.product(range(self.stages), self.classes):
                others = sum(int(ex[k, l]) * self.count[p, l] for l in self.classes) - int(ex[k, k])
                m.add(dp >= others).only_enforce_if(self.present[p, k])
        return dp

    def _dp_floor_ns(self) -> int:
        """When every device is used, COST_DP is at least what any member pays for its ``D - 1``
        cheapest partners (the class of the member that pays most for them)."""
        if not self.every_device or self.replicas < 2:
            return 0
        floor = 0
        for k in self.classes:
            partners = np.repeat(self.exchange_ns[k], [s - (l == k) for l, s in enumerate(self.sizes)])
            floor = max(floor, int(np.sort(partners)[:self.replicas - 1].sum()))
        return floor

    def _add_transport(self):
        """COST_PP: consecutive groups' counts joined by a transport (a perfect matching of their
        devices by class); each consecutive pair pays the dearest class pair its transport uses."""
        m, D, edge = self.model, self.replicas, self.edge_ns
        for p in range(self.stages - 1):
            for k, l in itertools.product(self.classes, repeat=2):
                cap = min(D, self.sizes[k], self.sizes[l]) if k != l or self.sizes[k] > 1 else 0
                self.flow[p, k, l] = m.new_int_var(0, cap, f"flow_group{p}_class{k}_to_class{l}")
            for k in self.classes:
                m.add(sum(self.flow[p, k, l] for l in self.classes) == self.count[p, k])
                m.add(sum(self.flow[p, l, k] for l in self.classes) == self.count[p + 1, k])
            cheapest = int(min(edge[k, l] for k, l in itertools.product(self.classes, repeat=2)
                               if k != l or self.sizes[k] > 1))
            bottleneck = m.new_int_var(cheapest, int(edge.max()), f"bottleneck_group{p}")
            for k, l in itertools.product(self.classes, repeat=2):
                value = int(edge[k, l])
                if value > cheapest:
                    if (p, value) not in self.below:
                        self.below[p, value] = _le(m, bottleneck, value - 1, f"bottleneck{p}_below_{value}ns")
                    m.add(self.flow[p, k, l] == 0).only_enforce_if(self.below[p, value])
            self.bottleneck.append(bottleneck)

    def _add_symmetry_breaking(self):
        """Lexicographic leader over the counts in row-major order (group 0's classes first): two
        identical classes k < l keep column k >= column l (lexicographically by group), and when
        the links are symmetric the path's reversal keeps group 0's row >= group S-1's (a prefix
        of each comparison where the keys would overflow)."""
        m, S, base = self.model, self.stages, self.replicas + 1
        depth = max(1, int(math.log(KEY_LIMIT) / math.log(base)))
        for k, l in self.identical_class_pairs():
            rows = range(min(S, depth))
            m.add(sum(base ** (len(rows) - 1 - i) * self.count[p, k] for i, p in enumerate(rows))
                  >= sum(base ** (len(rows) - 1 - i) * self.count[p, l] for i, p in enumerate(rows)))
        if S > 1 and np.array_equal(self.edge_ns, self.edge_ns.T):
            cols = list(self.classes)[:depth]
            m.add(sum(base ** (len(cols) - 1 - i) * self.count[0, k] for i, k in enumerate(cols))
                  >= sum(base ** (len(cols) - 1 - i) * self.count[S - 1, k] for i, k in enumerate(cols)))

    def identical_class_pairs(self) -> list:
        """Consecutive pairs (k, l), k < l, of classes that exchanging maps the model onto itself."""
        pairs, K = [], len(self.sizes)
        for k in range(K):
            for l in range(k + 1, K):
                if self._swappable(k, l):
                    pairs.append((k, l))
                    break  # k's next identical class; transpositions of consecutive ones generate the rest
        return pairs

    def _swappable(self, k: int, l: int) -> bool:
        if self.sizes[k] != self.sizes[l]:
            return False
        perm = np.arange(len(self.sizes))
        perm[[k, l]] = [l, k]
        return all(np.array_equal(c, c[np.ix_(perm, perm)]) for c in (self.exchange_ns, self.edge_ns))

    def add_hint(self, counts: np.ndarray, flows: np.ndarray) -> None:
        """Counts ``(S, K)`` and flows ``(S - 1, K, K)`` of a device allocation."""
        for (p, k), var in self.count.items():
            self.model.add_hint(var, int(counts[p, k]))
            self.model.add_hint(self.present[p, k], bool(counts[p, k]))
        for (p, k, l), var in self.flow.items():
            self.model.add_hint(var, int(flows[p, k, l]))
        K = len(self.sizes)
        if self.replicas > 1:
            self.model.add_hint(self.dp, max(int(self.exchange_ns[k] @ counts[p]) - int(self.exchange_ns[k, k])
                                             for p in range(self.stages) for k in range(K) if counts[p, k]))
        for p, bottleneck in enumerate(self.bottleneck):
            value = max(int(self.edge_ns[k, l]) for k in range(K) for l in range(K) if flows[p, k, l])
            self.model.add_hint(bottleneck, value)
            for (q, threshold), flag in self.below.items():
                if q == p:
                    self.model.add_hint(flag, value <= threshold - 1)


def _le(model, var, value: int, name: str):
    """A literal equivalent to ``var <= value``."""
    flag = model.new_bool_var(name)
    model.add(var <= value).only_enforce_if(flag)
    model.add(var >= value + 1).only_enforce_if(~flag)
    return flag


def _hint_counts(network, groups: list, members: tuple, identical: list) -> tuple:
    """(counts, flows) of a device allocation along its path, with identical classes relabelled in
    the symmetry breaking's order and the path reversed where that breaking asks for it."""
    n = network.latency_s.shape[0]
    K = len(members)
    class_of = np.empty(n, dtype=np.int64)
    for k, c in enumerate(members):
        class_of[list(c)] = k
    ordered = [list(groups[j]) for j in network_dtfm_cost(network, groups).order]
    edge = network.transfer_matrix_s(DTFM_C_PP_BYTES)

    def profile(path):
        counts = np.array([np.bincount(class_of[g], minlength=K) for g in path])
        flows = np.zeros((len(path) - 1, K, K), dtype=np.int64)
        for p, (a, b) in enumerate(zip(path, path[1:])):
            _, cols = bottleneck_matching(edge[np.ix_(a, b)])
            np.add.at(flows[p], (class_of[a], class_of[np.asarray(b)[cols]]), 1)
        return counts, flows

    counts, flows = profile(ordered)
    if tuple(counts[0]) < tuple(counts[-1]) and np.array_equal(edge, edge.T):
        counts, flows = profile(ordered[::-1])
    relabel = np.arange(K)
    changed = True
    while changed:
        changed = False
        for k, l in identical:
            if tuple(counts[:, relabel[k]]) < tuple(counts[:, relabel[l]]):
                relabel[[k, l]] = relabel[[l, k]]
                changed = True
    return counts[:, relabel], flows[:, relabel][:, :, relabel]


def class_dtfm_allocation(topology, stages: int, replicas: int, *, time_limit_s: float = 60.0,
                          work_limit: float | None = None, hint: list | None = None, workers: int = 1,
                          classes: DeviceClasses | None = None) -> ExactDtfm:
    """DTFM's allocation over classes of devices (this module's second model).

    ``work_limit``: CP-SAT's deterministic time (the reproducible budget; ``time_limit_s`` caps the
    wall clock). ``exact`` in the answer: the classes are interchangeable devices, so an optimal
    status is DTFM's optimum; otherwise only ``bound_s`` speaks of DTFM's problem, and ``groups`` is
    an allocation (re-scored) built from the merged classes' counts."""
    started = time.perf_counter()
    n = topology.size
    if stages * replicas > n:
        raise ValueError(f"{stages} x {replicas} needs more than the topology's {n} devices")
    network = topology.network
    if classes is None:
        classes = model_classes(topology)
    members = classes.members
    exchange_s = sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s, replicas)
    model = _ClassModel([len(c) for c in members], _class_costs_ns(exchange_s, members),
                        _class_costs_ns(network.transfer_matrix_s(DTFM_C_PP_BYTES), members), stages, replicas,
                        every_device=stages * replicas == n)
    if hint is not None:
        model.add_hint(*_hint_counts(network, hint, members, model.identical_class_pairs()))
    solver = make_solver(time_limit_s, workers=workers, work_limit=work_limit)
    status = solver.solve(model.model)
    wall = time.perf_counter() - started
    # The class costs are rounded down: the model's bound is a bound on DTFM's objective as it is
    # (less one unit, so that the conversion to seconds cannot round it above an optimum).
    bound = max(0.0, (solver.best_objective_bound - 1) * RESOLUTION_S)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"invalid CP-SAT DTFM class model: {model.model.validate()}")
        return ExactDtfm(status="unknown", groups=None, cost_s=math.inf, bound_s=bound, wall_s=wall,
                         exact=classes.exact, work=solver.deterministic_time)
    groups = [[] for _ in range(stages)]
    for k, c in enumerate(members):
        free = list(c)
        for p in range(stages):
            take = solver.value(model.count[p, k])
            groups[p] += free[:take]
            free = free[take:]
    groups = [sorted(g) for g in groups]
    cost = network_dtfm_cost(network, groups).total_s
    return ExactDtfm(status="optimal" if status == cp_model.OPTIMAL else "feasible", groups=groups, cost_s=cost,
                     bound_s=bound, wall_s=wall, exact=classes.exact, work=solver.deterministic_time)


def exact_dtfm_allocation(topology, stages: int, replicas: int, *, time_limit_s: float = 60.0,
                          work_limit: float | None = None, hint: list | None = None, workers: int = 1) -> ExactDtfm:
    """Optimal allocation of ``stages x replicas`` of the topology's devices under DTFM's objective
    (this module's first model, per device).

    ``hint``: groups (device lists per stage) from a heuristic, to start from."""
    started = time.perf_counter()
    n = topology.size
    if stages * replicas > n:
        raise ValueError(f"{stages} x {replicas} needs more than the topology's {n} devices")
    network = topology.network
    # Each member's exchange with one other member: 2 (alpha + c_dp / (D beta)) (sec. 3.2).
    exchange_s = sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s, replicas)
    exchange_ns = np.rint(exchange_s / RESOLUTION_S).astype(np.int64)
    edge_ns = np.rint(network.transfer_matrix_s(DTFM_C_PP_BYTES) / RESOLUTION_S).astype(np.int64)
    np.fill_diagonal(edge_ns, 0)

    model = cp_model.CpModel()
    member = {(d, p): model.new_bool_var(f"device{d}_in_group{p}") for d in range(n) for p in range(stages)}
    for d in range(n):
        model.add_at_most_one(member[d, p] for p in range(stages))
    for p in range(stages):
        model.add(sum(member[d, p] for d in range(n)) == replicas)
    # Interchangeable devices: the lower index sits at an earlier position (unused counts as last).
    position = {d: sum(p * member[d, p] for p in range(stages))
                + stages * (1 - sum(member[d, p] for p in range(stages))) for d in range(n)}
    classes = device_classes(network.latency_s, network.bandwidth_bytes_per_s).members
    for c in classes:
        for d, e in zip(c, c[1:]):
            model.add(position[d] <= position[e])
    # COST_DP: the slowest member of any group.
    dp_horizon = int(exchange_ns.sum(axis=1).max())
    dp = model.new_int_var(0, dp_horizon, "cost_dp_ns")
    if replicas > 1:
        for d, p in itertools.product(range(n), range(stages)):
            model.add(dp >= sum(int(exchange_ns[d, e]) * member[e, p] for e in range(n) if e != d)) \
                .only_enforce_if(member[d, p])
    # COST_PP: consecutive groups joined by a perfect matching; each pays its bottleneck edge.
    pp_terms = []
    for p in range(stages - 1):
        match = {(d, e): model.new_bool_var(f"match_{d}_{e}_at{p}") for d in range(n) for e in range(n) if d != e}
        for d in range(n):
            model.add(sum(match[d, e] for e in range(n) if e != d) == member[d, p])
            model.add(sum(match[e, d] for e in range(n) if e != d) == member[d, p + 1])
        bottleneck = model.new_int_var(0, int(edge_ns.max()), f"bottleneck_at{p}")
        for (d, e), flag in match.items():
            model.add_implication(flag, member[d, p])
            model.add_implication(flag, member[e, p + 1])
            model.add(bottleneck >= int(edge_ns[d, e])).only_enforce_if(flag)
        pp_terms.append(bottleneck)
    model.minimize(dp + 2 * sum(pp_terms))
    if hint is not None:
        order = network_dtfm_cost(topology.network, hint).order  # the model numbers groups along the path
        at = np.full(n, stages)
        for p, j in enumerate(order):
            at[list(hint[j])] = p
        for c in classes:  # the hint's positions handed to each class's devices in index order
            at[list(c)] = np.sort(at[list(c)])
        for d, p in member:
            model.add_hint(member[d, p], bool(at[d] == p))

    solver = make_solver(time_limit_s, workers=workers, work_limit=work_limit)
    status = solver.solve(model)
    wall = time.perf_counter() - started
    # Rounding to whole nanoseconds: at most half a nanosecond per exchanged pair and per path edge.
    allowance_s = (replicas * 0.5 + 2 * (stages - 1) * 0.5 + 1) * RESOLUTION_S
    bound = max(0.0, solver.best_objective_bound * RESOLUTION_S - allowance_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"invalid CP-SAT DTFM model: {model.validate()}")
        return ExactDtfm(status="unknown", groups=None, cost_s=math.inf, bound_s=bound, wall_s=wall,
                         work=solver.deterministic_time)
    groups = [[d for d in range(n) if solver.value(member[d, p])] for p in range(stages)]
    cost = network_dtfm_cost(topology.network, groups).total_s
    return ExactDtfm(status="optimal" if status == cp_model.OPTIMAL else "feasible", groups=groups, cost_s=cost,
                     bound_s=bound, wall_s=wall, work=solver.deterministic_time)
