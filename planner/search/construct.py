"""Constructive placements: good starting points for a given number of stages and replicas.

Devices are picked fastest-first (idle devices are the slowest), then laid out so that either each
pipeline or each stage's data-parallel group sits in one locality (host, then region), or so that
pipelines are homogeneous in speed (fast pipelines then take more micro-batches). Locality comes
from the network itself (``planner.search.locality``).

Devices picked fastest-first ignore the network: a fast device behind a slow uplink joins, a
well-connected cluster of slightly slower ones waits. The cluster layouts pick devices by clusters
of the bandwidth graph instead (``bandwidth_clusters``): clusters in ``cluster_order`` (most compute
first, then the best connected to those taken), each filled with whole pipelines of its fastest
devices, so that pipelines sit inside clusters and the clusters taken last (slow links) stay idle
when the degrees need fewer devices; their stage-local twins put each stage's data-parallel group
inside a cluster instead. Above ``MATCHED_DEVICES`` (no matched layouts), the stage runs are also
chained along the fastest links (``planner.search.chain_order``), and where regions hold a stage's
replicas one layout puts each stage in a region of its own, regions chained so too.
"""

import numpy as np

from planner.search.chain_order import MAX_CHAIN_GROUPS, group_bandwidth, widest_chain
from planner.search.dtfm_search import groups_to_pipelines
from planner.search.locality import bandwidth_clusters, cluster_order, locality_order, symmetric_bandwidth

__all__ = ["choose_devices", "cluster_layouts", "layouts", "probe_layouts", "within_cluster", "MATCHED_STAGES",
           "MATCHED_DEVICES", "WITHIN_CLUSTERS"]

MATCHED_STAGES = 12  # the exact stage-order search behind the matched layouts is exponential in stages
MATCHED_DEVICES = 256
WITHIN_CLUSTERS = 2  # per cluster level, the clusters after the first that each get a layout holding the plan alone


