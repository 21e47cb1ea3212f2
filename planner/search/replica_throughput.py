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
largest first, then capped), so it is evaluated at the ends of its pieces only.
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
    order = np.argsort(-cluster_flops, axis=0, kind="stable")  # each column's clusters, fastest first
    values = np.take_along_axis(cluster_flops, order, axis=0)  # (K, D)
    counts = multiplicity.astype(float)[order]  # (K, D)
    ends = np.cumsum(counts, axis=0)  # the number of clusters once each run is in
    starts = ends - counts
    before = np.cumsum(values * counts, axis=0) - values * counts  # FLOP/s of the runs above each
    total = float(multiplicity.sum())
    top = np.minimum(replicas, total)  # D_in beyond the clusters adds none
    # where the running sum reaches every cell's FLOP/s (its cap), inside each run
    with np.errstate(divide="ignore", invalid="ignore"):
        into = np.where(values > 0, (cells_flops[None, :] - before) / values, np.inf)
    reach = starts + np.clip(into, 0.0, counts)
    candidates = np.concatenate([starts, ends, np.floor(reach), np.ceil(reach), np.zeros((1, replicas.size)),
                                 top[None, :]])
    inside = np.clip(candidates, 0.0, top[None, :])  # (C, D) choices of D_in

    # F_k at every candidate k: the runs taken largest first, capped by every cell's FLOP/s
    summed = np.zeros_like(inside)
    for start, count, value in zip(starts, counts, values):  # (D,) each: one run per column
        summed += value[None, :] * np.clip(inside - start[None, :], 0.0, count[None, :])
    reached = np.minimum(summed, cells_flops[None, :])
    rate = reached / work_flops  # of the batch per second
    if crossing:
        rate = rate + (replicas[None, :] - inside) / batch_s
    best = rate.max(axis=0)
    with np.errstate(divide="ignore"):
        return np.where(best > 0, 1.0 / best, np.inf)
