"""Local steps' sync groups (``planner.plan.sync_groups``) chosen for a searched plan: the grouping
``training.sync_groups`` names, or with ``auto`` the one of every replica alone, replicas by
cluster (region) and all replicas in one group whose simulated iteration is shortest (ties: that
order). With ``cluster`` or ``one`` the search places devices for those groups (its estimate charges
them, ``planner.search.evaluate.asked_groups``, and its finalists are simulated with them,
``with_asked_groups``); with ``auto`` it places devices with every replica alone (the fastest
grouping on a given placement but for the smaller ring of group leads) and the grouping is then
chosen on the found placement by the simulator, whose prediction of it the plan keeps: at most two
more simulations of the found plan (work the plan sets, so the same seed and budget give the same
grouping), in ``GROUP_CHOICE_SHARE`` of the time limit the search keeps for them; a grouping whose
simulation the clock would not fit before the limit (``work_s``, and its size,
``deadline.plan_simulation_s``, against ``deadline``; a simulation that runs past it is cut) is
left untried, so the limit holds."""

import math
import time
from dataclasses import dataclass, field, replace

from cost_models.network import Sync
from planner.plan.sync_groups import AUTO, CLUSTER, ONE, REPLICA, grouping
from cost_models.simulator import SimulationCut
from planner.prediction.predict import predict
from planner.search.evaluate import charges_groups
from planner.search.deadline import plan_simulation_s

__all__ = ["GroupChoice", "GROUP_CHOICE_SHARE", "choose_sync_groups", "chooses_groups", "plan_with_groups",
           "with_asked_groups"]

_CANDIDATES = (REPLICA, CLUSTER, ONE)
GROUP_CHOICE_SHARE = 0.05  # of the search's time limit (and work budget), kept for auto's simulations


def chooses_groups(training) -> bool:
    """Whether the search ends by choosing sync groups (``auto`` with local steps)."""
    return training.sync_groups == AUTO and training.sync_every > 1


def plan_with_groups(plan, topology, kind: str):
    """``plan`` with the sync groups of ``kind`` (its prediction dropped when they change)."""
    indices = [[topology.index(d) for d in row] for row in plan.assignment]
    groups = grouping(kind, plan.replicas, topology.region_ids, indices)
    return plan if groups == plan.sync_groups else replace(plan, sync_groups=groups, prediction=None)


def with_asked_groups(plan, topology, training):
    """``plan`` with the sync groups ``training.sync_groups`` names when that is ``cluster`` or
    ``one`` and the plan has local steps over two or more replicas by ring; else ``plan``."""
    if not charges_groups(training, plan.replicas) or plan.sync != Sync.RING:
        return plan
    return plan_with_groups(plan, topology, training.sync_groups)


@dataclass(frozen=True, kw_only=True)
class GroupChoice:
    plan: object  # the plan with its sync groups
    tried: dict = field(default_factory=dict)  # grouping -> simulated iteration seconds (auto only)
    untried: tuple = ()  # groupings the work budget or the clock left unsimulated (the plan's own stands)
    clock_cut: bool = False  # the clock, not the work budget, left some untried


def choose_sync_groups(plan, topology, model, training, *, work_s: float = math.inf,
                       deadline: float = math.inf) -> GroupChoice:
    """``plan`` with its sync groups: as ``training.sync_groups`` asks, or with ``auto`` the
    grouping that simulates fastest of those ``work_s`` (seconds of work at the simulator's rate)
    and the clock (``time.perf_counter``) before ``deadline`` allow after the plan's own; ``tried``
    is empty unless auto and the plan has local steps over two or more replicas by ring."""
    if training.sync_every <= 1 or plan.replicas <= 1 or plan.sync != Sync.RING:
        return GroupChoice(plan=replace(plan, sync_groups=(), prediction=None) if plan.sync_groups else plan)
    kinds = _CANDIDATES if training.sync_groups == AUTO else (training.sync_groups,)
    best, tried, untried, seen, clock_cut = None, {}, [], set(), False
    spent_s = 0.0
    for kind in kinds:
        candidate = plan_with_groups(plan, topology, kind)
        if candidate.sync_groups in seen:
            continue
        if candidate.prediction is None:
            if best is None:  # the plan's own grouping is always simulated
                candidate = candidate.with_prediction(predict(candidate, topology, model, training)[0])
            else:  # the others within the budget, and only where the simulation's size fits the clock
                cost_s = plan_simulation_s(candidate)
                over_budget = bool(untried) or spent_s + cost_s > work_s
                cut = over_budget or time.perf_counter() + cost_s >= deadline
                if not cut:
                    spent_s += cost_s
                    try:
                        candidate = candidate.with_prediction(
                            predict(candidate, topology, model, training, deadline=deadline)[0])
                    except SimulationCut:
                        cut = True
                if cut:
                    clock_cut = clock_cut or not over_budget
                    untried.append(kind)
                    seen.add(candidate.sync_groups)
                    continue
        seen.add(candidate.sync_groups)
        tried[kind] = candidate.prediction.iteration_s
        if best is None or (candidate.prediction.fits and (not best.prediction.fits or candidate.prediction.iteration_s
                                                           < best.prediction.iteration_s)):
            best = candidate
    best = best if best.prediction.fits else plan
    auto = training.sync_groups == AUTO
    return GroupChoice(plan=best, tried=tried if auto else {}, untried=tuple(untried) if auto else (),
                       clock_cut=clock_cut and auto)
