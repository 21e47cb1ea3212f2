"""A pool of distinct plans scored in time and dollars: the time / $ front, the K best, and the
plan a dollar objective picks (``planner.search.objective``).

Distinct means different degrees or a different device set. The pool is built from every degree
pair a plan may have (up to a deterministic evaluation budget, the clock as a cap), with two device
selections per pair: the fastest devices (the placement search's choice) and the most FLOP/s per
dollar (a cheaper plan often leaves the priciest devices idle). Each selection is laid out by the
constructive layouts and split by the estimate; per distinct plan the best estimate is kept; the
plans on the estimate's time / $ front and the best few by either measure are refined and
simulated. The placement search's own plan joins the pool, so the pool's fastest plan is never
slower than the time objective's.
"""

import time
from dataclasses import dataclass

import numpy as np

from planner.prediction.predict import predict
from planner.search.construct import layouts
from planner.search.dollars import Dollars, egress_bytes, plan_dollars, price_per_hour_usd, usd_per_iteration
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.plans import candidate_to_plan
from planner.search.refine import refine_split
from planner.search.zero_bubble import placement_schedules

__all__ = ["PoolEntry", "plan_pool", "pareto_front", "top_plans", "POOL_EVALUATIONS", "POOL_SIMULATIONS"]

POOL_EVALUATIONS = 3000  # estimates spent building the pool (the deterministic stopping rule)
POOL_SHARE = 0.25  # of the search's time limit, at most, for building the pool (the clock's cap)
POOL_SIMULATIONS = 24  # distinct plans refined and simulated
LEADERS = 4  # simulations kept, at least, for the best by the estimate's time and by its dollars
REFINE_PER_PLAN = 200  # estimates per refined split
LAYOUTS = ("pipelines-local", "stages-local", "speed-tiered", "memory-first")
DENSE_REPLICAS = 16  # every replica count up to this; above, a geometric grid
_GRID_RATIO = 1.5


@dataclass(frozen=True, kw_only=True, eq=False)
class PoolEntry:
    """A simulated plan that fits, the training it runs and its price."""

    plan: object
    training: object
    dollars: Dollars

    @property
    def iteration_s(self) -> float:
        return self.plan.prediction.iteration_s

    def key(self) -> tuple:
        """Distinct plans differ in degrees or in the device set."""
        return plan_key(self.plan)


def plan_key(plan) -> tuple:
    return plan.stages, plan.replicas, frozenset(plan.used_devices)


def _replica_counts(most: int) -> list:
    counts, d = set(range(1, min(most, DENSE_REPLICAS) + 1)), float(DENSE_REPLICAS)
    while d < most:
        d *= _GRID_RATIO
        counts.add(min(int(round(d)), most))
    return sorted(counts)


