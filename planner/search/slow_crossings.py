"""The lower bound's term for pipelines and stage groups that must cross slow links (``planner.search.bounds``).

At a threshold ``tau`` of ``planner.search.link_clusters``, any two devices of different clusters are
joined by links of at most ``tau`` bytes/s and at least ``lambda_tau`` seconds of latency
(``cluster_bound.ClusterLevel``), and every cell of a plan (a device, or a tensor group on one host)
sits inside one cluster. A plan of S stages x D replicas has S *stage groups* of D cells each; a
group is *pure* where its D cells sit in one cluster, *crossing* otherwise. A cluster of ``n_c``
devices holds at most ``floor(n_c / D)`` pure groups (a cell holds one device at least). Either:

(A) every group is pure. The groups then fill at least ``k`` clusters, the fewest whose
    ``floor(n_c / D)`` add up to S (``fewest_clusters``), and each replica's cell of stage s lies in
    stage s's cluster, so every replica's pipeline changes cluster at least ``k - 1`` times: its
    forward crosses ``k - 1`` boundaries over links of at most ``tau`` and at least ``lambda_tau``,
    and its backward as many back. The round trips of ``planner.search.round_trip`` then price
    ``k - 1`` of their ``S - 1`` boundaries each way at ``tau`` and ``lambda_tau``
    (``round_trip_s`` and ``last_sync_s`` are sums over the boundaries each trip crosses, so an
    average boundary of ``b + (k - 1) / (S - 1) (b_tau - b)`` prices them). GPipe's phases
    (``round_trip.gpipe_phases_s``) hold at any boundary, the crossing one too: its stage downstream
    receives every forward of a round before it sends a gradient back, and the first stage's last
    backward waits for the last gradient over it.
(B) ``x >= 1`` groups cross (``fewest_crossing_groups``: the pure ones must fit in what the crossing
    ones leave; the crossing ones take a device from two clusters at least, and a cluster whose size
    D divides loses a pure group to that). A crossing group's ring has a hop between clusters, so
    its sync takes ``2 (D - 1) / D n / tau + 2 (D - 1) lambda_tau`` at least
    (``cost_models.comm.ring_allreduce_time_s``: every step as slow as the slowest hop, as long as the
    longest latency); a pure one ``2 (D - 1) / D n / beta_D + 2 (D - 1) lambda`` as ``bounds``'
    ``sync`` term prices it. Every stage syncs after the busiest replica's chain of round trips has
    reached the last stage (``round_trip.last_sync_s``), so the plan takes at least that chain plus
    the slowest stage's sync: at least the least, over the layer splits (every stage one block at
    least), of the largest sync (``split_sync_s``). And a stage syncs after its own last backward,
    so after the busiest replica's sequences ran through its blocks on one cell (at least
    ``ceil(B / D)`` sequences, at the fastest cell's speed, as ``bounds``' widest stage): the same
    split's least of the largest compute plus sync. Only the blocks' parameters count.
    The ``S - x`` pure groups still fill ``k'`` clusters at least (``fewest_clusters`` of them), and
    every replica crosses between those ``k' - 1`` times, as in (A): the chain's boundaries are
    priced so too. More crossing groups leave fewer pure ones (fewer crossings) but sync more
    blocks slowly, so the bound is the least over the number of crossings ``v``, each with the
    fewest crossing groups that leave at most ``v`` (``MAX_CLUSTERS_CROSSED`` at most counted).

A group pure here may still cross a finer clustering's clusters: where none of them holds D
devices, every group's ring has a hop over one of its links (``every_group_crosses``), so the pure
groups of (A) and (B) sync no faster than over it (two thresholds at once: DTFM's world-wide case
joins Tokyo and Seoul to the rest at 0.694 Gbit/s while no region holds a group of 21).

The plan is in (A) or (B), so it takes at least the smaller of the two. With another sync than the
ring alone, or local steps, the latencies count for nothing and a crossing group's ring share is
``cluster_bound``'s (1 for a parameter server or a two-level all-reduce, ``2 / D`` for DTFM's
sharded exchange over one crossing link).
"""

import math
from dataclasses import dataclass

import numpy as np

_EXACT_STEPS = 3  # blocks per crossing stage tried exactly past the crossing without ceilings
MAX_CLUSTERS_CROSSED = 8  # clusters counted along a replica at most (fewer counted: a weaker, valid bound; faster)

__all__ = ["MAX_CLUSTERS_CROSSED", "GroupCounts", "group_counts", "fewest_clusters", "fewest_pure_clusters",
           "crossing_sync_share", "crossing_extras", "fewest_crossing_groups",
           "split_sync_s", "every_group_crosses",
           "slow_crossing_s"]


