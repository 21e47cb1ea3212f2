"""Clusters of devices that only slow links join, for lower bounds.

At a threshold ``tau`` (bytes/s), two devices are *joined* where the link between them is faster
than ``tau`` in either direction, or where they share a host (a tensor group never leaves its
host). The clusters are the connected components of that relation, so any two devices in
different clusters are joined, both ways, by links of at most ``tau`` (NIC caps included). A
cluster may be larger than the exact components (joining more than needed keeps that property);
the bounds only rely on it.

By levels (``cost_models.links.LevelMatrix``) the components come from the host/region structure
in time linear in the devices plus the region table and the pair entries, never N x N: hosts whose
shared NIC is at most ``tau`` both ways stand alone; the others of regions ``ra`` and ``rb`` join
where the table is above ``tau`` either way (the diagonal: inside a region); pair entries above
``tau`` join their two devices. A dense matrix (small topologies) is thresholded as is.
(``planner.search.locality.bandwidth_clusters`` joins devices only where both directions are fast,
on the dense block of at most a few hundred devices: clusters for placing, not for bounding.)
"""

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from cost_models.links import LevelMatrix

__all__ = ["least_latency_between", "pair_latencies_between", "pair_latency_matrix", "fastest_both_ways_between", "slower_way_between",
           "MAX_THRESHOLDS", "MAX_PAIRED_CLUSTERS", "link_thresholds", "clusters_at"]

MAX_THRESHOLDS = 8  # thresholds tried per topology (each gives a valid bound; more only tighten)
MAX_PAIRED_CLUSTERS = 64  # past this many clusters, no pair's own latency is looked up (K^2 pairs)


def link_thresholds(network) -> np.ndarray:
    """The bandwidths at which the clusters can change (the distinct link and NIC values), ascending:
    where there are more than ``MAX_THRESHOLDS``, that many spread over their sorted list (the fastest
    kept) and, by levels, the fastest link between two regions and the fastest between two hosts
    too (each region, and each host, a cluster at some threshold): at most ``MAX_THRESHOLDS + 2``."""
    bandwidth = network.bandwidth_bytes_per_s
    if isinstance(bandwidth, LevelMatrix):
        values = [bandwidth.host_value, *np.ravel(bandwidth.table), *bandwidth.overrides.values(),
                  *network.nic_egress_bytes_per_s, *network.nic_ingress_bytes_per_s]
    else:
        dense = np.array(bandwidth, dtype=float)
        values = dense[~np.eye(dense.shape[0], dtype=bool)]
    values = np.unique(np.asarray(values, dtype=float))
    values = values[np.isfinite(values) & (values > 0)]  # at the fastest, every host is a cluster
    if values.size > MAX_THRESHOLDS:
        values = values[np.unique(np.linspace(0, values.size - 1, MAX_THRESHOLDS).round().astype(int))]
        if isinstance(bandwidth, LevelMatrix):  # and the fastest link between two regions: each region a cluster
            table = np.asarray(bandwidth.table, dtype=float)
            between = table[~np.eye(table.shape[0], dtype=bool)]
            between = between[np.isfinite(between) & (between > 0)]
            if between.size:
                values = np.unique(np.append(values, between.max()))
            inter_host = table[np.isfinite(table) & (table > 0)]
            if inter_host.size:  # and the fastest link between two hosts: each host a cluster
                values = np.unique(np.append(values, inter_host.max()))
    return values


def clusters_at(network, tau: float) -> np.ndarray:
    """(N,) cluster label of each device at threshold ``tau``: labels 0 .. K-1."""
    host = np.asarray(network.host, dtype=np.int64)
    hosts = int(host.max()) + 1 if host.size else 0
    bandwidth = network.bandwidth_bytes_per_s
    if not isinstance(bandwidth, LevelMatrix):
        dense = np.array(bandwidth, dtype=float)
        np.fill_diagonal(dense, 0.0)
        a, b = np.nonzero((dense > tau) | (dense.T > tau))
        return _components(hosts, host[a], host[b])[host]
    egress, ingress = network.nic_egress_bytes_per_s, network.nic_ingress_bytes_per_s
    open_host = (egress > tau) | (ingress > tau)  # a host whose NIC passes more than tau one way at least
    region_of_host = np.zeros(hosts, dtype=np.int64)
    region_of_host[host] = bandwidth.region
    table = np.asarray(bandwidth.table, dtype=float)
    fast = (table > tau) | (table.T > tau)
    regions = table.shape[0]
    has_open = np.bincount(region_of_host[open_host], minlength=regions) > 0
    fast &= has_open[:, None] & has_open[None, :]
    ra, rb = np.nonzero(fast)
    # nodes: hosts 0 .. H-1, then one node per region standing for its open hosts
    open_ids = np.flatnonzero(open_host)
    linked = np.zeros(regions, dtype=bool)
    linked[ra] = True  # a region whose open hosts reach some open host faster than tau
    members = open_ids[linked[region_of_host[open_ids]]]
    pairs_a = [members, hosts + ra]
    pairs_b = [hosts + region_of_host[members], hosts + rb]
    if bandwidth.overrides:
        keys = np.array([k for k, v in bandwidth.overrides.items() if v > tau], dtype=np.int64).reshape(-1, 2)
        pairs_a.append(host[keys[:, 0]])
        pairs_b.append(host[keys[:, 1]])
    labels = _components(hosts + regions, np.concatenate(pairs_a), np.concatenate(pairs_b))[:hosts]
    return np.unique(labels, return_inverse=True)[1][host]


