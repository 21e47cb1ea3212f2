"""CP-SAT models (OR-Tools). The layer split for a fixed placement as line balancing: minimise the
slowest stage's per-micro-batch time subject to memory (cf. OR-Tools' line_balancing_sat example).
Used to cross-check the greedy split of ``planner.search.balance``."""

import numpy as np
from ortools.sat.python import cp_model

from planner.prediction.stage_model import LayerCosts, stage_memory_bytes

__all__ = ["exact_layer_split", "make_solver", "RESOLUTION_S"]

RESOLUTION_S = 1e-9  # times are scaled to integer nanoseconds


def make_solver(time_limit_s: float, *, workers: int = 1, work_limit: float | None = None) -> cp_model.CpSolver:
    """A CP-SAT solver with the project's settings: a time limit, optionally a deterministic work
    limit, a fixed seed, and presolve's inclusion detection off: OR-Tools 9.15 certifies wrong optima
    with it on (google/or-tools#5293, "CP-SAT certifies a wrong optimality proof on an all-linear
    model"; seen here on DTFM's allocation model, where it claimed 1.019 s optimal against an
    enumerated 0.414 s)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    if work_limit is not None:
        solver.parameters.max_deterministic_time = work_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    solver.parameters.presolve_inclusion_work_limit = 0
    return solver


def exact_layer_split(costs: LayerCosts, speed: np.ndarray, capacity_bytes: np.ndarray, peak: dict, *,
                      time_limit_s: float = 10.0):
    """Optimal (counts, max stage seconds), or None if no split fits. ``peak``: each worker's
    in-flight micro-batches and held messages at its peak, (R, S) each (``stage_model.peak_table``)."""
    R, S = speed.shape
    L = costs.layers
    model = cp_model.CpModel()
    counts = [model.NewIntVar(1, L, f"layers[{s}]") for s in range(S)]
    model.Add(sum(counts) == L)
    worst = model.NewIntVar(0, 10**15, "slowest_stage_ns")
    for s in range(S):
        head = costs.head_flops if s == S - 1 else 0.0
        for r in range(R):
            per_layer_ns = int(round(costs.layer_flops / speed[r, s] / RESOLUTION_S))
            head_ns = int(round(head / speed[r, s] / RESOLUTION_S))
            model.Add(worst >= per_layer_ns * counts[s] + head_ns)
            at = {k: v[r, s] for k, v in peak.items()}
            base = stage_memory_bytes(costs, 0, s, **at)
            per_layer = stage_memory_bytes(costs, 1, s, **at) - base
            most = int(np.floor((capacity_bytes[r, s] - base) / per_layer + 1e-9))
            if most < 1:
                return None
            model.Add(counts[s] <= min(most, L))
    model.Minimize(worst)
    solver = make_solver(time_limit_s)
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return None
    if status != cp_model.OPTIMAL:
        raise RuntimeError(f"CP-SAT stopped without proof of optimality ({solver.StatusName(status)})")
    result = [int(solver.Value(c)) for c in counts]
    work = np.array(result, float) * costs.layer_flops
    work[-1] += costs.head_flops
    return result, float((work / speed).max())