@dataclass(frozen=True, kw_only=True, eq=False)
class GroupCounts:
    """Per replica count D = 1 .. ``most``, what the clusters of sizes ``sizes`` hold of stage groups
    of D cells (``group_counts``)."""

    total: np.ndarray  # (D,) pure groups at most
    kept: np.ndarray  # (D,) the most once crossing groups took a device from two clusters
    cumulative: np.ndarray  # (D, C) the most the i + 1 largest clusters hold


def group_counts(sizes: np.ndarray, most: int, deepest: int) -> GroupCounts:
    """``GroupCounts`` of clusters of ``sizes`` devices for D = 1 .. ``most`` (``deepest``: the most
    stages asked; the ``min(deepest, MAX_CLUSTERS_CROSSED)`` largest clusters kept for
    ``fewest_clusters``, which then says 0 (no plan of pure groups) or counts no more of them)."""
    sizes = np.sort(np.asarray(sizes, dtype=np.int64))[::-1]
    values, counts = np.unique(sizes, return_counts=True)
    replicas = np.arange(1, most + 1)[:, None]
    held = values[None, :] // replicas  # (D, distinct sizes) pure groups one cluster holds
    total = (held * counts).sum(axis=1)
    # Clusters whose size D divides lose a pure group to a device taken; the crossing groups touch
    # two clusters at least, and the plan touches the others first.
    divisible = ((values[None, :] % replicas == 0) * counts).sum(axis=1)
    loss = np.maximum(0, 2 - (sizes.size - divisible))
    loss = np.minimum(loss, divisible)
    kept = total - loss
    largest = sizes[:max(1, min(deepest, MAX_CLUSTERS_CROSSED, sizes.size))]
    cumulative = np.cumsum(largest[None, :] // replicas, axis=1)
    return GroupCounts(total=total, kept=kept, cumulative=cumulative)


def fewest_clusters(cumulative: np.ndarray, stages: int) -> np.ndarray:
    """(D,) the fewest clusters whose pure groups add up to ``stages`` (from ``GroupCounts.cumulative``
    rows; 0 where the largest kept do not: more than they, or no plan of pure groups at all)."""
    reached = cumulative >= stages
    return np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, 0)


def fewest_pure_clusters(counts: GroupCounts, rows: np.ndarray, stages: int) -> np.ndarray:
    """(D,) the fewest clusters a plan of ``stages`` pure groups fills at each of ``rows`` (D - 1):
    ``fewest_clusters``, and past the kept clusters (where their counts' total still holds them) as
    many as were kept; 0 where no plan of pure groups exists."""
    k = fewest_clusters(counts.cumulative[rows], stages)
    return np.where((k == 0) & (counts.total[rows] >= stages), counts.cumulative.shape[1], k)


def crossing_sync_share(replicas: np.ndarray, ring_only: bool, sharded: bool, sync_every: int) -> tuple:
    """((D,), (D,)): the share of a block's gradient bytes a group of D cells sends over its slowest
    hop, and its latency steps: a ring's ``2 (D - 1) / D`` and ``2 (D - 1)`` steps
    (``cost_models.comm.ring_allreduce_time_s``; no step counted with local steps), ``cluster_bound``'s
    share 1 and no step for the other syncs, at most ``2 / D`` with the sharded exchange."""
    D = np.asarray(replicas, dtype=float)
    share = 2.0 * (D - 1) / D if ring_only else np.ones(D.shape)
    if sharded:
        share = np.minimum(share, 2.0 / D)
    steps = 2.0 * (D - 1) if ring_only and sync_every == 1 else np.zeros(D.shape)
    return share, steps


def crossing_extras(level, sequence_bytes: float, boundary_s: float, latency_s: float) -> tuple:
    """(seconds, seconds): what a boundary between ``level``'s clusters adds to one sequence's
    message over the fastest link (``boundary_s``) and to the least latency (``latency_s``)."""
    return max(0.0, sequence_bytes / level.tau_bytes_per_s - boundary_s), max(0.0, level.latency_s - latency_s)


def fewest_crossing_groups(stages: int, kept: np.ndarray) -> np.ndarray:
    """(D,) the fewest crossing groups of a plan of ``stages`` groups with one crossing at least:
    the ``S - x`` pure ones fit in the ``kept`` the crossing ones leave."""
    return np.clip(stages - kept, 1, stages)