def _pairs(n: int, layers: int, global_batch: int, options) -> list:
    """(stages, replicas) the pool tries, fewest devices first, then fewest stages."""
    pairs = []
    for s in range(1, min(layers, n) + 1):
        if options.stages and s != options.stages:
            continue
        for d in [options.replicas] if options.replicas else _replica_counts(min(n // s, global_batch)):
            if s * d <= n and d <= global_batch:
                pairs.append((s, d))
    return sorted(pairs, key=lambda p: (p[0] * p[1], p[0]))


def _value(speed: np.ndarray, prices: np.ndarray) -> np.ndarray:
    """FLOP/s per dollar-hour, free devices first (by speed), for ``layouts``' fastest-first pick."""
    free = prices <= 0
    value = np.where(free, 0.0, speed / np.where(free, 1.0, prices))
    return np.where(free, value.max(initial=0.0) * 2.0 + speed, value)


def _front_indices(times, costs) -> list:
    """Indices of the points no other point beats in both (ties: the first), by ascending time."""
    order = sorted(range(len(times)), key=lambda i: (times[i], costs[i]))
    front, best = [], np.inf
    for i in order:
        if costs[i] < best:
            front.append(i)
            best = costs[i]
    return front


def _spread(indices: list, count: int) -> list:
    """``count`` of ``indices`` evenly spaced, both ends kept."""
    if len(indices) <= count:
        return list(indices)
    picks = np.unique(np.round(np.linspace(0, len(indices) - 1, count)).astype(int))
    return [indices[i] for i in picks]


def plan_pool(topology, model, training, options, seeds=(), *, charge_idle: bool = False,
              evaluations: int = POOL_EVALUATIONS, simulations: int = POOL_SIMULATIONS) -> list:
    """Distinct simulated plans that fit, as ``PoolEntry`` (``seeds``: plans with predictions to add,
    such as the placement search's). ``training.recompute`` must be resolved (True or False)."""
    started = time.perf_counter()
    deadline = started + options.time_limit_s * POOL_SHARE / 2  # building; simulating gets the other half
    ctx = make_context(topology, model, training)
    prices = np.array([price_per_hour_usd(topology, [name]) for name in topology.names])
    sizes = ([training.micro_batch_size] if training.micro_batch_size else
             [b for b in options.micro_batch_sizes if training.global_batch % b == 0] or [1])
    schedules = placement_schedules(training)
    selections = [ctx.speed, _value(ctx.speed, prices)]
    best = {}  # key -> candidate with the best estimate
    spent = 0
    for stages, replicas in _pairs(topology.size, model.layers, training.global_batch, options):
        if spent >= evaluations or time.perf_counter() > deadline:
            break
        seen = set()
        for selection in selections:
            for name, assign in layouts(topology, selection, ctx.capacity, stages, replicas, levels=[]).items():
                if name not in LAYOUTS or assign.tobytes() in seen:
                    continue
                seen.add(assign.tobytes())
                for size in sizes:
                    for schedule in schedules:
                        spent += 1
                        candidate = evaluate_placement(ctx, assign, size, schedule)
                        if candidate is None:
                            continue
                        key = (stages, replicas, frozenset(assign.ravel().tolist()))
                        if key not in best or candidate.score_s < best[key].score_s:
                            best[key] = candidate
    candidates = list(best.values())
    estimated = []
    for candidate in candidates:
        plan = candidate_to_plan(ctx, candidate)
        per_hour = float(prices.sum()) if charge_idle else float(prices[candidate.assign.ravel()].sum())
        estimated.append(usd_per_iteration(candidate.score_s, per_hour, egress_bytes(plan, topology, model, training),
                                           topology.egress_usd_per_gb))
    times = [c.score_s for c in candidates]
    chosen = _spread(_front_indices(times, estimated), max(simulations - 2 * LEADERS, 2))
    by_time, by_dollars = (np.argsort(ranking, kind="stable").tolist() for ranking in (times, estimated))
    for i in (i for pair in zip(by_time, by_dollars) for i in pair):  # then the best by either, in turn
        if len(chosen) >= simulations:
            break
        if i not in chosen:
            chosen.append(i)
    entries = {}
    for plan in seeds:
        entries[plan_key(plan)] = PoolEntry(plan=plan, training=training,
                                            dollars=plan_dollars(plan, topology, model, training,
                                                                 charge_idle=charge_idle))
    for i in chosen[:simulations]:
        if entries and time.perf_counter() > deadline + options.time_limit_s * POOL_SHARE / 2:
            break
        refined, _ = refine_split(ctx, candidates[i], budget=REFINE_PER_PLAN)
        plan = candidate_to_plan(ctx, refined)
        prediction, _ = predict(plan, topology, model, training)
        if not prediction.fits or not np.isfinite(prediction.iteration_s):
            continue
        plan = plan.with_prediction(prediction)
        entry = PoolEntry(plan=plan, training=training,
                          dollars=plan_dollars(plan, topology, model, training, charge_idle=charge_idle))
        old = entries.get(entry.key())
        if old is None or entry.iteration_s < old.iteration_s:
            entries[entry.key()] = entry
    return list(entries.values())


def pareto_front(entries: list) -> list:
    """The entries no other entry beats in both iteration time and dollars per iteration, fastest first."""
    times = [e.iteration_s for e in entries]
    costs = [e.dollars.usd_per_iteration for e in entries]
    return [entries[i] for i in _front_indices(times, costs)]


def top_plans(entries: list, k: int, objective) -> list:
    """The ``k`` best distinct entries by ``objective.sort_key``."""
    return sorted(entries, key=objective.sort_key)[:k]
