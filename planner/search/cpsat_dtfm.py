"""DTFM's allocation problem solved exactly by CP-SAT (OR-Tools), for small instances.

DTFM (Yuan et al., NeurIPS'22, sec. 3) allocates ``S x D`` devices to ``S`` groups of ``D`` (one
group per pipeline stage) to minimise ``COST_DP + 2 * COST_PP`` (``cost_models.dtfm``): the slowest
member's sharded exchange within any group, plus an open travelling-salesman path over the groups
whose edges are bottleneck perfect matchings between consecutive groups. Its GCMA is a heuristic;
this model gives the optimum to compare it (and our ``dtfm_search``) with.

Groups are numbered by their position on the path, which removes the path-order variables:
``member[d, p]`` puts device d in the p-th group, ``match[d, e, p]`` pairs d in group p with e in
group p + 1 (a perfect matching per consecutive pair), and each consecutive pair pays its matching's
bottleneck edge. Times are whole ``RESOLUTION_S``; the answer is re-scored with ``dtfm_cost``.
"""

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from cost_models.comm import sharded_exchange_pair_s
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, network_dtfm_cost
from planner.search.cpsat import RESOLUTION_S, make_solver

__all__ = ["ExactDtfm", "exact_dtfm_allocation"]


@dataclass(frozen=True, kw_only=True)
class ExactDtfm:
    status: str  # optimal, feasible (time limit), unknown (nothing found in time)
    groups: list | None  # device indices per stage, in path order
    cost_s: float  # DTFM's cost of ``groups`` (``dtfm_cost``), inf when none
    bound_s: float  # proven lower bound on DTFM's cost of any allocation of this shape
    wall_s: float


def exact_dtfm_allocation(topology, stages: int, replicas: int, *, time_limit_s: float = 60.0,
                          hint: list | None = None, workers: int = 1) -> ExactDtfm:
    """Optimal allocation of ``stages x replicas`` of the topology's devices under DTFM's objective.

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
        for p, group in enumerate(hint[j] for j in order):
            for d in range(n):
                model.add_hint(member[d, p], d in group)

    solver = make_solver(time_limit_s, workers=workers)
    status = solver.solve(model)
    wall = time.perf_counter() - started
    # Rounding to whole nanoseconds: at most half a nanosecond per exchanged pair and per path edge.
    allowance_s = (replicas * 0.5 + 2 * (stages - 1) * 0.5 + 1) * RESOLUTION_S
    bound = max(0.0, solver.best_objective_bound * RESOLUTION_S - allowance_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"invalid CP-SAT DTFM model: {model.validate()}")
        return ExactDtfm(status="unknown", groups=None, cost_s=math.inf, bound_s=bound, wall_s=wall)
    groups = [[d for d in range(n) if solver.value(member[d, p])] for p in range(stages)]
    cost = network_dtfm_cost(topology.network, groups).total_s
    return ExactDtfm(status="optimal" if status == cp_model.OPTIMAL else "feasible", groups=groups, cost_s=cost,
                     bound_s=bound, wall_s=wall)

