"""Local steps' sync groups (``planner.plan.sync_groups``) chosen for a searched plan: the grouping
``training.sync_groups`` names, or with ``auto`` the one of every replica alone, replicas by
cluster (region) and all replicas in one group whose simulated iteration is shortest (ties: that
order). With ``cluster`` or ``one`` the search places devices for those groups (its estimate charges
them, ``planner.search.evaluate.asked_groups``, and its finalists are simulated with them,
``with_asked_groups``); with ``auto`` it places devices with every replica alone (the fastest
grouping on a given placement but for the smaller ring of group leads) and the grouping is then
chosen on the found placement by the simulator, whose prediction of it the plan keeps."""

from dataclasses import replace

from cost_models.network import Sync
from planner.plan.sync_groups import AUTO, CLUSTER, ONE, REPLICA, grouping
from planner.prediction.predict import predict

__all__ = ["choose_sync_groups", "plan_with_groups", "with_asked_groups"]

_CANDIDATES = (REPLICA, CLUSTER, ONE)


def plan_with_groups(plan, topology, kind: str):
    """``plan`` with the sync groups of ``kind`` (its prediction dropped when they change)."""
    indices = [[topology.index(d) for d in row] for row in plan.assignment]
    groups = grouping(kind, plan.replicas, topology.region_ids, indices)
    return plan if groups == plan.sync_groups else replace(plan, sync_groups=groups, prediction=None)


def with_asked_groups(plan, topology, training):
    """``plan`` with the sync groups ``training.sync_groups`` names when that is ``cluster`` or
    ``one`` and the plan has local steps over two or more replicas by ring; else ``plan``."""
    if (training.sync_groups not in (CLUSTER, ONE) or training.sync_every <= 1 or plan.replicas <= 1
            or plan.sync != Sync.RING):
        return plan
    return plan_with_groups(plan, topology, training.sync_groups)


def choose_sync_groups(plan, topology, model, training) -> tuple:
    """(plan, tried): ``plan`` with its sync groups; ``tried`` maps each grouping that differs from
    the others to its simulated iteration seconds (empty unless auto and the plan has local steps
    over two or more replicas by ring)."""
    if training.sync_every <= 1 or plan.replicas <= 1 or plan.sync != Sync.RING:
        return (replace(plan, sync_groups=(), prediction=None) if plan.sync_groups else plan), {}
    kinds = _CANDIDATES if training.sync_groups == AUTO else (training.sync_groups,)
    best, tried, seen = None, {}, set()
    for kind in kinds:
        candidate = plan_with_groups(plan, topology, kind)
        if candidate.sync_groups in seen:
            continue
        seen.add(candidate.sync_groups)
        if candidate.prediction is None:
            candidate = candidate.with_prediction(predict(candidate, topology, model, training)[0])
        tried[kind] = candidate.prediction.iteration_s
        if candidate.prediction.fits and (best is None or candidate.prediction.iteration_s
                                          < best.prediction.iteration_s):
            best = candidate
    return (best if best is not None else plan), (tried if training.sync_groups == AUTO else {})
