"""Search under DTFM's own objective (``COST_DP + 2 * COST_PP``), and the baselines it is compared to.

Ours: constructive allocations from the network's locality (each pipeline inside one locality, each
data-parallel group inside one, or each group built from one device of every host), then a seeded
local search (``planner.search.dtfm_moves``: single swaps, host blocks exchanged between groups,
a host gathered into one group or spread over several, and bounded walks over equal-cost moves to
leave plateaus), then CP-SAT's class model (``planner.search.cpsat_dtfm``; one class per device
where no two are interchangeable) started from its answer. The bound reported with the answer is
the best of CP-SAT's, the class-profile bound (``planner.search.dtfm_bound``) and the cheapest
links' (``dtfm_floor_s``). Under this objective the order of the groups along the pipeline and
which device feeds which are exact (Held-Karp's path and bottleneck matchings), so moves only
change the partition.

Budget: the local search's evaluations and CP-SAT's deterministic time are sized by the time limit
at fixed rates (``EVALUATIONS_PER_S``, ``EXACT_WORK_PER_S``), so the same seed and limit give the
same allocation on an unloaded or a loaded machine; the clock only caps them (``clock_cut``).

Baselines: a re-implementation of DTFM's GCMA (100 random individuals, 4,900 steady-state trials,
five-point crossover on group labels, greedy balance repair, a local search by its gain function,
replacement of the worse parent when the child beats the first parent), random allocation, and
contiguous allocation (consecutive devices per group, Megatron's default).
"""

import time
from dataclasses import dataclass, field

import numpy as np

from cost_models.comm import sharded_exchange_pair_s
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, bottleneck_matching, network_dtfm_cost
from planner.search.cpsat_dtfm import class_dtfm_allocation, model_classes
from planner.search.dtfm_bound import profile_bound_s
from planner.search.dtfm_moves import local_search
from planner.search.locality import locality_order

__all__ = ["DtfmResult", "dtfm_degrees", "dtfm_search", "gcma", "random_allocation", "contiguous_allocation",
           "host_strided_allocation", "groups_to_pipelines", "dtfm_floor_s"]


LOCAL_SHARE = 0.4  # of the time limit for the local search; CP-SAT gets the rest
# Fixed rates that turn the time limit into deterministic work, set below what a 2-core machine does
# unloaded: an incremental evaluation of 8 x 8 groups takes 3-8 ms; CP-SAT's class model on DTFM's
# 64-device cases ran 3 units of deterministic time in 4-15 s of wall clock (unloaded-loaded).
EVALUATIONS_PER_S = 100.0
EXACT_WORK_PER_S = 0.25
MAX_EXACT_WORK = 20.0  # CP-SAT's deterministic time at most, whatever the limit


@dataclass(kw_only=True)
class DtfmResult:
    groups: list  # stage j -> device indices (in pipeline order after groups_to_pipelines)
    cost_s: float
    dp_s: float
    pp_s: float
    evaluations: int
    wall_s: float
    history: list = field(default_factory=list)
    algorithm: str = ""
    bound_s: float = 0.0  # lower bound on DTFM's objective of every allocation of this shape
    exact_status: str = ""  # CP-SAT's: optimal (the answer is proven optimal), feasible, unknown, or "" (not run)
    clock_cut: list = field(default_factory=list)  # phases the clock ended before their work budget

    @property
    def gap(self) -> float:
        return max(0.0, 1.0 - self.bound_s / self.cost_s) if self.cost_s > 0 else 0.0


def _score(topology, groups):
    return network_dtfm_cost(topology.network, groups)