def choose_devices(speed: np.ndarray, capacity: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` fastest devices (ties: more memory, then lower index)."""
    order = np.lexsort((np.arange(len(speed)), -capacity, -speed))
    return np.sort(order[:count])


def _fastest_first(devices: np.ndarray, speed: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    return devices[np.lexsort((devices, -capacity[devices], -speed[devices]))]


def cluster_layouts(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int,
                    levels: list, cache: dict | None = None) -> dict:
    """Named (replicas, stages) arrays from each level of device clusters (labels over every device,
    ``planner.search.locality.bandwidth_clusters``): whole pipelines inside clusters, clusters taken
    in ``cluster_order``; pipelines that no cluster holds whole are cut from the devices left over,
    in the same order. Empty when the degrees need more devices than there are. ``cache`` memoises
    each level's cluster order (the same for every degree pair of one search)."""
    n = topology.size
    if stages * replicas > n:
        return {}
    devices = np.arange(n)
    cache = {} if cache is None else cache
    result = {}
    for i, labels in enumerate(levels):
        key = ("cluster_order", labels.tobytes())
        if key not in cache:
            cache[key] = cluster_order(topology, devices, labels, speed)
        pipelines, leftover = [], []
        for c in cache[key]:
            members = _fastest_first(devices[labels == c], speed, capacity)
            whole = min(len(members) // stages, replicas - len(pipelines))
            pipelines += [members[p * stages:(p + 1) * stages] for p in range(whole)]
            leftover += members[whole * stages:].tolist()
        rest = np.array(leftover[:(replicas - len(pipelines)) * stages], dtype=np.int64)
        pipelines += [rest[p * stages:(p + 1) * stages] for p in range(replicas - len(pipelines))]
        rows = np.array([locality_order(topology, row) for row in pipelines])
        result[f"clusters{i}-pipelines"] = rows
        in_order = np.concatenate(pipelines)  # by cluster, so consecutive runs of ``replicas`` share one
        result[f"clusters{i}-stages"] = in_order.reshape(stages, replicas).T.copy()
        # Where the matched layouts (their stages in DTFM's path order) are not built, the stage runs
        # chained along the widest links too.
        chained = _chained_stages(topology, in_order.reshape(stages, replicas)) if stages * replicas > \
            MATCHED_DEVICES else None
        if chained is not None:
            result[f"clusters{i}-stages-chained"] = chained
        # The whole plan inside one other cluster that holds it: the first in order may hold it too,
        # but a slower one can be better connected inside (a home cluster without a slow uplink).
        alone = [c for c in cache[key][1:] if np.count_nonzero(labels == c) >= stages * replicas]
        for c in alone[:WITHIN_CLUSTERS]:
            result[f"clusters{i}-within{c}-pipelines"] = within_cluster(topology, speed, capacity, stages, replicas,
                                                                       devices[labels == c])
    return result


def within_cluster(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int,
                   members: np.ndarray) -> np.ndarray:
    """(replicas, stages): whole pipelines of the ``stages x replicas`` fastest of ``members`` (a
    cluster's devices, at least that many), each in locality order."""
    chosen = _fastest_first(np.asarray(members), speed, capacity)[:stages * replicas]
    return np.array([locality_order(topology, row) for row in chosen.reshape(replicas, stages)])


def _chained_stages(topology, groups: np.ndarray) -> np.ndarray | None:
    """The (replicas, stages) layout of the stage ``groups`` (rows: each stage's devices) ordered along
    the widest chain of links (``planner.search.chain_order``); None where that is their order already
    or there are too many stages to order exactly. The cluster order takes clusters as a spanning tree
    adds them, not as a pipeline passes through them: over slow regions its chain can cross the
    slowest link, which every micro-batch then waits for."""
    stages = len(groups)
    if not 2 < stages <= MAX_CHAIN_GROUPS:
        return None
    members = groups.ravel()
    bandwidth = symmetric_bandwidth(topology, members)
    positions = np.arange(len(members)).reshape(groups.shape)
    order = widest_chain(group_bandwidth(bandwidth, positions))
    if order == list(range(stages)):
        return None
    return groups[order].T.copy()


def _stage_regions(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int) -> np.ndarray | None:
    """Each stage's data-parallel group inside a region of its own: the ``stages`` regions whose
    ``replicas`` fastest devices have the most compute (ties: the lower region), each stage those
    devices, stages chained along the fastest links (``_chained_stages``), replica r the r-th fastest
    of each; None where fewer regions hold a stage. Every gradient all-reduce then stays inside a region
    and only activations cross regions; the stage runs of the cluster layouts keep this shape only
    where a region's size is a multiple of the stage count times the replicas' share."""
    if stages < 2:
        return None
    groups, compute = [], []
    for region in np.unique(topology.region_ids):
        members = np.flatnonzero(topology.region_ids == region)
        if len(members) >= replicas:
            fastest = _fastest_first(members, speed, capacity)[:replicas]
            groups.append(fastest)
            compute.append(float(speed[fastest].sum()))
    if len(groups) < stages:
        return None
    taken = np.array([groups[g] for g in sorted(range(len(groups)), key=lambda g: (-compute[g], g))[:stages]])
    chained = _chained_stages(topology, taken)
    return taken.T.copy() if chained is None else chained


def probe_layouts(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int,
                  levels: list, cache: dict | None = None) -> list:
    """The cheap layouts that judge a degree pair before it is constructed in full: each pipeline
    local on the fastest devices, and whole pipelines inside the finest clusters."""
    chosen = choose_devices(speed, capacity, stages * replicas)
    probes = [locality_order(topology, chosen).reshape(replicas, stages)]
    clustered = cluster_layouts(topology, speed, capacity, stages, replicas, levels[:1], cache)
    probes += [a for name, a in clustered.items() if name.endswith("-pipelines") and not np.array_equal(a, probes[0])]
    return probes


def stage_groups(ordered: np.ndarray, stages: int, replicas: int) -> np.ndarray:
    """(replicas, stages): devices in ``ordered`` dealt out as stage groups of ``replicas``
    consecutive ones (``layouts``' "stages-local"), so each pipeline takes one device of every group."""
    return np.asarray(ordered).reshape(stages, replicas).T.copy()


def probe_fallback(local_pipelines: np.ndarray) -> np.ndarray:
    """The layout that judges a degree pair where no ``probe_layouts`` layout fits, from its first
    (each pipeline local, ``local_pipelines``): the same devices in the same locality order dealt
    out as stage groups, so every pipeline mixes the device types where whole pipelines of the
    smallest devices cannot hold the model (two-datacenters-a100-v100-t4: four T4s of 16 GB in a
    row never fit a 4-stage pipeline)."""
    replicas, stages = local_pipelines.shape
    return stage_groups(local_pipelines.ravel(), stages, replicas)


def layouts(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int,
            levels: list | None = None, cache: dict | None = None) -> dict:
    """Named (replicas, stages) arrays of device indices for one degree pair; ``levels``: the
    topology's device clusters (``bandwidth_clusters``, computed when None); ``cache``: see
    ``cluster_layouts``."""
    chosen = choose_devices(speed, capacity, stages * replicas)
    ordered = locality_order(topology, chosen)
    result = {
        "pipelines-local": ordered.reshape(replicas, stages),
        "stages-local": stage_groups(ordered, stages, replicas),
    }
    if len(np.unique(speed[chosen])) > 1:
        tiers = chosen[np.lexsort((np.arange(len(chosen)), -speed[chosen]))]
        rows = [locality_order(topology, row) for row in tiers.reshape(replicas, stages)]
        result["speed-tiered"] = np.array(rows)
        # Within each locality pipeline, put bigger memory first (stage 0 keeps most activations).
        local = ordered.reshape(replicas, stages)
        by_memory = np.array([row[np.argsort(-capacity[row], kind="stable")] for row in local])
        result["memory-first"] = by_memory
    if 1 < stages <= MATCHED_STAGES and stages * replicas <= MATCHED_DEVICES:
        # Stage groups joined into pipelines by bottleneck matching, stages in the order DTFM's
        # objective prefers (dtfm.md): from the groups of index order (Megatron's contiguous
        # default) and from the locality groups.
        for name, order in (("contiguous-matched", chosen), ("stages-matched", ordered)):
            groups = [order[j * replicas:(j + 1) * replicas].tolist() for j in range(stages)]
            result[name] = groups_to_pipelines(topology, groups)
    regional = _stage_regions(topology, speed, capacity, stages, replicas) if stages * replicas > MATCHED_DEVICES \
        else None
    if regional is not None and not any(np.array_equal(regional, other) for other in result.values()):
        result["stage-regions"] = regional
    levels = bandwidth_clusters(topology) if levels is None else levels
    for name, assign in cluster_layouts(topology, speed, capacity, stages, replicas, levels, cache).items():
        if not any(np.array_equal(assign, other) for other in result.values()):
            result[name] = assign
    return result
