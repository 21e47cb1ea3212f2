"""Locality from the network itself: devices ordered so that hosts and well-connected regions sit
together, and clusters of devices found on the bandwidth graph."""

import functools

import numpy as np
from scipy.sparse.csgraph import connected_components

from cost_models.comm import ring_allreduce_time_s
from cost_models.links import LevelMatrix

__all__ = ["locality_order", "symmetric_bandwidth", "bandwidth_clusters", "cluster_order", "chained_ring", "best_ring", "sorted_ring", "MAX_LEVELS",
           "MAX_THRESHOLDS", "MAX_CLUSTER_DEVICES", "MAX_HOST_CLUSTER_DEVICES", "MAX_RING_REGIONS", "MAX_TWO_OPT"]

MAX_LEVELS = 3  # cluster levels kept: the finest, and coarser ones evenly spread
MAX_THRESHOLDS = 48  # distinct bandwidths tried as cut levels, at most (quantiles beyond)
MAX_CLUSTER_DEVICES = 256  # clusters are sought over every device pair up to this many devices (each cut O(N^2))
# Above, on a network described by levels (no per-pair overrides), over one device per host up to this many
# devices (``cluster_order`` and the layouts still hold N x N arrays of the devices: 8 MB at 1,024)
MAX_HOST_CLUSTER_DEVICES = 1024
MAX_RING_REGIONS = 16  # regions a chained ring orders by 2-opt (Network.ring_order's own limit)
MAX_TWO_OPT = 32  # members up to which ``best_ring`` improves its ring by the vectorised 2-opt


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


def symmetric_bandwidth(topology, devices: np.ndarray) -> np.ndarray:
    """Bandwidth between ``devices`` both ways: the slower direction (a pipeline and a ring use both)."""
    bw = topology.network.bandwidth_bytes_per_s[np.ix_(devices, devices)]
    return np.minimum(bw, bw.T)


def bandwidth_clusters(topology, devices=None) -> list:
    """Levels of clusters of ``devices`` (all by default), finest first: single-linkage hierarchical
    clustering on the bandwidth graph (Gower and Ross 1969: the clusters at a cut are the connected
    components of the links at least that fast). Each level is an array of cluster labels, one per
    device of ``devices``, clusters numbered in order of their first device. Only levels with more than
    one cluster and fewer clusters than devices are kept; at most ``MAX_LEVELS`` of them. Over every
    device pair up to ``MAX_CLUSTER_DEVICES`` devices; above, up to ``MAX_HOST_CLUSTER_DEVICES``, on
    one device per host where that is the same (``_host_levels``); otherwise none."""
    devices = np.arange(topology.size) if devices is None else np.asarray(devices)
    if len(devices) < 3:
        return []
    if len(devices) <= MAX_CLUSTER_DEVICES:
        levels = _levels(topology, devices)
    elif len(devices) <= MAX_HOST_CLUSTER_DEVICES:
        levels = _host_levels(topology, devices)
    else:
        levels = []
    if len(levels) > MAX_LEVELS:
        keep = np.unique(np.round(np.linspace(0, len(levels) - 1, MAX_LEVELS)).astype(int))
        levels = [levels[i] for i in keep]
    return levels