def every_group_crosses(levels, replicas: np.ndarray) -> tuple:
    """``((D,) bytes/s, (D,) seconds)``: for each replica count D of ``replicas``, the slowest link and
    the longest latency that the ring of every stage group of D cells has a hop over at least, from
    the clusterings ``levels`` (``cluster_bound.ClusterLevel``s) where no cluster holds D devices
    (``inf`` and 0 where none is such).

    A group of D cells holds D devices at least, each cell inside one cluster of every clustering
    (a tensor group never leaves its host), so where every cluster of a clustering holds fewer than
    D devices the group's cells sit in two clusters or more, and its ring has a hop between two of
    them: a link of at most that clustering's ``tau`` and at least its latency. A ring's steps are all
    as slow as its slowest hop and as long as its longest latency
    (``cost_models.comm.ring_allreduce_time_s``), so the slowest ``tau`` and the longest latency of
    all such clusterings count together, whichever hops they are. The other syncs cross as
    ``cluster_bound`` says (a server's or a two-level all-reduce's ``n``, the sharded exchange's
    ``2 / D`` of it over one crossing link). So a group that is pure at a coarser clustering (its
    cells in one of its clusters) still syncs over such a link: two thresholds at once."""
    replicas = np.asarray(replicas)
    tau = np.full(replicas.shape, np.inf)
    latency = np.zeros(replicas.shape)
    for level in levels:
        every = replicas > int(level.cluster_sizes.max())
        tau = np.where(every, np.minimum(tau, level.tau_bytes_per_s), tau)
        latency = np.where(every, np.maximum(latency, level.latency_s), latency)
    return tau, latency


def split_sync_s(layers: int, stages: int, crossing: np.ndarray, slow_s: np.ndarray, fast_s: np.ndarray,
                 slow_latency_s: np.ndarray, fast_latency_s: np.ndarray) -> np.ndarray:
    """(D,) at most the least, over the splits of ``layers`` (L) blocks over ``stages`` (S) stages of
    one block at least, ``crossing`` (x) of them crossing, of the slowest stage's sync:

        min over a in [1, A] of max(G(a), F(a)),  G(a) = a s + l,
        F(a) = ceil((L - min(a x, L - r)) / r) f + l'

    with ``a`` the most blocks of a crossing stage (``ceil(X / x)`` of the crossing stages' X blocks;
    for that ``a`` the pure ones hold the fewest with X = min(a x, L - r)), ``r = S - x`` pure stages,
    ``A = ceil((L - r) / x)``, ``s``, ``f`` one block's sync over a crossing and a pure group, ``l``,
    ``l'`` their latencies. Where x = S every block is on a crossing stage: ``ceil(L / S) s + l``.
    G grows and F shrinks with ``a``, and F is at least its value without the ceiling, which
    crosses G at ``a_c``: every ``a <= floor(a_c)`` gives at least ``F(floor(a_c))``, every
    ``a >= ceil(a_c) + k`` at least ``G(ceil(a_c) + k)``; the ``k = _EXACT_STEPS`` values between are
    taken exactly, and the least of all that is returned (the least itself where F's ceiling moves
    the crossing by fewer than ``k`` steps, else below it)."""
    x = np.asarray(crossing, dtype=float)
    pure = x < stages
    r = np.maximum(stages - x, 1.0)
    most = np.ceil((layers - r) / x)  # A

    def G(a):
        return a * slow_s + slow_latency_s

    def F(a):
        return np.ceil((layers - np.minimum(a * x, layers - r)) / r) * fast_s + fast_latency_s

    with np.errstate(divide="ignore", invalid="ignore"):
        a_c = (layers * fast_s / r + fast_latency_s - slow_latency_s) / (slow_s + x * fast_s / r)
    a_c = np.nan_to_num(a_c, nan=1.0, posinf=layers, neginf=1.0)
    below, above = np.floor(a_c), np.maximum(np.ceil(a_c), 1.0)
    split = np.where(below >= 1.0, F(np.clip(below, 1.0, most)), np.inf)  # every a <= floor(a_c)
    for step in range(_EXACT_STEPS):  # each of the next few exactly
        a = above + step
        split = np.minimum(split, np.where(a <= most, np.maximum(G(a), F(np.minimum(a, most))), np.inf))
    a = above + _EXACT_STEPS  # and every a past them
    split = np.minimum(split, np.where(a <= most, G(a), np.inf))
    return np.where(pure, split, np.ceil(layers / np.maximum(x, 1.0)) * slow_s + slow_latency_s)


