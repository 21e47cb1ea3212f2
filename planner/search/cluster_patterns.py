"""The lower bound's term for where a small plan's cells sit among clusters (``planner.search.bounds``).

``stage_chains.clustered_stage_chains_s`` prices every crossing between clusters at the fastest
link between any two of them (``tau``), and every stage group that spans clusters at the slower
way of the fastest pair. On a few clusters joined by links of different speeds (regions around the
world), a plan cannot put every crossing on the fastest pair: a replica whose cells sit in ``k``
clusters crosses between ``k - 1`` pairs of them at least, and a stage group that spans clusters
syncs over the pair its members sit in.

Every cell of a plan whose cells are one device each (no tensor group: ``bounds._most_tensor_devices``
is 1) sits in one cluster, at most as many cells in a cluster as it has devices. Call the clusters
of the grid's cells (``c[r][s]`` for replica ``r``, stage ``s``) the plan's *pattern*. For a pattern,
with ``cost_models.simulator``'s rules (a message holds a link for ``bytes / bandwidth`` and arrives
``latency`` later; a stage's sync starts after every replica's last backward on it and lasts at
least its ring's bytes over the ring's slowest hop, ``cost_models.comm.ring_allreduce_time_s``):

- *boundaries*: replica ``r``'s activation of boundary ``s`` goes from a device of ``c[r][s]`` to one
  of ``c[r][s+1]`` and its gradient back, so where the two clusters differ each sequence's trip
  across the boundary takes at least ``a / beta(x, y) + a / beta(y, x)`` (``a``: a sequence's
  message bytes, ``beta(x, y)``: the fastest link from a device of ``x`` to one of ``y``) and two
  latencies of at least ``lambda(x, y) + lambda(y, x)`` (the least ones): over what
  ``round_trip_s`` counts (two fastest links' and two least latencies), that is what the boundary
  adds to every trip that crosses it (``round_trip.crossing_extra_s``'s parts for that pair);
- *syncs*: stage ``s``'s ring (``ring_only``: the only sync allowed) joins its ``D`` cells; where
  they sit in one cluster, no faster than the others' ring (``ring_bytes_per_s``); where they sit
  in exactly two clusters ``x, y`` the ring's cycle crosses both ways, so its slowest hop runs at
  most ``min(beta(x, y), beta(y, x))``; in three or more, at most the fastest ``beta`` between two of
  them. The hop carries ``2 (D - 1) / D`` of the stage's gradient bytes (``share``).

With ``b`` the busiest replica, ``stage_chains_s``'s argument holds for each stage ``k`` with its own
sync and ``b``'s crossings downstream of ``k`` (``stage_chains.placed_stage_chains_s``). Any replica
may be the busiest, so a pattern's plans take at least the least over its rows of that bound, and
every plan of ``S`` stages x ``D`` replicas at least the least over the patterns the clusters' sizes
allow (``pattern_chains_s``). The patterns are enumerated (rows as a multiset: the replicas are
interchangeable) and only the costs no other one is at most in every part of evaluated
(``_undominated``: the bound grows with each), at once; where a replica count has more than
``_MOST_PATTERNS`` patterns, or its enumeration would test more than ``_MOST_PAIRS`` (partial
pattern, row) pairs, that count gets 0 (time; every device a cluster of its own past a few stages).
"""

import numpy as np

from cost_models.schedule import Schedule
from planner.search.link_clusters import clusters_at
from planner.search.stage_chains import placed_stage_chains_s

__all__ = ["cluster_links", "pattern_chains_s"]

_MOST_PATTERNS = 6000  # patterns of one replica count enumerated at most (time)
_MOST_PAIRS = 250_000  # (partial pattern, row) pairs tested at once at most (time: about 0.1 s)


def cluster_links(network, tau_bytes_per_s: float) -> tuple:
    """``(bandwidth, latency, sizes)``: (K, K) the fastest link (bytes/s) and the least latency (s,
    the per-message overhead included) from a device of cluster ``x`` to another device of cluster
    ``y``, and (K,) each cluster's devices, for the ``K`` clusters at ``tau_bytes_per_s``
    (``link_clusters.clusters_at``; N x N: for small topologies)."""
    labels = clusters_at(network, tau_bytes_per_s)
    k = int(labels.max()) + 1
    bandwidth = np.array(network.bandwidth_bytes_per_s, dtype=float)
    latency = np.array(network.latency_s, dtype=float)
    other = ~np.eye(labels.size, dtype=bool)
    fastest = np.full((k, k), 0.0)
    least = np.full((k, k), np.inf)
    for x in range(k):
        for y in range(k):
            pairs = other & (labels[:, None] == x) & (labels[None, :] == y)
            if pairs.any():
                fastest[x, y] = float(bandwidth[pairs].max())
                least[x, y] = float(latency[pairs].min())
    return fastest, least, np.bincount(labels, minlength=k)


