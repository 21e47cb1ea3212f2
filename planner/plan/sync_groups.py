"""Sync groups of local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105, Algorithm 1).

With ``sync_every`` H > 1 the plan's replicas are partitioned into sync groups. Inside a group the
gradients are all-reduced every iteration (a ring over the group's replicas of each stage), so the
group trains as one DiLoCo worker on its replicas' combined batch; across groups the parameter
deltas are averaged once every H iterations and an outer Nesterov step applies them. Every member
of a group holds the same weights and the same delta, so the outer sync runs between one lead per
group (the group's first replica, its delta weighted by the group's share of the batch's tokens,
``outer_weights``), and each lead then broadcasts the result to its group (with one group, every
member already holds the mean: no sync at all). Groups of one replica each
(the plan file's default) are plain local steps: no sync between outer steps.

Costs per stage on the plan's network model (``Network.sync_s`` and ``sync_holds`` of a ring):
every iteration the groups' rings run side by side (the slowest sets the time); every H iterations
the leads' ring, then each group's broadcast, charged as a ring all-reduce of the group (a long-
message broadcast is a scatter then an all-gather, van de Geijn: the two halves of the ring's
bytes, ``2 (g - 1) / g`` of the message per hop).
"""

from cost_models.network import Sync

__all__ = ["SYNC_GROUPINGS", "AUTO", "REPLICA", "CLUSTER", "ONE", "cluster_groups", "grouping", "kept_groups",
           "sync_groups_problem", "leads", "outer_weights", "group_rings", "grouped_sync", "grouped_sync_bytes"]

AUTO, REPLICA, CLUSTER, ONE = "auto", "replica", "cluster", "one"
SYNC_GROUPINGS = (AUTO, REPLICA, CLUSTER, ONE)  # training.sync_groups / --sync-groups


def cluster_groups(region_ids, assignment_indices) -> tuple:
    """Replicas whose devices sit, stage by stage, in the same regions: one group per distinct
    tuple of regions (``region_ids[device]``; ``assignment_indices[r][s]`` a device index), in order
    of their first replica. Each stage's ring inside a group then stays inside one region."""
    keys = {}
    for r, row in enumerate(assignment_indices):
        keys.setdefault(tuple(int(region_ids[d]) for d in row), []).append(r)
    return tuple(tuple(g) for g in keys.values())


def grouping(kind: str, replicas: int, region_ids=None, assignment_indices=None) -> tuple:
    """The groups of ``kind`` (``replica``, ``cluster``, ``one``) for a plan of ``replicas`` replicas,
    as the plan file writes them: () when every replica is alone."""
    if kind == ONE:
        groups = (tuple(range(replicas)),)
    elif kind == CLUSTER:
        groups = cluster_groups(region_ids, assignment_indices)
    else:
        groups = ()
    return () if all(len(g) == 1 for g in groups) else groups


def kept_groups(sync_groups: tuple, keep: list) -> tuple:
    """``sync_groups`` of a plan that keeps only the replicas ``keep`` (in that order, renumbered
    from 0): each group's kept members; () when every kept replica is alone."""
    index = {r: k for k, r in enumerate(keep)}
    groups = tuple(g for g in (tuple(index[r] for r in group if r in index) for group in sync_groups) if g)
    return () if all(len(g) == 1 for g in groups) else groups


def sync_groups_problem(sync_groups: tuple, replicas: int, sync_every: int, sync, shard_optimizer) -> str | None:
    """One line of what is wrong with ``sync_groups`` for the plan; None if nothing."""
    if not sync_groups:
        return None
    flat = [r for g in sync_groups for r in g]
    if any(not isinstance(r, int) or isinstance(r, bool) for r in flat) or sorted(flat) != list(range(replicas)) \
            or any(not g for g in sync_groups):
        return (f"is {[list(g) for g in sync_groups]}, not a partition of the replicas 0 to {replicas - 1}: list each "
                "replica index in exactly one group, or drop sync_groups")
    if sync_every <= 1:
        return ("groups replicas, but sync_every is 1 (every replica syncs every iteration): drop sync_groups or set "
                "sync_every above 1")
    if Sync(sync) != Sync.RING:
        return f"groups replicas, whose syncs run as ring all-reduces, but sync is {sync}: set sync ring"
    if shard_optimizer is True:
        return "groups replicas with local steps, which keep whole optimizer states: set shard_optimizer auto or false"
    return None


