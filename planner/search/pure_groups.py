"""The lower bound's term for how far a plan's stage groups spread over clusters (``planner.search.bounds``).

At a clustering of ``planner.search.link_clusters`` (threshold ``tau``; ``cluster_bound.ClusterLevel``),
a plan of S stages x D replicas has ``x`` stage groups that *cross* (their D cells in two clusters or
more) and ``S - x`` *pure* ones (``planner.search.slow_crossings``); say the pure ones sit in ``g``
clusters (``g = 0`` where none is pure). Then:

- every cell of a pure group sits in one of those ``g`` clusters, and the crossing groups hold ``x D``
  cells: the plan computes at most at ``V_xg = min(V, C_g + F(x D))`` FLOP/s, with ``V`` the pair's
  cells' most (``cells_flops``), ``C_g`` the ``g`` fastest clusters' FLOP/s together and ``F(n)`` the
  most ``n`` cells reach (the ``n t`` fastest devices', ``sigma`` times the ``n`` fastest's, as the
  bound's work term);
- a crossing group's sync crosses a link of at most ``tau``: at least one block's gradients
  (``2 (D - 1) / D n / tau`` for a ring, and ``2 (D - 1)`` latencies of at least the clusters' least,
  ``s`` in all; ``cluster_bound``'s share for other syncs), and it starts after every member's last
  compute (``cost_models.simulator``: the sync op follows a cell's last backward), so each crossing
  cell's compute ends ``s`` before the end: with ``U`` the used cells' FLOP/s and ``U_x >= U - C_g``
  the crossing ones', ``T U >= W + U_x s`` (each cell computes at most ``T``, a crossing one
  ``T - s``, at its speed), and over ``U <= V_xg``: ``T >= min(W / C_g, (W + (V_xg - C_g) s) / V_xg)``
  (the bound decreases in ``U`` below ``C_g`` and is monotone above it);
- every replica has a cell in each pure group, so it visits the ``g`` clusters and changes cluster
  ``g - 1`` times at least: its round trips (``round_trip.round_trip_s``, GPipe's phases and, over
  the work at ``V_xg``, ``gpipe_idle.gpipe_idle_s``) price ``g - 1`` of the ``S - 1`` boundaries
  between clusters each way, as ``slow_crossings`` prices its hops; and every stage's sync, a
  crossing one's too, follows the busiest replica's chain of them to the last stage
  (``round_trip.last_sync_s``). Those ``g - 1`` crossings' latencies add up to at least the
  ``g - 1`` least of the clusters' pair latencies (``crossings_latency_s``): the pairs of clusters a
  replica's boundaries join connect the ``g`` clusters it visits, so ``g - 1`` of them at least are
  distinct pairs, and a boundary between two clusters takes at least that pair's least latency (and
  the clusters' least, ``level.latency_s``); the trips are linear in the summed latency (``2 (S - 1)
  lambda`` a trip), so the ``S - 1`` hops take the sum's average each;
- the pairs ``(x, g)`` a plan may have: ``x = 0`` with ``g`` at least the fewest clusters that hold
  S pure groups (``slow_crossings.fewest_clusters``); ``x >= 1`` (two replicas or more) with the
  ``g`` largest clusters holding ``S - x`` pure groups (``g = 0`` where ``x = S``); ``g <= S - x``
  (a pure group fills one cluster), and ``g`` at most the clusters; past ``MAX_CLUSTERS_CROSSED``
  one row stands for every larger ``g``: that many crossings, every cluster's FLOP/s, the most
  crossing groups (``S - g`` with the row's ``g``) and no check that the pure ones fit.

For a given ``g``, more crossing groups only raise ``V_xg`` (``F`` grows) and leave the crossings
and ``s`` as they are, and each of the three is at most as large with a larger ``V_xg`` (the second
is ``min(W / C_g, s + (W - C_g s) / V_xg)``): so of ``x >= 1`` only the most a ``g`` allows counts,
``S - g`` (a pure group in each of the ``g`` clusters; the feasibility only loosens with ``x``).

The plan has some ``(x, g)``, so it takes at least the least over them of the largest of the three:
``spread_floors_s`` gives that least over ``x = 0`` and over ``x >= 1``, and the pair's bound takes
the smaller of the two (``bounds._pair_bounds_s``): spreading the groups over more clusters, or
making more of them cross, buys devices with crossings or slow syncs.
"""

