"""The lower bound's term for stage groups and pipelines that cross two clusterings at once (``planner.search.bounds``).

``planner.search.slow_crossings`` prices one threshold ``tau`` of ``planner.search.link_clusters`` at a
time. Two thresholds ``tau_c < tau_f`` give a *coarse* and a *fine* clustering; every fine cluster lies
inside one coarse cluster (joining at ``tau_c`` joins every pair joined at ``tau_f``), so two devices of
different coarse clusters are of different fine clusters too, and a link between them is at most
``tau_c`` and at least both latencies. A plan of S stages x D replicas has ``x_f`` stage groups that
cross fine clusters and ``x_c <= x_f`` that cross coarse ones (a group pure in a fine cluster is pure
in its coarse one). For each pair ``(x_f, x_c)`` a plan may have (``slow_crossings.fewest_crossing_groups``
at each clustering, or none crossing where the pure groups fit):

- the syncs: ``x_c`` stages sync over a coarse crossing (``s_c`` a block, a ring's ``2 (D - 1)``
  latencies of the longer of the two), ``x_f - x_c`` over a fine one (``s_f``), the others over
  the fastest ring or a finer clustering's link (``slow_crossings.every_group_crosses``); the least,
  over the splits of the L blocks (one block a stage at least), of the slowest stage's sync is the
  least ``T`` with ``sum_k n_k floor((T - l_k) / s_k) >= L`` (``split_three_s``);
- the round trips: the pure groups of each clustering fill clusters that every replica crosses
  between (``slow_crossings._pure_hops``): ``v_c`` boundaries at least at the coarse price, and
  ``max(v_f, v_c) - v_c`` more at the fine one. Every replica also crosses once at least where a
  pure group exists and no cluster holds it and the replica's ``S - 1`` other cells (``D + S - 1``
  devices; a cell holds a device at least), or where the pure groups cannot all lie in one cluster:
  a cluster without pure groups has all its used devices in crossing groups, at most ``D - 1``
  cells of each, and its idle devices and the devices its cells hold past one each are at most
  ``N - S D`` together (every cell holds one device at least) (``_crossed``);

and, as in ``slow_crossings``' (B), the chain of round trips ends with the slowest stage's sync, and
a stage's sync follows its own blocks' compute. The plan has some ``(x_f, x_c)``, so it takes at
least the least over them.
"""

import math

import numpy as np

from planner.search.slow_crossings import _pure_hops, fewest_crossing_groups

__all__ = ["split_three_s", "nested_crossing_s"]

_WINDOW = 4  # times tried for each class of stages from the relaxed least on (``split_three_s``)