def _host_levels(topology, devices: np.ndarray) -> list:
    """``_levels`` of ``devices`` from one device per host, each host's label given to its devices,
    the hosts themselves the finest level: the same clusters as over every pair (up to the
    thresholds' quantiles) where a link between two hosts' devices depends on the hosts alone (a
    network of levels: no per-pair overrides) and no two hosts are joined faster than a host joins
    its own devices; [] where that does not hold."""
    bandwidth = topology.network.bandwidth_bytes_per_s
    if not isinstance(bandwidth, LevelMatrix) or bandwidth.overrides:
        return []
    hosts = topology.host_ids[devices]
    _, first, host_of = np.unique(hosts, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # hosts in order of their first device
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    host_of, representatives = rank[host_of], devices[np.sort(first)]
    between = symmetric_bandwidth(topology, representatives)
    np.fill_diagonal(between, -np.inf)
    if len(representatives) > 1 and between.max() > bandwidth.host_value:
        return []  # a host's devices would split at some cut: only every pair tells
    levels = [host_of] if 1 < len(representatives) < len(devices) else []
    return levels + [labels[host_of] for labels in _levels(topology, representatives)]


def _levels(topology, devices: np.ndarray) -> list:
    """Every distinct level of clusters of ``devices`` over all their pairs (``bandwidth_clusters``),
    finest first, before the ``MAX_LEVELS`` selection."""
    bw = symmetric_bandwidth(topology, devices)
    values = np.unique(bw[np.isfinite(bw)])[::-1]
    if len(values) > MAX_THRESHOLDS:
        values = np.unique(np.quantile(values, np.linspace(0.0, 1.0, MAX_THRESHOLDS)))[::-1]
    levels, seen = [], set()
    for value in values:
        count, labels = connected_components(bw >= value, directed=False)
        if count == 1:
            break
        if count == len(devices):
            continue
        _, first = np.unique(labels, return_index=True)
        rank = np.argsort(np.argsort(first))  # clusters numbered by their first device
        labels = rank[labels]
        key = labels.tobytes()
        if key not in seen:
            seen.add(key)
            levels.append(labels)
    return levels


def cluster_order(topology, devices: np.ndarray, labels: np.ndarray, speed: np.ndarray) -> list:
    """The clusters of ``labels`` (over ``devices``) in the order the devices are taken from them: the
    cluster of most compute first (ties: best connected to the others, then the lowest label), then
    repeatedly the cluster best connected to those taken (the fastest link to any of them; ties: more
    compute), as Prim's maximum spanning tree adds them. Clusters whose links are slow come last, so
    a plan that needs fewer devices leaves them idle."""
    devices = np.asarray(devices)
    bw = symmetric_bandwidth(topology, devices)
    k = int(labels.max()) + 1
    compute = np.bincount(labels, weights=speed[devices], minlength=k)
    order = np.argsort(labels, kind="stable")
    starts = np.flatnonzero(np.r_[True, labels[order][1:] != labels[order][:-1]])
    between = np.maximum.reduceat(np.maximum.reduceat(bw[np.ix_(order, order)], starts, axis=0), starts, axis=1)
    np.fill_diagonal(between, 0.0)  # the fastest link between each two clusters
    first = max(range(k), key=lambda c: (compute[c], between[c].sum(), -c))
    order, left = [first], set(range(k)) - {first}
    link = between[first].copy()  # each cluster's fastest link to those taken
    while left:
        nxt = max(left, key=lambda c: (link[c], compute[c], -c))
        order.append(nxt)
        left.remove(nxt)
        np.maximum(link, between[nxt], out=link)
    return order


def chained_ring(topology, members, region_orders: dict | None = None) -> list | None:
    """A ring over ``members`` (device indices) that visits each region's members together (by host,
    then index), the regions in the order ``Network.ring_order`` (nearest neighbour, then 2-opt)
    gives their first devices in the topology: a ring crosses each slow link between regions once
    and closes over a fast one. Positions into ``members``; None when they span one region or more
    than ``MAX_RING_REGIONS``. ``region_orders`` memoises the regions' order per set of regions."""
    members = [int(m) for m in members]
    regions = topology.region_ids[members]
    present = sorted(set(regions.tolist()))
    if not 1 < len(present) <= MAX_RING_REGIONS:
        return None
    key = tuple(present)
    order = region_orders.get(key) if region_orders is not None else None
    if order is None:
        first = [int(np.flatnonzero(topology.region_ids == g)[0]) for g in present]
        order = [present[i] for i in topology.network.ring_order(first)]
        if region_orders is not None:
            region_orders[key] = order
    hosts = topology.host_ids[members]
    position = np.lexsort((np.array(members), hosts, np.array([order.index(g) for g in regions.tolist()])))
    return position.tolist()


@functools.lru_cache(maxsize=64)
def _reversals(k: int) -> np.ndarray:
    """Every 2-opt neighbour of a ring of ``k`` positions, as rows of positions: the segment
    ``i..j`` reversed, for ``1 <= i < j < k`` (the first position stays, as in ``Network.ring_order``)."""
    rows = []
    for i in range(1, k - 1):
        for j in range(i + 1, k):
            rows.append(list(range(i)) + list(range(j, i - 1, -1)) + list(range(j + 1, k)))
    return np.array(rows, dtype=np.int64).reshape(-1, k)


def _two_opt(network, ring: np.ndarray) -> np.ndarray:
    """``ring`` (device indices) improved by best-improvement 2-opt on the ring all-reduce time of a
    gigabyte, all neighbours scored at once (``Network.ring_hops`` of every neighbour: each hop at
    its link's bandwidth, a shared NIC split among the ring's hops through it)."""
    reversals = _reversals(len(ring))
    if not len(reversals):
        return ring
    current = float(network.ring_allreduce_s(1e9, ring))
    while True:
        candidates = ring[reversals]
        cost = ring_allreduce_time_s(1e9, *network.ring_hops(candidates))
        best = int(np.argmin(cost))
        if cost[best] >= current - 1e-12:
            return ring
        ring, current = candidates[best], float(cost[best])


def best_ring(topology, members, region_orders: dict | None = None, *, improve: bool = True) -> list:
    """The fastest ring (all-reduce time of a gigabyte) of ``Network.ring_order`` (2-opt when
    ``improve``) and ``chained_ring`` (``region_orders``: its memo); up to ``MAX_TWO_OPT`` members,
    the better of them improved by a vectorised 2-opt (shared NICs split among the ring's hops through
    them). Positions into ``members``."""
    network = topology.network
    members = [int(m) for m in members]

    def cost(order):
        return network.ring_allreduce_s(1e9, [members[i] for i in order])

    ring = network.ring_order(members, improve=improve)
    chained = chained_ring(topology, members, region_orders)
    if chained is not None and cost(chained) < cost(ring) - 1e-12:
        ring = chained
    if 3 < len(members) <= MAX_TWO_OPT:
        position = {d: i for i, d in enumerate(members)}
        improved = [position[int(d)] for d in _two_opt(network, np.array([members[i] for i in ring]))]
        if cost(improved) < cost(ring) - 1e-12:
            ring = improved
    return ring


def sorted_ring(topology, members, region_orders: dict | None = None) -> list:
    """``members`` (device indices) in ``best_ring``'s order over them sorted, without
    ``Network.ring_order``'s 2-opt: the order the search's estimate times a hierarchical sync by
    (``evaluate.timed_ring``, memoised per member set) and the plan then syncs in
    (``sync_choice.plan_with_sync``), so that the two time the same sync."""
    key = sorted(int(m) for m in members)
    return [key[i] for i in best_ring(topology, key, region_orders, improve=False)]