def _rows(stages: int, capacity: np.ndarray, most: int) -> tuple | None:
    """``(rows, counts)``: (R, S) every row of ``stages`` cluster ids no cluster of which holds more
    cells than its ``capacity``, and (R, K) each row's cells per cluster; None past ``most`` rows."""
    k = capacity.size
    rows, counts = np.zeros((1, 0), dtype=np.int64), np.zeros((1, k), dtype=np.int64)
    for _ in range(stages):
        room = counts < capacity  # (R, K): clusters each partial row may take next
        parent, cluster = np.nonzero(room)
        if parent.size > most:
            return None
        rows = np.concatenate([rows[parent], cluster[:, None]], axis=1)
        counts = counts[parent]
        counts[np.arange(parent.size), cluster] += 1
    return rows, counts


def _patterns(stages: int, replicas: int, capacity: np.ndarray, most: int) -> np.ndarray | None:
    """(P, D, S) every pattern of ``replicas`` rows of ``stages`` cluster ids, rows in non-decreasing
    order (a multiset), no cluster holding more cells than its ``capacity``; None past ``most``."""
    found = _rows(stages, capacity, most)
    if found is None:
        return None
    rows, counts = found
    chosen, used = np.arange(rows.shape[0])[:, None], counts  # (P, j) row indices, (P, K) cells
    for _ in range(replicas - 1):
        if chosen.shape[0] * rows.shape[0] > _MOST_PAIRS:
            return None
        later = np.arange(rows.shape[0])[None, :] >= chosen[:, -1:]  # a multiset: rows in order
        fits = later & ((used[:, None, :] + counts[None, :, :]) <= capacity).all(axis=2)
        parent, row = np.nonzero(fits)
        if parent.size > most:
            return None
        chosen = np.concatenate([chosen[parent], row[:, None]], axis=1)
        used = used[parent] + counts[row]
    return rows[chosen]


def _undominated(costs: np.ndarray) -> np.ndarray:
    """The rows of ``costs`` that no other row is at most in every column (of equal rows, one): a
    bound that grows with every column is least on one of them."""
    costs = costs[np.argsort(costs.sum(axis=1), kind="stable")]
    kept = []
    while costs.shape[0]:
        best, costs = costs[0], costs[1:]
        kept.append(best)
        costs = costs[~(costs >= best).all(axis=1)]
    return np.array(kept)


def _ring_rates(patterns: np.ndarray, fastest: np.ndarray, pure_bytes_per_s: float) -> np.ndarray:
    """(P, S) the fastest a stage's ring's slowest hop can run: ``pure_bytes_per_s`` inside one
    cluster, the slower way of the pair in two, the fastest pair's in three or more (module
    description)."""
    p, d, s = patterns.shape
    k = fastest.shape[0]
    apart = ~np.eye(k, dtype=bool)
    rates = np.full((p, s), float(pure_bytes_per_s))
    for j in range(s):
        member = np.zeros((p, k), dtype=bool)
        member[np.repeat(np.arange(p), d), patterns[:, :, j].ravel()] = True
        pairs = member[:, :, None] & member[:, None, :] & apart
        count = member.sum(axis=1)
        slower = np.where(pairs, fastest, np.inf).min(axis=(1, 2))  # two clusters: both ways cross
        best = np.where(pairs, fastest, 0.0).max(axis=(1, 2))  # three or more: some pair's way
        rates[:, j] = np.minimum(rates[:, j], np.where(count == 2, slower, np.where(count > 2, best, np.inf)))
    return rates


