"""The lower bound's term for how fast the batch can go through replicas inside and across clusters
(``planner.search.cluster_bound``).

At a threshold of ``planner.search.link_clusters`` every cell of a plan sits inside one cluster.
Each replica of the plan either sits inside one cluster (all its cells there) or crosses between
clusters (``cluster_bound``'s notation and argument):

- a crossing replica has a stage boundary between two clusters, which each of its ``n_r``
  sequences crosses forward and back, its bytes one after another over links of at most
  ``tau_2`` both ways (``cost_models.simulator``): ``n_r / B <= T / P``, with ``P = B m / tau_2``
  the whole batch's activations over such a boundary;
- the replicas inside clusters sit in ``k`` clusters at most, ``k`` no more than their number: their
  blocks' work, ``sum n_r / B`` of the batch's ``W``, runs on those clusters' cells, so
  ``sum n_r / B <= T F_k / W``, with ``F_k`` the most FLOP/s the plan's cells reach in ``k``
  clusters (the ``k`` largest of each cluster's, and no more than every cell's together).

With ``D_in`` of the ``D`` replicas inside, the batch needs ``1 <= T (F_k / W + (D - D_in) / P)``
with ``k = min(D_in, K)``; whatever the plan chooses, ``T >= 1 / max over D_in of (F_k / W + (D -
D_in) / P)``. ``W / F_k`` is ``cluster_bound``'s ``C`` over ``k`` clusters: where clusters are few
and the links between them slow, a plan of few replicas either leaves most clusters idle or sends
its whole share over a slow link.

The maximised expression is concave and piecewise linear in ``D_in`` (the clusters' FLOP/s taken
largest first, then capped), so it is evaluated at the whole numbers next to its peak only.
"""

import numpy as np

__all__ = ["replica_throughput_s"]


def replica_throughput_s(cluster_flops: np.ndarray, multiplicity: np.ndarray, cells_flops: np.ndarray,
                         work_flops: float, replicas: np.ndarray, batch_s: float, crossing: bool) -> np.ndarray:
    """(D,) seconds: the module's bound for each replica count of ``replicas``.

    ``cluster_flops``: (K, D) the most FLOP/s the plan's cells reach inside each cluster that can hold
    a replica (0 for one that cannot); ``multiplicity``: (K,) how many clusters each row stands for
    (a row for several merged clusters dominates each of them); ``cells_flops``: (D,) the most the
    plan's cells reach together; ``work_flops``: the blocks' work ``W``; ``batch_s``: ``P``;
    ``crossing``: whether a replica may cross (False for plans of one stage, whose replicas are one
    cell each)."""
    replicas = np.asarray(replicas, dtype=float)
    if crossing and batch_s <= 0:  # a crossing replica's messages take no time: no bound from them
        return np.zeros(replicas.shape)
    per_crossing = 1.0 / batch_s if crossing else 0.0  # of the batch per second, each crossing replica
    order = np.argsort(-cluster_flops, axis=0, kind="stable")  # each column's clusters, fastest first
    values = np.take_along_axis(cluster_flops, order, axis=0)  # (K, D)
    counts = multiplicity.astype(float)[order]  # (K, D)
    starts = np.cumsum(counts, axis=0) - counts  # clusters before each run
    before = np.cumsum(values * counts, axis=0) - values * counts  # their FLOP/s
    top = np.minimum(replicas, float(multiplicity.sum()))  # D_in beyond the clusters adds none
    # The rate rises by v / W - 1 / P a cluster while the runs' FLOP/s stay under the cap, and falls
    # past it: its largest over real D_in is at the least of top, the clusters worth more than a
    # crossing replica, and where the FLOP/s reach the cap; over whole D_in at the floor or ceiling.
    worth = np.where(values / work_flops >= per_crossing, counts, 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        into = np.where(values > 0, (cells_flops[None, :] - before) / values, np.inf)
    inside_run = (before <= cells_flops[None, :]) & (cells_flops[None, :] < before + values * counts)
    reach = np.where(inside_run, starts + into, np.inf).min(axis=0)  # inf where the cap is never reached
    peak = np.minimum.reduce([top, worth, reach])
    whole = np.stack([np.floor(peak), np.minimum(np.ceil(peak), top)])  # (2, D)
    best = _rate(whole, starts, counts, values, cells_flops, work_flops, replicas, per_crossing).max(axis=0)
    with np.errstate(divide="ignore"):
        return np.where(best > 0, 1.0 / best, np.inf)


def _rate(inside, starts, counts, values, cells_flops, work_flops, replicas, per_crossing) -> np.ndarray:
    """(..., D) the share of the batch a second with ``inside`` (..., D) replicas inside clusters: the
    runs taken largest first (capped by every cell's FLOP/s) and the others crossing."""
    summed = np.zeros(inside.shape)
    for start, count, value in zip(starts, counts, values):  # (D,) each: one run per column
        summed += value * np.clip(inside - start, 0.0, count)
    return np.minimum(summed, cells_flops) / work_flops + (replicas - inside) * per_crossing
