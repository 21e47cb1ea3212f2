"""Constructive placements: good starting points for a given number of stages and replicas.

Devices are picked fastest-first (idle devices are the slowest), then laid out so that either each
pipeline or each stage's data-parallel group sits in one locality (host, then region), or so that
pipelines are homogeneous in speed (fast pipelines then take more micro-batches). Locality comes
from the network itself (``planner.search.locality``).
"""

import numpy as np

from planner.search.dtfm_search import groups_to_pipelines
from planner.search.locality import locality_order

__all__ = ["choose_devices", "layouts", "MATCHED_STAGES", "MATCHED_DEVICES"]

MATCHED_STAGES = 12  # the exact stage-order search behind the matched layouts is exponential in stages
MATCHED_DEVICES = 256


def choose_devices(speed: np.ndarray, capacity: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` fastest devices (ties: more memory, then lower index)."""
    order = np.lexsort((np.arange(len(speed)), -capacity, -speed))
    return np.sort(order[:count])


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
        for name, order in (("contiguous-matched", chosen), ("stages-matched", ordered)):
            groups = [order[j * replicas:(j + 1) * replicas].tolist() for j in range(stages)]
            result[name] = groups_to_pipelines(topology, groups)
    return result
