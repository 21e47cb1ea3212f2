"""What the search minimises: an objective is a score of a plan and a lower bound on that score.

``IterationTime`` is the product's objective (the simulator's iteration time of a plan that fits);
``DtfmCost`` is DTFM's own (``COST_DP + 2 COST_PP`` of the plan's stage groups, dtfm.md), kept to
compare with DTFM on its terms. ``DollarCost`` is the price of an iteration in US dollars
(``planner.search.dollars``) and ``TimeUnderBudget`` the iteration time among the plans whose
iteration costs at most a budget. All go through the one front door, ``planner.search.front.search``,
which asks the objective's ``engine`` for a plan and reports the objective's score, bound and gap.
The ``"pool"`` engine scores a pool of distinct plans (``planner.search.pareto``) and keeps the one
the objective's ``choose`` picks.
"""

import math

from typing import Protocol

import numpy as np

from cost_models import comm
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, network_dtfm_cost
from planner.errors import InputError
from planner.prediction.predict import predict
from planner.search.bounds import lower_bound_s, work_flops
from planner.search.dollars import SECONDS_PER_HOUR, plan_dollars, price_per_hour_usd
from planner.search.dtfm_search import dtfm_degrees

__all__ = ["Objective", "IterationTime", "DtfmCost", "DollarCost", "TimeUnderBudget", "PooledTime", "OBJECTIVES",
           "make_objective"]


class Objective(Protocol):
    """``score`` of a plan and a ``lower_bound`` on the score of every plan (seconds, lower is better).

    ``engine`` names the search that proposes plans for it: ``"placement"`` (placement, layer and
    batch split by the estimate, then the simulator) or ``"allocation"`` (DTFM's allocation of
    devices to stage groups) or ``"pool"`` (the placement engine's plan among a pool of distinct
    plans, of which ``choose`` keeps one). ``unit`` names what the score counts.
    """

    name: str
    engine: str
    unit: str

    def score(self, plan, topology, model, training) -> float: ...

    def lower_bound(self, topology, model, training) -> float: ...


class IterationTime:
    """The simulator's iteration time (``planner.prediction.predict``)."""

    name = "time"
    engine = "placement"
    unit = "s"

    def score(self, plan, topology, model, training) -> float:
        prediction = plan.prediction or predict(plan, topology, model, training)[0]
        return float(prediction.iteration_s)

    def lower_bound(self, topology, model, training) -> float:
        return lower_bound_s(topology, model, training)


class DtfmCost:
    """DTFM's objective of the plan's stage groups, on the network model's links (dtfm.md, sec. 3)."""

    name = "dtfm"
    engine = "allocation"
    unit = "s"

    def score(self, plan, topology, model, training) -> float:
        groups = [[topology.index(d) for d in plan.stage_devices(s)] for s in range(plan.stages)]
        return float(network_dtfm_cost(topology.network, groups).total_s)

    def lower_bound(self, topology, model, training) -> float:
        """The bound over DTFM's degrees (every device used; stages dividing the layers) of: COST_DP
        at least the cheapest member's exchange with its ``D - 1`` cheapest partners, and the path
        over ``S`` groups at least ``S - 1`` of the cheapest pipeline edges."""
        n = topology.size
        network = topology.network
        edge = network.transfer_matrix_s(DTFM_C_PP_BYTES)
        np.fill_diagonal(edge, np.inf)
        best = np.inf
        for stages, replicas in dtfm_degrees(n, model.layers):
            pair = comm.sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s,
                                                replicas)
            np.fill_diagonal(pair, np.inf)
            dp = float(np.sort(pair, axis=1)[:, :replicas - 1].sum(axis=1).min()) if replicas > 1 else 0.0
            best = min(best, dp + 2.0 * (stages - 1) * float(edge.min()))
        return best if np.isfinite(best) else 0.0


class PooledTime(IterationTime):
    """The iteration time, chosen from the pool of distinct plans (which holds the placement
    engine's plan), so that the pool comes back with the result for ``--pareto`` and ``--top``."""

    engine = "pool"

    def __init__(self, *, charge_idle: bool = False):
        self.charge_idle = charge_idle

    def sort_key(self, entry) -> tuple:
        return (entry.iteration_s, entry.dollars.usd_per_iteration)

    def choose(self, entries: list):
        return min(entries, key=self.sort_key)