def split_three_s(layers: int, counts: np.ndarray, block_s: np.ndarray, latency_s: np.ndarray) -> np.ndarray:
    """At most the least, over the splits of ``layers`` (L) blocks over the stages of ``counts`` (K, ...)
    classes of stages (one block a stage at least), of the slowest stage's ``a s_k + l_k`` for a
    stage of class k holding ``a`` blocks (``block_s``, ``latency_s``: (K, ...) ``s_k``, ``l_k``).

    At the least ``T`` every stage holds at most ``floor((T - l_k) / s_k)`` blocks and one at least,
    so ``c(T) = sum_k n_k floor((T - l_k) / s_k) >= L`` with ``T >= s_k + l_k`` for each class with
    stages; the least such ``T`` is some stage's time ``a s_k + l_k``, and a split meeting it exists
    (fill each stage to its most, then take blocks off down to one each). Without the floors,
    ``T >= T_0 = (L + sum n_k l_k / s_k) / sum n_k / s_k``; ``c`` grows with ``T``, so the least is
    the first of the times from ``T_0`` on with ``c(T) >= L``: the ``_WINDOW`` first of each class
    are tried, and where none passes their largest is returned (every time up to it fails: below
    the least). A class of ``s_k = 0`` holds every block at ``l_k``."""
    counts, block_s, latency_s = np.broadcast_arrays(counts, block_s, latency_s)
    present = counts > 0
    least = np.where(present, block_s + latency_s, -np.inf).max(axis=0)
    free = (present & (block_s <= 0)).any(axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a tiny s_k: a stage holds any L
        rate = np.where(present & (block_s > 0), counts / block_s, 0.0)
        relaxed = (layers + (rate * latency_s).sum(axis=0)) / rate.sum(axis=0)
        start = np.maximum(relaxed, least)
        first = np.maximum(1.0, np.ceil((start[None] - latency_s) / block_s - 1e-9))
        first = np.where(np.isfinite(first), first, 1.0)
        steps = np.arange(_WINDOW).reshape((-1,) + (1,) * counts.ndim)
        tried = (first[None] + steps) * block_s[None] + latency_s[None]
        tried = tried.reshape((-1,) + counts.shape[1:])  # (W K, ...)
        # a stage's most blocks, rounding errors counted for it (a time a hair low only lowers the bound)
        held = np.nan_to_num(np.floor((tried[:, None] - latency_s[None]) / block_s[None] + 1e-9), nan=np.inf)
        held = np.where(present[None], np.maximum(held, 0.0) * counts[None], 0.0).sum(axis=1)
    mine = np.broadcast_to(present[None], (_WINDOW,) + present.shape).reshape(tried.shape)  # a present class's
    limit = np.where(mine, tried, np.inf).reshape((_WINDOW,) + present.shape).max(axis=0)
    limit = np.where(present, limit, np.inf).min(axis=0)  # every present class's times up to it were tried
    ok = mine & (held >= layers) & (tried >= least[None]) & (tried <= limit[None])
    passed = np.where(ok, tried, np.inf).min(axis=0)
    return np.where(free, least, np.minimum(passed, limit))


def _crossed(hops: np.ndarray, pure: np.ndarray, crossing: np.ndarray, sizes: np.ndarray, replicas: np.ndarray,
             stages: int, spare: np.ndarray) -> np.ndarray:
    """``hops`` raised to 1 where some group is pure and every replica crosses between clusters of
    ``sizes`` all the same (module description): no cluster holds ``D + S - 1`` devices, or the
    second largest has more used devices than ``crossing`` groups' cells and the spare devices hold."""
    ordered = np.sort(np.asarray(sizes))[::-1]
    largest, second = int(ordered[0]), int(ordered[1]) if ordered.size > 1 else 0
    outside = (replicas + stages - 1 > largest) | (crossing * (replicas - 1) + spare < second)
    return np.where((pure >= 1) & outside, np.maximum(hops, 1), hops)


def nested_crossing_s(coarse, coarse_counts, fine, fine_counts, *, stages: int, layers: int, replicas: np.ndarray,
                      devices: int, round_trips, boundary_s: float, latency_s: float, sequence_bytes: float,
                      block_s: np.ndarray, block_sync_bytes: float, fast_rate: np.ndarray, ring_only: bool,
                      sharded: bool, sync_every: int, pure_tau_bytes_per_s=math.inf,
                      pure_latency_s=0.0) -> np.ndarray:
    """(D,) the bound of the module description for plans of ``stages`` (S >= 2) stages, ``replicas``
    (D = 1 .. len) replicas on ``devices`` (N) devices, at the clusterings ``coarse`` and ``fine``
    (``cluster_bound.ClusterLevel``s, ``coarse``'s threshold the lower) with their
    ``slow_crossings.GroupCounts``; the other arguments as ``slow_crossings.slow_crossing_s``'s."""
    D = np.asarray(replicas)
    rows = D - 1
    spare = devices - stages * D
    x = np.arange(stages + 1)
    xf, xc = np.meshgrid(x, x, indexing="ij")
    keep = xc <= xf
    xf, xc = xf[keep][:, None], xc[keep][:, None]  # (P, 1) every pair a plan may have

    def allowed(counts, crossing):  # (P, D) the pure groups fit (none crossing) or the fewest crossing do
        none = counts.total[rows][None, :] >= stages
        return np.where(crossing == 0, none, crossing >= fewest_crossing_groups(stages, counts.kept[rows])[None, :])

    ok = allowed(fine_counts, xf) & allowed(coarse_counts, xc)
    some = ok.any(axis=1)  # only the pairs some D allows
    xf, xc, ok = xf[some], xc[some], ok[some]
    vf = _pure_hops(fine_counts.cumulative[rows], np.broadcast_to(stages - xf, ok.shape))
    vc = _pure_hops(coarse_counts.cumulative[rows], np.broadcast_to(stages - xc, ok.shape))
    vf = _crossed(vf, stages - xf, xf, fine.cluster_sizes, D, stages, spare)
    vc = _crossed(vc, stages - xc, xc, coarse.cluster_sizes, D, stages, spare)
    vf = np.maximum(vf, vc)
    share = 2.0 * (D - 1) / D if ring_only else np.ones(D.shape)
    if sharded:
        share = np.minimum(share, 2.0 / D)
    fast_s = np.maximum(block_sync_bytes * fast_rate, block_sync_bytes * share / pure_tau_bytes_per_s)
    fine_s = np.maximum(block_sync_bytes * share / fine.tau_bytes_per_s, fast_s)
    coarse_s = np.maximum(block_sync_bytes * share / coarse.tau_bytes_per_s, fine_s)
    steps = 2.0 * (D - 1) if ring_only and sync_every == 1 else np.zeros(D.shape)
    fast_latency = np.maximum(latency_s, pure_latency_s)  # every ring's hops: the longest counts
    fine_latency = np.maximum(fast_latency, fine.latency_s)
    latencies = steps * np.stack([np.maximum(fine_latency, coarse.latency_s), fine_latency, fast_latency])
    counts = np.stack(np.broadcast_arrays(xc, xf - xc, stages - xf))  # (3, P, D)
    seconds = np.stack([coarse_s, fine_s, fast_s])[:, None, :]  # (3, 1, D)
    with_compute = seconds + block_s[None, None, :]  # a stage's sync after its own blocks' compute
    deepest, widest = split_three_s(layers, counts[:, None], np.stack([seconds, with_compute], axis=1),
                                    latencies[:, None, None, :])
    extra_f = max(0.0, sequence_bytes / fine.tau_bytes_per_s - boundary_s)
    extra_c = max(extra_f, sequence_bytes / coarse.tau_bytes_per_s - boundary_s)
    lat_f = max(0.0, fine.latency_s - latency_s)
    lat_c = max(lat_f, coarse.latency_s - latency_s)
    per_b = (vc * extra_c + (vf - vc) * extra_f) / (stages - 1)
    per_l = (vc * lat_c + (vf - vc) * lat_f) / (stages - 1)
    phase_b = np.where(vc > 0, extra_c, np.where(vf > 0, extra_f, 0.0))
    phase_l = np.where(vc > 0, lat_c, np.where(vf > 0, lat_f, 0.0))
    trips = round_trips(boundary_s + per_b, latency_s + per_l, boundary_s + phase_b, latency_s + phase_l,
                        np.where(ok, deepest, 0.0))
    return np.where(ok, np.maximum(trips, widest), np.inf).min(axis=0)
