"""Locality from the network itself: devices ordered so that hosts and well-connected regions sit together."""

import numpy as np

__all__ = ["locality_order"]


def locality_order(topology, devices: np.ndarray) -> np.ndarray:
    """``devices`` ordered by (region, host), each host's devices together, regions chained greedily
    from the first region by bandwidth so that consecutive regions are well connected."""
    devices = np.asarray(devices)
    regions = topology.region_ids[devices]
    hosts = topology.host_ids[devices]
    unique_regions = list(dict.fromkeys(regions.tolist()))
    if len(unique_regions) > 2:
        bw = topology.network.bandwidth_bytes_per_s
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
