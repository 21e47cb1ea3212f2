"""Search under DTFM's own objective (``COST_DP + 2 * COST_PP``), and the baselines it is compared to.

Ours: constructive allocations from the network's locality (each pipeline inside one locality, or
each data-parallel group inside one), then a seeded local search of swaps between groups with an
evaluation budget; on up to 16 devices, CP-SAT's exact allocation (``planner.search.cpsat_dtfm``)
started from it. Baselines: a re-implementation of DTFM's GCMA (100 random individuals, 4,900
steady-state trials, five-point crossover on group labels, greedy balance repair, a local search
by its gain function, replacement of the worse parent when the child beats the first parent),
random allocation, and contiguous allocation (consecutive devices per group, Megatron's default).
"""

import time
from dataclasses import dataclass, field

import numpy as np

from cost_models.dtfm import DTFM_C_PP_BYTES, bottleneck_matching, network_dtfm_cost
from planner.search.locality import locality_order
from planner.search.cpsat_dtfm import exact_dtfm_allocation

__all__ = ["DtfmResult", "dtfm_degrees", "dtfm_search", "gcma", "random_allocation", "contiguous_allocation", "groups_to_pipelines"]


EXACT_DEVICES = 16  # up to this many devices the allocation is also solved by CP-SAT
EXACT_SECONDS = 5.0


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


def _constructive(topology, stages: int, replicas: int) -> dict:
    ordered = locality_order(topology, np.arange(topology.size))[: stages * replicas]
    pipelines = ordered.reshape(replicas, stages)
    return {"pipelines-local": [sorted(pipelines[:, j].tolist()) for j in range(stages)],
            "stages-local": [sorted(ordered[j * replicas:(j + 1) * replicas].tolist()) for j in range(stages)]}


def dtfm_search(topology, stages: int, replicas: int, *, rng=None, seed: int = 0, max_evaluations: int = 400,
                time_limit_s: float = 10.0) -> DtfmResult:
    """Constructive start + local search of swaps between groups under DTFM's objective."""
    started = time.perf_counter()
    rng = rng if rng is not None else np.random.default_rng(seed)
    evaluations, history = 0, []
    best, best_cost = None, None
    for groups in _constructive(topology, stages, replicas).values():
        cost = _score(topology, groups)
        evaluations += 1
        if best_cost is None or cost.total_s < best_cost.total_s:
            best, best_cost = groups, cost
    history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
    deadline = started + time_limit_s
    stale = 0
    while stages > 1 and evaluations < max_evaluations and time.perf_counter() < deadline \
            and stale < 3 * stages * replicas:
        a, b = rng.choice(stages, size=2, replace=False)
        i, k = int(rng.integers(replicas)), int(rng.integers(replicas))
        trial = [list(g) for g in best]
        trial[a][i], trial[b][k] = trial[b][k], trial[a][i]
        cost = _score(topology, trial)
        evaluations += 1
        if cost.total_s < best_cost.total_s - 1e-12:
            best, best_cost, stale = trial, cost, 0
            history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
        else:
            stale += 1
    algorithm = "construct+local"
    if topology.size <= EXACT_DEVICES and stages * replicas > 1:
        # Small instances: CP-SAT's optimum, started from the local search's answer (sec. 3's problem
        # is small enough there to solve in well under a second).
        exact = exact_dtfm_allocation(topology, stages, replicas, hint=best,
                                      time_limit_s=max(0.1, min(EXACT_SECONDS, deadline - time.perf_counter())))
        algorithm += f"+cpsat({exact.status})"
        if exact.groups is not None and exact.cost_s < best_cost.total_s - 1e-12:
            best, best_cost = exact.groups, _score(topology, exact.groups)
            history.append((evaluations, time.perf_counter() - started, best_cost.total_s))
    return DtfmResult(groups=[sorted(g) for g in best], cost_s=best_cost.total_s, dp_s=best_cost.dp_s,
                      pp_s=best_cost.pp_s, evaluations=evaluations, wall_s=time.perf_counter() - started,
                      history=history, algorithm=algorithm)


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