def leads(groups: tuple) -> list:
    """Each group's first replica: the one that joins the outer sync."""
    return [g[0] for g in groups]


def outer_weights(groups: tuple, micro_batches) -> tuple:
    """Each group's weight in the outer step's average of deltas: its replicas' micro-batches over
    all of them (every micro-batch holds the same tokens), so a group's delta counts by the tokens
    it trained on, as FedAvg weights each client's update by its samples ``n_k / n`` (McMahan et al.
    2017, arXiv 1602.05629, Algorithm 1). ``groups``: () for every replica alone (a weight per
    replica). With one inner SGD step (H = 1, outer rate 1, no momentum) the weighted delta is the
    whole batch's gradient step: synchronous training."""
    groups = groups or tuple((r,) for r in range(len(micro_batches)))
    total = float(sum(micro_batches))
    return tuple(sum(micro_batches[r] for r in g) / total for g in groups)


def group_rings(order: list, groups: tuple) -> list:
    """Each group's replicas in the stage's ring ``order`` (replica indices): its inner ring."""
    rank = {r: k for k, r in enumerate(order)}
    return [sorted(g, key=rank.__getitem__) for g in groups]


def grouped_sync(network, devices: list, order: list, groups: tuple, message_bytes: float, sync_every: int) -> tuple:
    """(seconds per iteration, [(resource, seconds held)]) of one stage's grouped local-step syncs.

    ``devices[r]``: replica r's device index at this stage; ``order``: the stage's ring (replica
    indices); ``message_bytes``: the whole delta (and gradient) message. Per iteration: the slowest
    group's ring all-reduce, plus a ``1 / sync_every`` share of the leads' ring and the slowest
    group's broadcast (each as ``Network.sync_s`` of a ring). The resources: each ring's links and
    NICs (``Network.sync_holds``), held in that proportion, summed where several rings share one."""
    H = sync_every
    rings = [[devices[r] for r in ring] for ring in group_rings(order, groups)]
    lead_ring = [devices[r] for r in order if r in set(leads(groups))]
    inner = [network.sync_s(Sync.RING, message_bytes, ring) for ring in rings]
    outer = network.sync_s(Sync.RING, message_bytes, lead_ring)
    broadcast = _broadcast_share(groups, H)
    seconds = max(inner) * (1.0 + broadcast) + outer / H
    holds = {}
    parts = [(ring, t, 1.0 + broadcast) for ring, t in zip(rings, inner)] + [(lead_ring, outer, 1.0 / H)]
    for ring, t, share in parts:
        if len(ring) > 1:
            for key, busy in network.sync_holds(Sync.RING, ring, message_bytes, t):
                holds[key] = holds.get(key, 0.0) + busy * share
    return seconds, list(holds.items())


def _broadcast_share(groups: tuple, sync_every: int) -> float:
    """Iterations' share in which each group's lead broadcasts the outer step's result to its group:
    once every H, none with one group (every member already holds the mean)."""
    return 1.0 / sync_every if len(groups) > 1 else 0.0


def grouped_sync_bytes(groups: tuple, message_bytes: float, sync_every: int) -> tuple:
    """(bytes within groups, bytes across groups) every worker sends per iteration for one stage's
    message: ``2 (g - 1) n`` for each group's ring every iteration and again for its broadcast every
    H, and ``2 (G - 1) n`` for the leads' ring every H (Patarasuk & Yuan 2009, as
    ``Network.sync_flows``)."""
    n, H = float(message_bytes), sync_every
    broadcast = _broadcast_share(groups, H)
    within = sum(2.0 * (len(g) - 1) * n for g in groups) * (1.0 + broadcast)
    across = 2.0 * (len(groups) - 1) * n / H
    return within, across