class DollarCost:
    """US dollars per iteration: ``iteration_s x`` the used devices' hourly prices ``/ 3600`` plus
    the egress of the bytes that cross regions (``planner.search.dollars``). Idle devices cost
    nothing unless ``charge_idle``."""

    name = "cost"
    engine = "pool"
    unit = "USD"

    def __init__(self, *, charge_idle: bool = False):
        self.charge_idle = charge_idle

    def score(self, plan, topology, model, training) -> float:
        if plan.prediction is None:
            plan = plan.with_prediction(predict(plan, topology, model, training)[0])
        return plan_dollars(plan, topology, model, training, charge_idle=self.charge_idle).usd_per_iteration

    def lower_bound(self, topology, model, training) -> float:
        """Every plan's device-seconds price at least the iteration's FLOPs at the best price per
        FLOP: device d computing ``w_d`` FLOPs is busy ``w_d / speed_d`` seconds at ``price_d / 3600``
        dollars a second and ``sum w_d >= W``, so the price is at least ``W x min_d price_d / speed_d
        / 3600`` (egress >= 0). With ``charge_idle`` every device is paid for the whole iteration:
        at least the time bound times the cluster's price."""
        prices = np.array([price_per_hour_usd(topology, [name]) for name in topology.names])
        if self.charge_idle:
            return lower_bound_s(topology, model, training) * float(prices.sum()) / SECONDS_PER_HOUR
        speed = topology.effective_flops(training.precision)
        return work_flops(topology, model, training) * float((prices / speed).min()) / SECONDS_PER_HOUR

    def sort_key(self, entry) -> tuple:
        return (entry.dollars.usd_per_iteration, entry.iteration_s)

    def choose(self, entries: list):
        return min(entries, key=self.sort_key)


class TimeUnderBudget:
    """The iteration time among the plans whose iteration costs at most ``budget_usd_per_iteration``
    (US dollars, as ``DollarCost`` counts them)."""

    name = "time-under-budget"
    engine = "pool"
    unit = "s"

    def __init__(self, budget_usd_per_iteration: float, *, charge_idle: bool = False):
        self.budget_usd_per_iteration = budget_usd_per_iteration
        self.charge_idle = charge_idle

    def score(self, plan, topology, model, training) -> float:
        prediction = plan.prediction or predict(plan, topology, model, training)[0]
        return float(prediction.iteration_s)

    def lower_bound(self, topology, model, training) -> float:
        return lower_bound_s(topology, model, training)

    def sort_key(self, entry) -> tuple:
        over = entry.dollars.usd_per_iteration > self.budget_usd_per_iteration
        return (over, entry.dollars.usd_per_iteration if over else entry.iteration_s)

    def choose(self, entries: list):
        best = min(entries, key=self.sort_key)
        if best.dollars.usd_per_iteration > self.budget_usd_per_iteration:
            raise InputError(f"no plan found costs at most ${self.budget_usd_per_iteration:.6g} per iteration: the "
                             f"cheapest of {len(entries)} distinct plans costs ${best.dollars.usd_per_iteration:.6g} "
                             f"({best.plan.stages} x {best.plan.replicas}, {best.iteration_s:.3f} s): raise the budget",
                             field="--budget-usd-per-iteration")
        return best


OBJECTIVES = {objective.name: objective for objective in (IterationTime(), DtfmCost())}
OBJECTIVE_NAMES = ("time", "cost", "time-under-budget", "dtfm")


def make_objective(name: str, *, budget_usd_per_iteration: float | None = None, charge_idle: bool = False,
                   pooled: bool = False):
    """The objective called ``name``; ``pooled``: keep the pool of distinct plans (time objective)."""
    if name == "time-under-budget":
        if budget_usd_per_iteration is None:
            raise InputError("is missing: --objective time-under-budget needs the most one iteration may cost: pass "
                             "--budget-usd-per-iteration X (US dollars per iteration)", field="--budget-usd-per-iteration")
        if not math.isfinite(budget_usd_per_iteration) or budget_usd_per_iteration <= 0:
            raise InputError(f"needs a budget above 0, got {budget_usd_per_iteration}: pass "
                             "--budget-usd-per-iteration X (US dollars per iteration)", field="--budget-usd-per-iteration")
        return TimeUnderBudget(budget_usd_per_iteration, charge_idle=charge_idle)
    if budget_usd_per_iteration is not None:
        raise InputError("applies to --objective time-under-budget only: add it or drop the budget",
                         field="--budget-usd-per-iteration")
    if name == "cost":
        return DollarCost(charge_idle=charge_idle)
    if name == "time" and (pooled or charge_idle):
        return PooledTime(charge_idle=charge_idle)
    if name not in OBJECTIVES:
        raise InputError(f"{name!r} is not one of {', '.join(OBJECTIVE_NAMES)}", field="--objective")
    return OBJECTIVES[name]