def _downstream(rows: np.ndarray, fastest: np.ndarray, least: np.ndarray, sequence_bytes: float,
                boundary_s: float, latency_s: float) -> tuple:
    """``(per sequence, per trip)``, (R, S) each: what row ``r``'s boundaries downstream of stage
    ``k`` add to a trip over them, over ``round_trip_s``'s fastest links and least latencies (module
    description; 0 on the last stage and where a boundary stays in one cluster)."""
    here, there = rows[:, :-1], rows[:, 1:]
    crossed = here != there
    with np.errstate(divide="ignore"):
        both = sequence_bytes / fastest[here, there] + sequence_bytes / fastest[there, here]
    per_sequence = np.where(crossed, np.maximum(0.0, both - 2.0 * boundary_s), 0.0)
    per_trip = np.where(crossed, np.maximum(0.0, least[here, there] + least[there, here] - 2.0 * latency_s), 0.0)
    # suffix sums: boundaries k .. S-2 lie downstream of stage k; none of the last stage
    tail = np.zeros((rows.shape[0], 1))
    per_sequence = np.concatenate([np.cumsum(per_sequence[:, ::-1], axis=1)[:, ::-1], tail], axis=1)
    per_trip = np.concatenate([np.cumsum(per_trip[:, ::-1], axis=1)[:, ::-1], tail], axis=1)
    return per_sequence, per_trip


def pattern_chains_s(fastest: np.ndarray, least: np.ndarray, capacity: np.ndarray, *, replicas: np.ndarray,
                     busiest: np.ndarray, ring_bytes_per_s: np.ndarray, share: np.ndarray, block_sync_bytes: float,
                     first_sync_bytes: float, last_sync_bytes: float, sequence_bytes: float, gpipe_fits=True,
                     most_patterns: int = _MOST_PATTERNS, **chains) -> np.ndarray:
    """(D,) seconds at least of any plan of ``chains["stages"]`` (S >= 2) stages and ``replicas`` (D,)
    replicas whose cells are one device each, rings the only sync (module description): the least over
    the patterns of ``capacity`` (devices per cluster) and their rows as the busiest replica's (of
    ``busiest`` (D,) sequences) of ``placed_stage_chains_s``; ``fastest``/``least``
    (``cluster_links``) the clusters' links; ``ring_bytes_per_s``, ``share`` (D,) a ring inside
    one cluster's fastest and its share of the bytes; ``*_sync_bytes`` a block's, the embeddings' and
    the head's gradient bytes; ``gpipe_fits`` (D,) or one; ``chains``: ``stage_chains_s``'s
    ``layers, schedules, interleaved, per_round, micro_batch, layer_s, head_s, boundary_s,
    latency_s``. 0 where a replica count has more than ``most_patterns`` patterns."""
    stages = chains["stages"]
    capacity = np.asarray(capacity, dtype=np.int64)
    replicas = np.asarray(replicas)
    fits = np.broadcast_to(np.asarray(gpipe_fits), replicas.shape)
    result = np.zeros(replicas.shape)
    for i, d in enumerate(replicas.tolist()):
        patterns = _patterns(stages, int(d), capacity, most_patterns)
        if patterns is None or patterns.shape[0] == 0:
            result[i] = 0.0 if patterns is None else np.inf  # no pattern: no such plan
            continue
        rates = _ring_rates(patterns, fastest, float(ring_bytes_per_s[i]))  # (P, S)
        per_sequence, per_trip = _downstream(patterns.reshape(-1, stages), fastest, least, sequence_bytes,
                                             chains["boundary_s"], chains["latency_s"])  # (P D, S)
        seconds = float(share[i]) / np.repeat(rates, d, axis=0)  # (P D, S) s per byte of each stage's sync
        costs = _undominated(np.concatenate([per_sequence, per_trip, seconds], axis=1))
        down = (costs[:, :stages].T, costs[:, stages:2 * stages].T)
        rate = costs[:, 2 * stages:]
        last = stages - 1
        syncs = [(block_sync_bytes * rate[:, k], first_sync_bytes * rate[:, k] if k == 0 else 0.0,
                  last_sync_bytes * rate[:, k] if k == last else 0.0) for k in range(stages)]
        schedules = tuple(x for x in chains["schedules"] if x != Schedule.GPIPE or fits[i])  # GPipe where it fits
        values = placed_stage_chains_s(syncs=syncs, downstream=down, busiest=np.full(costs.shape[0], busiest[i]),
                                       **{**chains, "schedules": schedules})
        result[i] = float(values.min())
    return result
