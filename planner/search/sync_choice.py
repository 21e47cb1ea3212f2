"""The plan's gradient sync algorithm: a plan with a given one (and its parameter servers), and
``training.sync: auto`` resolved per plan: first by the search's estimate (``estimated_sync``), then
by the simulator where the search's budget allows (``planner.search.front``'s finalists), or after
the search for plans of other engines (``choose_sync``).

A stage's parameter server is a replica whose device serves the stage fastest
(``Network.fastest_servers``: the best links to the others, the least shared NIC), of equal ones one on
a host that serves no earlier stage (``Network.spread_servers``).
"""

from dataclasses import replace

import numpy as np

from cost_models.network import Sync
from planner.plan.sync import AUTO, syncs_for
from planner.plan.tensor import groups_of_plan
from planner.prediction.predict import predict
from planner.prediction.stage_model import optimizer_shards
from planner.search.evaluate import score_split
from planner.search.locality import sorted_ring

__all__ = ["plan_with_sync", "choose_sync", "estimated_sync", "sync_training"]


def plan_with_sync(plan, topology, sync: Sync):
    """``plan`` syncing by ``sync`` (its prediction dropped); with a parameter server, each stage's
    server is a fastest-serving replica (``Network.spread_servers``)."""
    sync = Sync(sync)
    if sync not in (Sync.HIERARCHICAL, Sync.PARAMETER_SERVER):
        return replace(plan, sync=sync, sync_servers=(), prediction=None)
    virtual = groups_of_plan(topology, plan).virtual
    orders = _sorted_rings(plan, virtual)
    if sync == Sync.HIERARCHICAL:
        return replace(plan, sync=sync, sync_servers=(), ring_orders=orders, prediction=None)
    # of equal servers, in the order the estimate takes them, one on a host serving no earlier stage
    # where there is one (``evaluate.stage_servers``)
    rings = [[virtual.index(plan.assignment[r][s]) for r in order] for s, order in enumerate(orders)]
    chosen = virtual.network.spread_servers([virtual.network.fastest_servers(ring) for ring in rings])
    servers = [order[ring.index(server)] for order, ring, server in zip(orders, rings, chosen)]
    return replace(plan, sync=sync, sync_servers=tuple(servers), prediction=None)


def _sorted_rings(plan, virtual) -> tuple:
    """Each stage's replicas in ``locality.sorted_ring``'s order of their devices: the order the
    search's estimate times a hierarchical sync by (and takes equal parameter servers in). A
    hierarchical sync groups the ring's members by host and runs a ring among the hosts' leads in
    that order, so the ring the plan keeps for a ring all-reduce can time it otherwise than the
    estimate did: across 8 regions of one replica each, 39.70 s estimated, 14.60 s simulated before
    (``tests/test_hierarchical_order.py``). ``virtual``: the topology as the plan groups it."""
    orders = []
    for s in range(plan.stages):
        replica_of = {virtual.index(plan.assignment[r][s]): r for r in range(plan.replicas)}
        orders.append(tuple(replica_of[d] for d in sorted_ring(virtual, list(replica_of))))
    return tuple(orders)


def sync_training(training, sync: Sync, replicas: int):
    """``training`` with ``sync`` named and ``shard_optimizer`` as this sync allows it."""
    chosen = replace(training, sync=str(sync))
    if training.shard_optimizer == "auto" and optimizer_shards(chosen, replicas) == 1:
        chosen = replace(chosen, shard_optimizer=False)
    return chosen


def choose_sync(plan, topology, model, training) -> tuple:
    """(plan, training, tried): ``plan`` with the sync ``training`` asks for, or with ``auto`` the
    one of ``syncs_for`` whose simulated iteration is shortest among those that fit (ties: the
    first of ``Sync``'s order, ring first); ``tried`` maps each algorithm to its iteration seconds
    (empty unless auto). The returned ``training`` names the chosen sync."""
    if training.sync != AUTO:
        sync = Sync(training.sync)
        if plan.sync != sync or (sync == Sync.PARAMETER_SERVER and not plan.sync_servers):
            plan = plan_with_sync(plan, topology, sync)
            plan = plan.with_prediction(predict(plan, topology, model, training)[0])
        return plan, training, {}
    best, tried = None, {}
    for sync in syncs_for(training, plan.replicas):
        chosen = sync_training(training, sync, plan.replicas)
        candidate = plan_with_sync(plan, topology, sync)
        candidate = candidate.with_prediction(predict(candidate, topology, model, chosen)[0])
        tried[str(sync)] = candidate.prediction.iteration_s
        if candidate.prediction.fits and (best is None or candidate.prediction.iteration_s
                                          < best[0].prediction.iteration_s):
            best = (candidate, chosen)
    if best is None:  # nothing fits: the ring, as the search planned it
        return plan, sync_training(training, Sync.RING, plan.replicas), tried
    return best[0], best[1], tried


def estimated_sync(ctx, candidate) -> Sync:
    """The algorithm of ``syncs_for`` whose estimate (``evaluate.score_split``, with the optimizer
    sharded as that algorithm allows) of ``candidate`` is shortest among those that fit (ties: the
    first of ``Sync``'s order, ring first); the ring for one replica or where none fits."""
    R = candidate.assign.shape[0]
    algorithms = syncs_for(ctx.training, R) if R > 1 else (Sync.RING,)
    best, best_s = Sync.RING, np.inf
    for sync in algorithms:
        one = replace(ctx, training=sync_training(ctx.training, sync, R), costs={})  # costs follow the sharding
        score = score_split(one, candidate.assign, candidate.layer_counts, candidate.micro_batches,
                            candidate.micro_batch_size, candidate.schedule)
        if score is not None and score < best_s:
            best, best_s = sync, score
    return best
