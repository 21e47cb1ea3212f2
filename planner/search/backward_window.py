"""The lower bound's term for the backward passes that wait for their round trip (``planner.search.bounds``).

In the simulator (``cost_models.simulator``) a stage runs a micro-batch's backward only after the
gradient of that micro-batch came back from the stage downstream (a receive blocks until its message
arrived), so only after the micro-batch's forward reached the last stage and its gradient came back
to the stage; a message from a cell in cluster X to one in cluster Y arrives at least
``lambda(X, Y) + m / beta(X, Y)`` after it is sent (``m``: one sequence's boundary bytes at least,
``lambda``: the least latency between the two clusters either way, ``beta``: the fastest link
between them either way). And the stage's last backward is followed by its gradient's way back to
the first stage, whose last backward ends before the iteration does. So on a replica whose pipeline
visits the clusters of a set ``U`` (stage 0 in one of them, each boundary to the next stage's),
every backward op of every stage lies in a window of ``T - R(U)`` at most, where ``R(U)`` is the
least round trip of a walk through ``U``: a walk's crossings each way, the first micro-batch's
forward through every block on the fastest cell (``chain_s``) too. Interleaved pieces walk through
the same clusters, more than once; accumulation rounds only add round trips.

The stage's last backward is also followed by its sync (``y``: one block's at least, over a crossing
ring where its group spans clusters). On stage s, before its first backward come the first
micro-batch's forward through every block and every crossing downstream, and the crossings back
from the last stage to s; after its last backward, the crossings back from s to the first stage, or
the sync, the longer. Together that is at least ``chain + R(U) / 2 + max(R(U) / 2, y)`` (the hop
costs are symmetric, so each way is half a round trip): the time outside a cell's backwards.
A cell runs its ops one after the other, so the batch's backward FLOPs ``W_b`` (every block, every
sequence: a block's training FLOPs at the least slowdown less its forward,
``cost_models.simulator.op_compute_s``; under ZB-H1 only the input gradients stay in the trip,
``cost_models.flops.zero_bubble_trip_share``) fit in the cells' FLOP/s times those windows.

``R(U)`` is at least the least Hamiltonian path through ``U`` over the hop costs' metric closure (a
walk through every cluster, shortcut where it revisits one, is such a path, no longer: the closure
obeys the triangle inequality), computed for every subset of at most ``MAX_WINDOW_CLUSTERS``
clusters by dynamic programming over subsets (Held & Karp 1962), and it grows with ``U`` (shortcut
the path through ``U'`` that contains ``U``). With the slow crossings' cases
(``planner.search.slow_crossings``):

- (A) every stage group sits in one cluster: the groups fill a set ``U`` whose clusters hold S groups
  of D cells (``sum_{X in U} floor(n_X / D) >= S``), every used device lies in ``U``, and every
  replica has a cell in every group, so visits all of ``U``: the plan takes at least the least, over
  such ``U``, of ``max(W / C(U), chain + R(U) / 2 + max(R(U) / 2, y) + W_b / C(U))`` (``C(U)``: the
  FLOP/s of ``U``'s devices, at most the cells' ``cells_flops``);
- (B) the pure groups fill ``j >= v + 1`` clusters, which every replica visits: the pure cells
  (at most the FLOP/s of the ``j`` fastest clusters) wait as in (A), the crossing ones for a
  crossing ring's ``y``; the least over how the FLOP/s split between them
  (``WindowTerm.crossed_s``) and over ``j``.
"""

from dataclasses import dataclass

import numpy as np

from cost_models.links import LevelMatrix
from planner.search.link_clusters import pair_latency_matrix

__all__ = ["MAX_WINDOW_CLUSTERS", "Window", "WindowTerm", "window_of", "hop_costs_s", "least_walks_s"]

MAX_WINDOW_CLUSTERS = 12  # clusters a clustering may have for this term (2^K subsets; past it, no term)


@dataclass(frozen=True, kw_only=True, eq=False)
class Window:
    """One clustering's least round trips: ``walk_s[mask]`` the least round trip through the clusters
    of ``mask`` (bit i: cluster i; 0 for one cluster), ``speed[mask]`` their devices' FLOP/s,
    ``sizes`` the devices per cluster, ``least_s[j]`` the least ``walk_s`` over sets of ``j`` clusters,
    ``top_speed[j]`` the most ``speed`` of them, ``members`` which clusters each set holds."""

    walk_s: np.ndarray  # (2^K,)
    speed: np.ndarray  # (2^K,)
    sizes: np.ndarray  # (K,)
    least_s: np.ndarray  # (K + 1,)
    top_speed: np.ndarray  # (K + 1,) the most FLOP/s of any j clusters
    members: np.ndarray  # (2^K, K) 1 where the set holds the cluster