def slow_crossing_s(level, counts: GroupCounts, *, stages: int, layers: int, replicas: np.ndarray,
                    round_trips, boundary_s: float, latency_s: float, sequence_bytes: float, block_s: np.ndarray,
                    block_sync_bytes: float, fast_rate: np.ndarray, ring_only: bool, sharded: bool,
                    sync_every: int, pure_tau_bytes_per_s=math.inf, pure_latency_s=0.0, window=None) -> np.ndarray:
    """(D,) the bound of the module description for plans of ``stages`` (S >= 2) stages and
    ``replicas`` (D = 1 .. len) replicas at ``level`` (a ``cluster_bound.ClusterLevel``).

    ``round_trips(boundary_s, latency_s, phases_boundary_s, phases_latency_s, deepest_sync_s)``: the
    round trips' bound (``bounds._round_trips_s``) with those per-boundary costs, GPipe's phases
    over one boundary at those, and the deepest stage's sync, each (rows, D); ``block_s``: (D,)
    the busiest replica's sequences through one block on one cell at its fastest; ``boundary_s``, ``latency_s``: one
    sequence's message over the fastest link and the least latency; ``sequence_bytes``: one
    sequence's message; ``block_sync_bytes``: one block's least sync bytes; ``fast_rate``: (D,)
    seconds per sync byte of a pure group (``bounds``' ``ring``); ``window``: a
    ``backward_window.WindowTerm`` of ``level``'s clusters, whose cases (A) and (B) raise this one's
    (``bounds.lower_bound_s`` builds them; the search's pair order, ``bounds.pair_bounds_s``, does not),
    or None."""
    tau, slow_latency = level.tau_bytes_per_s, level.latency_s
    D = np.asarray(replicas)
    rows = D - 1
    extra_b, extra_l = crossing_extras(level, sequence_bytes, boundary_s, latency_s)  # a boundary between clusters
    # (B) x >= 1 groups cross; the S - x pure ones fill clusters that every replica crosses between
    fewest = fewest_crossing_groups(stages, counts.kept[rows])
    cumulative = counts.cumulative[rows]  # (D, C)
    # past the first v whose clusters hold every pure group the fewest crossing ones leave, x stays the fewest
    settled = cumulative >= (stages - fewest)[:, None]
    last = np.where(settled.any(axis=1), settled.argmax(axis=1), cumulative.shape[1] - 1).max(initial=0)
    hops = np.arange(min(stages, cumulative.shape[1], last + 1))[:, None]  # (V, 1): v = 0 .. V - 1
    x = np.clip(stages - cumulative.T[:hops.size], fewest, stages)  # (V, D) the fewest crossing with <= v hops
    x[-1] = fewest  # the last row stands for every plan of V - 1 hops or more
    v = np.minimum(_pure_hops(cumulative, stages - x), hops.size - 1)  # (V, D) the hops those x leave, at least
    share, steps = crossing_sync_share(D, ring_only, sharded, sync_every)
    # a pure group crosses a finer clustering's clusters where none holds D devices (``pure_tau_bytes_per_s``)
    fast_s = np.maximum(block_sync_bytes * fast_rate, block_sync_bytes * share / pure_tau_bytes_per_s)
    slow_s = np.maximum(block_sync_bytes * share / tau, fast_s)  # a crossing ring is a ring of D too
    pure_latency = np.maximum(latency_s, pure_latency_s)
    # the sync alone (after the chain) and with the stage's compute, in one call
    deepest, widest = split_sync_s(layers, stages, x, np.stack([slow_s, block_s + slow_s])[:, None],
                                   np.stack([fast_s, block_s + fast_s])[:, None], steps * slow_latency,
                                   steps * pure_latency)
    # (A) every group pure: k - 1 boundaries each way; as row 0 of (B)'s chain, the deepest stage's ring
    # (``ceil(L / S)`` blocks) paying its latencies too
    k = fewest_pure_clusters(counts, rows, stages)
    crossings = np.vstack([np.maximum(k - 1, 0)[None, :], v])  # (1 + V, D)
    slow_share = crossings / (stages - 1)
    crossed = crossings > 0  # a boundary between clusters: GPipe's phases there
    trips = round_trips(boundary_s + slow_share * extra_b, latency_s + slow_share * extra_l,
                        np.where(crossed, boundary_s + extra_b, boundary_s),
                        np.where(crossed, latency_s + extra_l, latency_s),
                        np.vstack([(math.ceil(layers / stages) * fast_s + steps * pure_latency)[None, :], deepest]))
    pure = np.where(k > 0, trips[0], np.inf)  # no plan of pure groups where k = 0
    crossed_rows = np.maximum(trips[1:], widest)
    if window is not None:  # the backward passes wait for the round trip and for their stage's sync
        pure_sync, crossing_sync = fast_s + steps * pure_latency, slow_s + steps * slow_latency  # one block's
        pure = np.maximum(pure, window.pure_s(stages, D, pure_sync))
        crossed_rows = np.maximum(crossed_rows, window.crossed_s(v + 1, D, pure_sync, crossing_sync))
    crossing = np.where(D > 1, crossed_rows.min(axis=0), np.inf)
    return np.minimum(pure, crossing)


def _pure_hops(cumulative: np.ndarray, pure: np.ndarray) -> np.ndarray:
    """(V, D) the fewest cluster changes along a replica whose ``pure`` (V, D) pure stage groups
    fill clusters of the ``cumulative`` (D, C) counts: the fewest clusters that hold them, less one
    (C where the C largest do not; 0 where no group is pure)."""
    reached = cumulative[None, :, :] >= pure[:, :, None]
    return np.where(reached.any(axis=2), reached.argmax(axis=2), cumulative.shape[1])