import numpy as np

from planner.search.slow_crossings import (MAX_CLUSTERS_CROSSED, crossing_extras, crossing_sync_share,
                                           fewest_pure_clusters)

__all__ = ["cluster_totals", "crossings_latency_s", "spread_floors_s"]


def cluster_totals(level) -> np.ndarray:
    """(K,) at least each cluster's FLOP/s of ``level`` (a ``cluster_bound.ClusterLevel``), largest
    first: the kept clusters' own, and for the clusters merged past ``MAX_CLUSTERS`` the merged
    row's (the largest of theirs), once for each of them."""
    totals = np.asarray(level.speed, dtype=float)[:, -1]  # the cumulative speed saturates at a cluster's total
    merged = len(level.cluster_sizes) - (totals.size - 1)
    if merged > 1:
        totals = np.append(totals, np.full(merged - 1, totals[-1]))
    return np.sort(totals)[::-1]


def crossings_latency_s(level, hops: np.ndarray, latency_s: float) -> np.ndarray:
    """Seconds at least that ``hops`` (an int array) crossings between distinct pairs of ``level``'s
    clusters add to ``hops`` hops at the least latency ``latency_s``: the ``hops`` least pair
    latencies (``level.pair_latencies_s``; past them, or where none were looked up, the clusters' least
    ``level.latency_s``), each at least ``level.latency_s``, less ``latency_s`` each."""
    least = float(level.latency_s)
    pairs = np.maximum(np.asarray(getattr(level, "pair_latencies_s", np.zeros(0)), dtype=float), least)
    hops = np.asarray(hops, dtype=np.int64)
    most = int(hops.max(initial=0))
    each = np.full(most, least)
    each[:min(most, pairs.size)] = pairs[:most]
    summed = np.concatenate([[0.0], np.cumsum(np.maximum(each - latency_s, 0.0))])
    return summed[hops]


