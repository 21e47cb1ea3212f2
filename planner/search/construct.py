"""Constructive placements: good starting points for a given number of stages and replicas.

Devices are picked fastest-first (idle devices are the slowest), then laid out so that either each
pipeline or each stage's data-parallel group sits in one locality (host, then region), or so that
pipelines are homogeneous in speed (fast pipelines then take more micro-batches). Locality comes
from the network itself: devices are ordered by a greedy chain through the bandwidth graph
(networkx is not needed for a chain; ``locality_order`` is a nearest-neighbour walk).
"""

import numpy as np

__all__ = ["choose_devices", "locality_order", "layouts", "MATCHED_STAGES", "MATCHED_DEVICES"]

MATCHED_STAGES = 12  # the exact stage-order search behind the matched layouts is exponential in stages
MATCHED_DEVICES = 256


def choose_devices(speed: np.ndarray, capacity: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` fastest devices (ties: more memory, then lower index)."""
    order = np.lexsort((np.arange(len(speed)), -capacity, -speed))
    return np.sort(order[:count])


def locality_order(topology, devices: np.ndarray) -> np.ndarray:
    """``devices`` ordered by (region, host), each host's devices together, regions chained greedily
    from the first region by bandwidth so that consecutive regions are well connected."""
    devices = np.asarray(devices)
    regions = topology.region_ids[devices]
    hosts = topology.host_ids[devices]
    unique_regions = list(dict.fromkeys(regions.tolist()))
    if len(unique_regions) > 2:
        bw = topology.bandwidth_bytes_per_s
        rep = {g: devices[regions == g][0] for g in unique_regions}
        chain, left = [unique_regions[0]], set(unique_regions[1:])
        while left:
            here = rep[chain[-1]]
            nxt = max(left, key=lambda g: (bw[here, rep[g]], -g))
            chain.append(nxt)
            left.remove(nxt)
        rank = {g: i for i, g in enumerate(chain)}
    else:
        rank = {g: i for i, g in enumerate(sorted(unique_regions))}
    region_rank = np.array([rank[g] for g in regions.tolist()])
    return devices[np.lexsort((devices, hosts, region_rank))]


def layouts(topology, speed: np.ndarray, capacity: np.ndarray, stages: int, replicas: int) -> dict:
    """Named (replicas, stages) arrays of device indices for one degree pair."""
    chosen = choose_devices(speed, capacity, stages * replicas)
    ordered = locality_order(topology, chosen)
    result = {
        "pipelines-local": ordered.reshape(replicas, stages),
        "stages-local": ordered.reshape(stages, replicas).T.copy(),
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
        from planner.search.dtfm_search import groups_to_pipelines

        for name, order in (("contiguous-matched", chosen), ("stages-matched", ordered)):
            groups = [order[j * replicas:(j + 1) * replicas].tolist() for j in range(stages)]
            result[name] = groups_to_pipelines(topology, groups)
    return result