@dataclass(frozen=True, kw_only=True, eq=False)
class WindowTerm:
    """A ``Window`` and the job's work: ``work_flops`` the iteration's FLOPs (``bounds.work_flops``),
    ``window_flops`` the backward FLOPs that wait for the round trip (``W_b``), ``cells_flops`` (D,) the
    most FLOP/s a plan's cells reach together for D = 1 .. len (``bounds``' ``cells_flops``), and
    ``chain_s`` the first micro-batch's forward through every block on the fastest cell."""

    window: Window
    work_flops: float
    window_flops: float
    cells_flops: np.ndarray
    chain_s: float

    def _gaps_s(self, walk_s, sync_s):
        """Seconds of an iteration outside a cell's backward window: the first micro-batch's forward
        through every block and a walk's crossings one way before it (half the walk's round trip:
        the hop costs are symmetric), then the way back or the stage's sync ``sync_s``, the longer."""
        return self.chain_s + walk_s / 2.0 + np.maximum(walk_s / 2.0, sync_s)

    def pure_s(self, stages: int, replicas: np.ndarray, pure_sync_s: np.ndarray) -> np.ndarray:
        """(D,) case (A) of the module description for S = ``stages`` and D = ``replicas`` (1-based,
        ascending rows of ``cells_flops``), each stage syncing ``pure_sync_s`` (D,) at least after its
        last backward: inf where no set of clusters holds S pure groups of D cells."""
        w = self.window
        D = np.asarray(replicas, dtype=np.int64)
        held = w.members @ (w.sizes[:, None] // D[None, :])  # (2^K, D) pure groups each set holds
        speed = np.minimum(w.speed[:, None], self.cells_flops[D - 1][None, :])
        gaps = self._gaps_s(w.walk_s[:, None], np.asarray(pure_sync_s)[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.maximum(self.work_flops / speed, gaps + self.window_flops / speed)
        return np.where(held >= stages, value, np.inf).min(axis=0)

    def crossed_s(self, visited: np.ndarray, replicas: np.ndarray, pure_sync_s: np.ndarray,
                  crossing_sync_s: np.ndarray) -> np.ndarray:
        """(V, D) case (B): the pure groups of a plan of D = ``replicas`` fill ``visited`` (V, D)
        clusters at least, ``j`` of them, all of which every replica visits; its pure cells (at most
        the FLOP/s of the ``j`` fastest clusters, ``top_speed``) wait as in (A), its crossing cells
        for their stage's sync ``crossing_sync_s`` (D,) at least. With ``c`` FLOP/s in all and
        ``c_p`` of them pure, ``W_b`` fits in the cells' FLOP/s times their windows:
        ``T >= (W_b + c_p g_p + (c - c_p) g_x) / c`` (``g``: the time outside the windows,
        ``_gaps_s``), least with all of ``c`` on the shorter gap (the pure cells at most ``top_speed``),
        and over ``c`` in ``(0, cells]``: at ``cells`` or, with the pure gap the shorter, at
        ``min(top_speed, cells)`` (the bound falls with ``c`` up to there, then moves one way); the
        least over ``j``; never below the work over ``cells``."""
        w = self.window
        D = np.asarray(replicas, dtype=np.int64)
        cells = self.cells_flops[D - 1][None, :]  # (1, D)
        k = w.sizes.size
        j = np.arange(1, k + 1)[:, None]  # (K, 1)
        walk = np.where(j >= 2, w.least_s[j], 0.0)  # (K, 1)
        pure_gap = self._gaps_s(walk, np.asarray(pure_sync_s)[None, :])  # (K, D)
        crossing_gap = self._gaps_s(walk, np.asarray(crossing_sync_s)[None, :])

        def at(c):  # the bound with c FLOP/s in all, the pure cells on the shorter gap where it is theirs
            pure = np.where(pure_gap <= crossing_gap, np.minimum(w.top_speed[j], c), 0.0)
            return (self.window_flops + pure * pure_gap + (c - pure) * crossing_gap) / c

        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.minimum(at(cells), np.where(pure_gap <= crossing_gap, at(np.minimum(w.top_speed[j], cells)),
                                                   np.inf))
        value = np.maximum(value, self.work_flops / cells)  # (K, D) with the pure groups in j clusters
        # at least ``visited`` clusters: the least over j >= visited (a suffix minimum over j)
        suffix = np.minimum.accumulate(value[::-1], axis=0)[::-1]  # (K, D)
        least = np.clip(np.asarray(visited, dtype=np.int64), 1, k) - 1
        return np.take_along_axis(suffix, least, axis=0)


def window_of(network, labels: np.ndarray, flops: np.ndarray, sequence_bytes: float) -> Window | None:
    """The ``Window`` of the clustering ``labels`` (one per device) for messages of ``sequence_bytes``
    (None past ``MAX_WINDOW_CLUSTERS`` clusters or below two)."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    if k < 2 or k > MAX_WINDOW_CLUSTERS:
        return None
    walk = least_walks_s(hop_costs_s(network, labels, sequence_bytes))
    per_cluster = np.bincount(labels, weights=np.asarray(flops, dtype=float), minlength=k)
    masks = np.arange(1 << k)
    bits = (masks[:, None] >> np.arange(k)[None, :]) & 1
    counts = bits.sum(axis=1)
    least = np.full(k + 1, np.inf)
    np.minimum.at(least, counts, walk)
    speed = bits @ per_cluster
    top = np.zeros(k + 1)
    np.maximum.at(top, counts, speed)
    return Window(walk_s=walk, speed=speed, sizes=np.bincount(labels, minlength=k), least_s=least, top_speed=top,
                  members=bits)


def hop_costs_s(network, labels: np.ndarray, sequence_bytes: float) -> np.ndarray:
    """(K, K) the least a boundary between a cell of cluster X and one of Y adds to a round trip:
    a message each way, each at least ``lambda + m / beta`` (the pair's least latency either way,
    ``link_clusters.pair_latency_matrix``, and its fastest link, ``_pair_fastest``; a shared NIC only
    slows it); 0 on the diagonal."""
    latency = pair_latency_matrix(network, labels)
    bandwidth = _pair_fastest(network.bandwidth_bytes_per_s, labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = 2.0 * (latency + sequence_bytes / bandwidth)
    np.fill_diagonal(cost, 0.0)
    return cost


def _pair_fastest(bandwidth, labels: np.ndarray) -> np.ndarray:
    """(K, K) the most ``bandwidth[a, b]`` or ``bandwidth[b, a]`` over the devices a of cluster X and
    b of Y, NaN entries (no link described) skipped, 0 where none; by levels from the region table
    over the regions each cluster holds devices in (a pair in one region: its diagonal entry; the
    host entry never joins two clusters) and the pair entries, never N x N."""
    k = int(labels.max()) + 1
    out = np.zeros((k, k))
    if isinstance(bandwidth, LevelMatrix):
        table = np.asarray(bandwidth.table, dtype=float)
        inside = np.zeros((k, table.shape[0]), dtype=bool)
        inside[labels, bandwidth.region] = True
        both = np.fmax(table, table.T)  # NaN: no entry either way
        for a, b in zip(*np.nonzero(~np.isnan(both))):
            out = np.where(inside[:, a][:, None] & inside[:, b][None, :], np.maximum(out, both[a, b]), out)
        for (a, b), value in bandwidth.overrides.items():
            if not np.isnan(value):
                out[labels[a], labels[b]] = max(out[labels[a], labels[b]], float(value))
    else:
        dense = np.nan_to_num(np.array(bandwidth, dtype=float), nan=0.0, posinf=np.inf)  # NaN: no link
        np.fill_diagonal(dense, 0.0)
        for c in range(k):
            for d in range(k):
                block = dense[np.ix_(labels == c, labels == d)]
                if c != d and block.size:
                    out[c, d] = max(out[c, d], float(block.max()))
    return np.maximum(out, out.T)


def least_walks_s(hop_s: np.ndarray) -> np.ndarray:
    """(2^K,) for every set of clusters (bit i: cluster i), the least Hamiltonian path through it
    over the metric closure of the symmetric hop costs ``hop_s`` (K, K) (Floyd-Warshall, then Held &
    Karp's dynamic programming over subsets); 0 for a single cluster, inf for the empty set."""
    k = hop_s.shape[0]
    closure = np.array(hop_s, dtype=float)
    for via in range(k):
        closure = np.minimum(closure, closure[:, via][:, None] + closure[via, :][None, :])
    best = np.full((1 << k, k), np.inf)  # best[mask, j]: least path through mask ending at j
    best[1 << np.arange(k), np.arange(k)] = 0.0
    for mask in range(1, 1 << k):
        here = best[mask]
        if not np.isfinite(here).any():
            continue
        outside = np.array([not (mask >> i) & 1 for i in range(k)])
        if not outside.any():
            continue
        reach = (here[:, None] + closure).min(axis=0)  # (K,) end at i, coming from any end j of mask
        targets = np.flatnonzero(outside)
        grown = mask | (1 << targets)
        best[grown, targets] = np.minimum(best[grown, targets], reach[targets])
    walk = best.min(axis=1)
    walk[0] = np.inf
    return walk