def spread_floors_s(level, counts, *, stages: int, replicas: np.ndarray, work_flops: float, cells_flops: np.ndarray,
                    most_cells_flops, round_trips, boundary_s: float, latency_s: float, sequence_bytes: float,
                    block_sync_bytes: float, ring_only: bool, sharded: bool, sync_every: int) -> tuple:
    """``((D,), (D,))``: the module description's least over the pairs with ``x = 0`` and over those
    with ``x >= 1``, for plans of ``stages`` (S >= 2) stages and ``replicas`` (D = 1 .. len) replicas
    at ``level`` (``counts``: its ``slow_crossings.GroupCounts``); ``inf`` where no plan has such a pair.

    ``cells_flops``: (D,) the pair's cells' most FLOP/s together; ``most_cells_flops(n)``: the most
    FLOP/s any ``n`` (an array) cells reach together; ``round_trips(b, lam, phases_b, phases_lam,
    deepest_s, cells_work_s=...)``: ``slow_crossings.slow_crossing_s``'s, arrays broadcast with (D,)
    in and out; ``boundary_s``, ``latency_s``: one sequence's message over the fastest link and the
    least latency; ``sequence_bytes``: one sequence's message; ``block_sync_bytes``: one block's least
    sync bytes; ``ring_only``, ``sharded``, ``sync_every``: the syncs the job allows, as
    ``slow_crossing_s`` takes them (a crossing group's least sync ``s``: ``crossing_sync_s``)."""
    D = np.asarray(replicas)
    crossing_sync_s = _crossing_sync_s(level, D, block_sync_bytes, ring_only, sharded, sync_every)
    rows = D - 1
    totals = cluster_totals(level)
    most = min(stages, totals.size)
    g = np.arange(min(most, MAX_CLUSTERS_CROSSED) + 1)  # clusters the pure groups fill; the last row: that many or more
    last = g[-1] < most  # the last row stands for every g from it to ``most``
    # crossing groups: none, or the most that leave a pure group in each of the g clusters (module
    # description: for a given g, more crossing groups only allow more FLOP/s)
    x = np.stack([np.zeros_like(g), stages - g])  # (2, G)
    held = np.concatenate([np.zeros((D.size, 1)), counts.cumulative[rows]], axis=1)  # (D, 1 + C) g largest hold
    width = held.shape[1] - 1
    capacity = held[:, np.minimum(g, width)]  # (D, G); past the kept clusters: unknown, taken as enough
    capacity = np.where((g[None, :] > width) | (last & (g[None, :] == g[-1])), np.inf, capacity)
    pure_fit = capacity.T[None, :, :] >= (stages - x)[:, :, None]  # (2, G, D)
    ok = pure_fit & ((g[None, :] == 0) == (x == stages))[:, :, None]
    ok[1] &= (x[1] >= 1)[:, None] & (D[None, :] > 1)  # crossing groups: one at least, of two cells or more
    # x = 0: at least the fewest clusters that hold S pure groups (the same rule as ``slow_crossings``)
    k = fewest_pure_clusters(counts, rows, stages)
    ok[0] &= (k[None, :] > 0) & (g[:, None] >= k[None, :])
    top = np.concatenate([[0.0], np.cumsum(totals)[:g[-1]]])
    if last:
        top[-1] = totals[:most].sum()  # at most every cluster a replica may visit
    top = top[None, :, None]  # (1, G, 1) C_g
    crossing_flops = most_cells_flops(x[:, :, None] * D[None, None, :])  # (2, G, D) F(x D)
    speed = np.minimum(np.asarray(cells_flops)[None, None, :], top + crossing_flops)  # (2, G, D) V_xg
    sync = np.where(x[:, :, None] > 0, np.asarray(crossing_sync_s)[None, None, :], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_most = (work_flops + np.maximum(speed - top, 0.0) * sync) / speed
        below = np.where((top > 0) & (top < speed), work_flops / top, np.inf)
    work_s = np.minimum(at_most, below)
    hops = np.broadcast_to(np.maximum(g - 1, 0)[None, :, None], speed.shape)
    share = hops / (stages - 1)
    extra_b, extra_l = crossing_extras(level, sequence_bytes, boundary_s, latency_s)  # a crossing over a fast boundary
    crossed = hops > 0
    with np.errstate(divide="ignore"):
        cells_work_s = work_flops / speed
    hops_latency = crossings_latency_s(level, hops, latency_s)  # (2, G, D): the crossings' latencies, summed
    trips = round_trips(boundary_s + share * extra_b, latency_s + hops_latency / (stages - 1),
                        np.where(crossed, boundary_s + extra_b, boundary_s),
                        np.where(crossed, latency_s + extra_l, latency_s), np.broadcast_to(sync, speed.shape),
                        cells_work_s=cells_work_s)
    seconds = np.where(ok, np.maximum(work_s, trips), np.inf)
    return seconds[0].min(axis=0), seconds[1].min(axis=0)


def _crossing_sync_s(level, replicas: np.ndarray, block_sync_bytes: float, ring_only: bool, sharded: bool,
                     sync_every: int) -> np.ndarray:
    """(D,) the least sync of a group of D cells that crosses ``level``'s clusters, as
    ``slow_crossings.slow_crossing_s`` prices it: one block's gradients, a ring's ``2 (D - 1) / D`` of
    them over a link of at most ``tau`` and ``2 (D - 1)`` latencies of at least the clusters' least
    (``cost_models.comm.ring_allreduce_time_s``: every step as slow as the slowest hop, as long as the
    longest latency; none counted with local steps), or ``cluster_bound``'s share for the other
    syncs (1; ``2 / D`` for the sharded exchange)."""
    share, steps = crossing_sync_share(replicas, ring_only, sharded, sync_every)
    return block_sync_bytes * share / level.tau_bytes_per_s + steps * level.latency_s