def dtfm_degrees(n: int, layers: int) -> list:
    """(stages, replicas) with stages x replicas = n and stages dividing the layers (DTFM's constraints;
    at most 12 stages, the limit of the exact stage-order search)."""
    return [(s, n // s) for s in range(1, min(n, layers, 12) + 1) if n % s == 0 and layers % s == 0]


def contiguous_allocation(n: int, stages: int, replicas: int) -> list:
    return [list(range(j * replicas, (j + 1) * replicas)) for j in range(stages)]


def random_allocation(n: int, stages: int, replicas: int, rng) -> list:
    perm = rng.permutation(n)[: stages * replicas]
    return [sorted(perm[j * replicas:(j + 1) * replicas].tolist()) for j in range(stages)]


def host_strided_allocation(host_ids: np.ndarray, order: np.ndarray, stages: int, replicas: int) -> list:
    """Groups dealt one device of every host at a time: the devices in ``order`` are taken in rounds
    (the first device of every host, largest hosts first, then every host's second, ...) and the
    sequence is cut into groups. On 8 hosts of 4 GPUs and 32 single GPUs this gives 4 groups of
    one GPU of each 4-GPU host (joined host by host along the pipeline) and 4 groups of singles."""
    order = np.asarray(order)
    hosts = host_ids[order]
    sizes = np.bincount(hosts)
    rank = np.zeros(len(order), dtype=np.int64)  # a device's index among its host's devices
    for h in np.unique(hosts):
        rank[hosts == h] = np.arange(int((hosts == h).sum()))
    first_seen = {h: i for i, h in reversed(list(enumerate(hosts.tolist())))}
    host_rank = np.array([first_seen[h] for h in hosts.tolist()])
    sequence = order[np.lexsort((host_rank, -sizes[hosts], rank))][: stages * replicas]
    return [sorted(sequence[j * replicas:(j + 1) * replicas].tolist()) for j in range(stages)]


def _constructive(topology, stages: int, replicas: int) -> dict:
    ordered = locality_order(topology, np.arange(topology.size))
    used = ordered[: stages * replicas]
    pipelines = used.reshape(replicas, stages)
    return {"pipelines-local": [sorted(pipelines[:, j].tolist()) for j in range(stages)],
            "stages-local": [sorted(used[j * replicas:(j + 1) * replicas].tolist()) for j in range(stages)],
            "host-strided": host_strided_allocation(topology.host_ids, ordered, stages, replicas)}


def dtfm_floor_s(topology, stages: int, replicas: int) -> float:
    """A bound from the cheapest links alone: COST_DP at least the ``D - 1`` cheapest exchanges of
    the member that pays most for them when every device is used (of the one that pays least
    otherwise), plus twice ``S - 1`` of the cheapest pipeline edges."""
    network, n = topology.network, topology.size
    pair = sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s, replicas)
    np.fill_diagonal(pair, np.inf)
    dp = 0.0
    if replicas > 1:
        cheapest = np.sort(pair, axis=1)[:, :replicas - 1].sum(axis=1)
        dp = float(cheapest.max() if stages * replicas == n else cheapest.min())
    edge = network.transfer_matrix_s(DTFM_C_PP_BYTES)
    np.fill_diagonal(edge, np.inf)
    return dp + 2.0 * (stages - 1) * float(edge.min()) if n > 1 else dp


def dtfm_search(topology, stages: int, replicas: int, *, rng=None, seed: int = 0, time_limit_s: float = 10.0,
                max_evaluations: int | None = None, exact_work: float | None = None) -> DtfmResult:
    """Constructive starts, local search and CP-SAT under DTFM's objective (this module's description).

    ``max_evaluations`` defaults to ``LOCAL_SHARE`` of the time limit at ``EVALUATIONS_PER_S``;
    ``exact_work`` (CP-SAT's deterministic time) to the rest of the limit, less the evaluations
    made, at ``EXACT_WORK_PER_S``: both fixed by the seed and the limit. ``time_limit_s`` caps the
    wall clock."""
    started = time.perf_counter()
    rng = rng if rng is not None else np.random.default_rng(seed)
    deadline = started + time_limit_s
    if max_evaluations is None:
        max_evaluations = max(1, int(EVALUATIONS_PER_S * LOCAL_SHARE * time_limit_s))
    fixed_work = exact_work is not None
    evaluations, history, clock_cut = 0, [], []
    best, best_cost = None, None
    for groups in _constructive(topology, stages, replicas).values():
        cost = _score(topology, groups)
        evaluations += 1
        if best_cost is None or cost.total_s < best_cost.total_s:
            best, best_cost = groups, cost
    history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
    algorithm = "construct+local"
    if stages > 1:
        local_deadline = started + LOCAL_SHARE * time_limit_s
        found, used, cut = local_search(topology, best, rng, max_evaluations, local_deadline)
        evaluations += used
        if cut:
            clock_cut.append("local")
        if found.cost_s < best_cost.total_s - 1e-12:
            best, best_cost = found.groups, _score(topology, found.groups)
            history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
    classes = model_classes(topology)
    bound = max(dtfm_floor_s(topology, stages, replicas),
                profile_bound_s(topology.network, classes.members, stages, replicas))
    status = ""
    if not fixed_work:  # CP-SAT's share, with what the local search's evaluations left of theirs
        exact_work = min(MAX_EXACT_WORK, EXACT_WORK_PER_S * (time_limit_s - evaluations / EVALUATIONS_PER_S))
    if stages * replicas > 1 and exact_work > 0:
        remaining = max(0.1, 0.95 * (deadline - time.perf_counter()))  # the model is built in the rest
        exact = class_dtfm_allocation(topology, stages, replicas, hint=best, time_limit_s=remaining,
                                      work_limit=exact_work, classes=classes)
        if exact.status != "optimal" and exact.work < 0.99 * exact_work:
            clock_cut.append("exact")
        algorithm += f"+cpsat-classes({exact.status})"
        bound = max(bound, exact.bound_s)
        status = exact.status if exact.exact else f"{exact.status} (merged classes)"
        if exact.groups is not None and exact.cost_s < best_cost.total_s - 1e-12:
            best, best_cost = exact.groups, _score(topology, exact.groups)
            history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
    return DtfmResult(groups=[sorted(g) for g in best], cost_s=best_cost.total_s, dp_s=best_cost.dp_s,
                      pp_s=best_cost.pp_s, evaluations=evaluations, wall_s=time.perf_counter() - started,
                      history=history, algorithm=algorithm, bound_s=bound,
                      exact_status=status, clock_cut=clock_cut)


def _labels(groups, n):
    label = np.full(n, -1)
    for j, g in enumerate(groups):
        label[g] = j
    return label


def _repair(label, stages, replicas, rng):
    """Greedy balance repair: move random devices from over-full groups to under-full ones."""
    label = label.copy()
    sizes = np.bincount(label, minlength=stages)
    for j in range(stages):
        while sizes[j] > replicas:
            members = np.flatnonzero(label == j)
            d = members[int(rng.integers(len(members)))]
            target = int(np.flatnonzero(sizes < replicas)[0])
            label[d] = target
            sizes[j] -= 1
            sizes[target] += 1
    return label


def _gcma_local_search(label, edge, stages, rng):
    """DTFM's cyclic-partitioning step between two random groups with its gain function: moving d
    from A to B gains (cost to d's nearest member of A) - (mean cost to B's members); pairs are swapped
    greedily, locked, and the best prefix of the sequence is kept."""
    a, b = rng.choice(stages, size=2, replace=False)
    A, B = list(np.flatnonzero(label == a)), list(np.flatnonzero(label == b))

    def gain(d, own, other):
        mates = [e for e in own if e != d]
        nearest = min(edge[d, e] for e in mates) if mates else 0.0
        return nearest - float(np.mean([edge[d, e] for e in other]))

    locked, swaps, total, best_total, best_len = set(), [], 0.0, 0.0, 0
    for _ in range(min(len(A), len(B))):
        options = [(gain(u, A, B) + gain(v, B, A), u, v) for u in A for v in B if u not in locked and v not in locked]
        if not options:
            break
        g, u, v = max(options)
        A[A.index(u)], B[B.index(v)] = v, u
        locked.update((u, v))
        swaps.append((u, v))
        total += g
        if total > best_total:
            best_total, best_len = total, len(swaps)
    label = label.copy()
    for u, v in swaps[:best_len]:
        label[u], label[v] = b, a
    return label


def gcma(topology, stages: int, replicas: int, *, rng=None, seed: int = 0, population: int = 100,
         trials: int = 4900, time_limit_s: float = float("inf")) -> DtfmResult:
    """DTFM's hybrid genetic algorithm, re-implemented under its own cost (with a real seed)."""
    started = time.perf_counter()
    rng = rng if rng is not None else np.random.default_rng(seed)
    n = topology.size
    edge = topology.network.transfer_matrix_s(DTFM_C_PP_BYTES)
    pool, costs = [], []
    for _ in range(population):
        groups = random_allocation(n, stages, replicas, rng)
        pool.append(_labels(groups, n))
        costs.append(_score(topology, groups).total_s)
    best = int(np.argmin(costs))
    best_label, best_cost = pool[best].copy(), costs[best]
    history = [(population, time.perf_counter() - started, best_cost)]
    evaluations = population
    for _ in range(trials):
        if time.perf_counter() - started > time_limit_s:
            break
        p1, p2 = rng.choice(population, size=2, replace=False)
        cuts = np.sort(rng.choice(np.arange(1, n), size=5, replace=False))
        child = pool[p1].copy()
        segments = np.split(np.arange(n), cuts)
        for k, segment in enumerate(segments):
            if k % 2:
                child[segment] = pool[p2][segment]
        child = _repair(child, stages, replicas, rng)
        child = _gcma_local_search(child, edge, stages, rng)
        groups = [np.flatnonzero(child == j).tolist() for j in range(stages)]
        cost = _score(topology, groups).total_s
        evaluations += 1
        if cost < costs[p1]:
            worse = p1 if costs[p1] >= costs[p2] else p2
            pool[worse], costs[worse] = child, cost
        if cost < best_cost:
            best_label, best_cost = child.copy(), cost
            history.append((evaluations, time.perf_counter() - started, best_cost))
    groups = [np.flatnonzero(best_label == j).tolist() for j in range(stages)]
    final = _score(topology, groups)
    return DtfmResult(groups=groups, cost_s=final.total_s, dp_s=final.dp_s, pp_s=final.pp_s,
                      evaluations=evaluations, wall_s=time.perf_counter() - started, history=history,
                      algorithm="gcma")


def groups_to_pipelines(topology, groups) -> np.ndarray:
    """(replicas, stages) device indices: groups in the objective's stage order, consecutive groups
    joined by their bottleneck matchings (who feeds whom)."""
    cost = _score(topology, groups)
    edge = topology.network.transfer_matrix_s(DTFM_C_PP_BYTES)
    ordered = [list(groups[j]) for j in cost.order]
    pipelines = [[d] for d in ordered[0]]
    for nxt in ordered[1:]:
        tails = [p[-1] for p in pipelines]
        _, cols = bottleneck_matching(edge[np.ix_(tails, nxt)])
        for p, c in zip(pipelines, cols):
            p.append(nxt[c])
    return np.array(pipelines)