def _components(nodes: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected-component labels of ``nodes`` nodes joined by the edges ``a[k] -- b[k]``."""
    graph = coo_matrix((np.ones(a.size), (a, b)), shape=(nodes, nodes))
    return connected_components(graph, directed=False)[1]


def least_latency_between(network, labels: np.ndarray) -> float:
    """The least latency of a link between two devices of different clusters (``labels``), the
    per-message overhead included; by levels from the (region, region) table where two regions hold
    devices of different clusters, and the pair entries, never N x N."""
    latency = network.latency_s
    if not isinstance(latency, LevelMatrix):
        dense = np.array(latency, dtype=float)
        return float(np.min(np.where(labels[:, None] != labels[None, :], dense, np.inf)))
    regions = latency.table.shape[0]
    first = np.full(regions, -1)
    first[latency.region[::-1]] = labels[::-1]  # a label of each region (its first device's)
    mixed = np.zeros(regions, dtype=bool)
    mixed[latency.region[labels != first[latency.region]]] = True  # regions holding two clusters or more
    across = mixed[:, None] | mixed[None, :] | (first[:, None] != first[None, :])
    present = np.bincount(latency.region, minlength=regions) > 0
    across &= present[:, None] & present[None, :]
    candidates = [latency.table[across]] + [np.array([v for (a, b), v in latency.overrides.items()
                                                      if labels[a] != labels[b]])]
    values = np.concatenate(candidates)
    values = values[np.isfinite(values)]
    return float(values.min()) if values.size else 0.0


def pair_latencies_between(network, labels: np.ndarray) -> np.ndarray:
    """Each pair of clusters' (``labels``) least latency, either way, the per-message overhead
    included (``pair_latency_matrix``): ``K (K - 1) / 2`` values in ascending order; empty past
    ``MAX_PAIRED_CLUSTERS`` clusters or where a pair has none."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    if k < 2 or k > MAX_PAIRED_CLUSTERS:
        return np.zeros(0)
    upper = pair_latency_matrix(network, labels)[np.triu_indices(k, 1)]
    return np.sort(upper[np.isfinite(upper)]) if np.isfinite(upper).all() else np.zeros(0)


def pair_latency_matrix(network, labels: np.ndarray) -> np.ndarray:
    """(K, K) each pair of clusters' (``labels``) least latency, either way, the per-message overhead
    included (inf where no link joins them). By levels, a pair takes the least of the region table
    over the regions its two clusters hold devices in, the host latency where they share a region,
    and its pair entries: no more than the pair's least (a device pair the table lists may not
    exist), never N x N."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    latency = network.latency_s
    least = np.full((k, k), np.inf)
    if not isinstance(latency, LevelMatrix):
        dense = np.array(latency, dtype=float)
        for c in range(k):
            row = dense[labels == c].min(axis=0)  # (N,) from cluster c to every device
            np.minimum.at(least[c], labels, row)
    else:
        regions = latency.table.shape[0]
        inside = np.zeros((k, regions), dtype=bool)
        inside[labels, latency.region] = True
        table = np.asarray(latency.table, dtype=float)
        for a in range(regions):
            for b in range(regions):
                if np.isfinite(table[a, b]):
                    both = inside[:, a][:, None] & inside[:, b][None, :]
                    least = np.where(both, np.minimum(least, table[a, b]), least)
        if np.isfinite(latency.host_value):  # NaN: no two devices share a host
            shared = (inside[:, None, :] & inside[None, :, :]).any(axis=2)
            least = np.where(shared, np.minimum(least, float(latency.host_value)), least)
        for (a, b), value in latency.overrides.items():
            least[labels[a], labels[b]] = min(least[labels[a], labels[b]], float(value))
    return np.minimum(least, least.T)


def fastest_both_ways_between(network, labels: np.ndarray) -> float:
    """The most bytes/s a pair of devices of different clusters (``labels``) passes both ways:
    the largest ``min(bandwidth[a, b], bandwidth[b, a])`` over such pairs, at most.

    A stage boundary between two cells sends the activations one way and the gradients back over
    the reverse link of the same pair (``cost_models.simulator``: ``send_bwd`` goes to the upstream
    stage's device), and a gradient sync of two members sends ``n`` each way
    (``cost_models.network.Network.sync_flows``), so such traffic across clusters runs no faster
    than this. By levels, never N x N: a pair's two directions are at most the table's both ways
    and each device's own NICs' least (``q``), so per region the devices of the largest ``q`` of two
    different clusters are the candidates; the pair entries count at their pair's value (a pair
    entry that slows a pair the table counts leaves the value above the exact one, still a bound)."""
    bandwidth = network.bandwidth_bytes_per_s
    if not isinstance(bandwidth, LevelMatrix):
        dense = np.array(bandwidth, dtype=float)
        both = np.minimum(dense, dense.T)
        return float(np.max(np.where(labels[:, None] != labels[None, :], both, -np.inf), initial=0.0))
    region, host = bandwidth.region, bandwidth.host
    regions = bandwidth.table.shape[0]
    own = np.full(region.size, np.inf) if bandwidth.egress is None else np.minimum(bandwidth.egress[host],
                                                                                  bandwidth.ingress[host])
    # per region, the device of the largest q and the largest of another cluster: (q, cluster), -1 where none
    best = np.full((regions, 2), -np.inf)
    best_label = np.full((regions, 2), -1)
    order = np.lexsort((-own, region))  # by region, largest q first
    first = order[np.unique(region[order], return_index=True)[1]]
    best[region[first], 0], best_label[region[first], 0] = own[first], labels[first]
    other = order[labels[order] != best_label[region[order], 0]]
    if other.size:
        second = other[np.unique(region[other], return_index=True)[1]]
        best[region[second], 1], best_label[region[second], 1] = own[second], labels[second]
    table = np.asarray(bandwidth.table, dtype=float)
    both = np.minimum(table, table.T)
    value = -np.inf
    for i in range(2):
        for j in range(2):
            apart = (best_label[:, i][:, None] != best_label[:, j][None, :]) & (best_label[:, i][:, None] >= 0) & (
                best_label[:, j][None, :] >= 0)
            pair = np.minimum(both, np.minimum(best[:, i][:, None], best[:, j][None, :]))
            pair = np.where(apart & ~np.isnan(pair), pair, -np.inf)
            value = max(value, float(pair.max(initial=-np.inf)))
    for (a, b) in bandwidth.overrides:
        if labels[a] != labels[b]:
            value = max(value, float(min(bandwidth[a, b], bandwidth[b, a])))
    return max(value, 0.0)


def slower_way_between(network, labels: np.ndarray) -> float:
    """Between exactly two clusters (``labels`` 0 and 1): the slower of the two directions' fastest
    links, ``min(max bandwidth[0 -> 1], max bandwidth[1 -> 0])``, at most (inf for any other count).

    Any exchange among members of both clusters that goes round a cycle (a ring, the leads' ring of
    a hierarchical all-reduce) or both ways between pairs (a parameter server, DTFM's sharded
    exchange, a stage boundary: ``cost_models.network.Network.sync_flows``) crosses from 0 to 1 and
    from 1 to 0, so some crossing message runs no faster than this. By levels, never N x N: the
    fastest link from 0 to 1 is, over region pairs, the table's entry capped by the fastest egress
    NIC of 0's devices in the one and the fastest ingress of 1's in the other; the pair entries
    count at their value."""
    if labels.size == 0 or int(labels.max()) != 1:
        return np.inf
    bandwidth = network.bandwidth_bytes_per_s
    if not isinstance(bandwidth, LevelMatrix):
        dense = np.array(bandwidth, dtype=float)
        zero, one = labels == 0, labels == 1
        return float(min(dense[np.ix_(zero, one)].max(), dense[np.ix_(one, zero)].max()))
    region, host = bandwidth.region, bandwidth.host
    regions = bandwidth.table.shape[0]
    table = np.asarray(bandwidth.table, dtype=float)
    egress = np.full(region.size, np.inf) if bandwidth.egress is None else bandwidth.egress[host]
    ingress = np.full(region.size, np.inf) if bandwidth.ingress is None else bandwidth.ingress[host]
    ways = []
    for a, b in ((0, 1), (1, 0)):
        out = np.full(regions, -np.inf)
        np.maximum.at(out, region[labels == a], egress[labels == a])
        into = np.full(regions, -np.inf)
        np.maximum.at(into, region[labels == b], ingress[labels == b])
        values = np.minimum(table, np.minimum(out[:, None], into[None, :]))
        value = float(np.where(np.isnan(values), -np.inf, values).max())
        for (x, y) in bandwidth.overrides:
            if labels[x] == a and labels[y] == b:
                value = max(value, float(bandwidth[x, y]))
        ways.append(max(value, 0.0))
    return min(ways)
