"""The first and the last stage's groups: pure, so the replicas leave their clusters, or crossing, so
the embeddings or the head sync over a slow link (``planner.search.replica_crossings``,
``planner.search.bounds``).

At a threshold ``tau`` of ``planner.search.link_clusters`` each end group of a plan (the D cells of
its first stage, holding the embeddings and a block at least, or of its last, the head and a block at
least) is either

- crossing: its cells sit in two clusters or more, so its ring has a hop between them, over a link of
  at most ``tau`` (``slow_crossings.every_group_crosses``' argument), and the stage's sync sends its
  share of the stage's bytes over it (D >= 2 only: one cell is in one cluster). The first stage
  syncs after every replica's last backward there (the end of the chain), the last after all but the
  chain's last trip (``replica_crossings``' largest stage); or
- pure: its D cells sit in one cluster X of ``n_X`` devices (a cell, a tensor group included, lies on
  one host), D devices of X at least. A replica whose cells all sit in one cluster (one run) has its
  first (last) cell in X, so its second (second to last) too, and no two replicas share a device: at
  most ``n_X - D <= n_max - D`` replicas have one run (``n_max`` the largest cluster). Where both are
  pure and no cluster holds 2D devices they sit in two clusters: every replica has two runs at least,
  and one of two runs (a stretch in X, then one in X') has its second cell in X or (S >= 3) its second
  to last in X': at most ``2 (n_max - D)`` replicas. Any ``i`` replicas' runs then add up to at
  least ``i + max(0, i - (n_max - D))``, or ``2 i + max(0, i - 2 (n_max - D))`` with both ends pure,
  convex in ``i`` like ``replica_crossings``' own least sums ``M_i``, so the larger of both is convex
  too and bounds the plan's sorted runs' prefix sums: ``replica_crossings``' majorisation argument
  holds with it (``end_counts``). A pure group's sync is priced as ``replica_crossings`` prices it.

Every plan has one of the four placements, so it takes at least the least of the four bounds
(``end_groups_s``). Where D cells fit in no cluster every group crosses (no end is pure); a lone
replica's groups cannot cross.
"""

import itertools
from enum import StrEnum

import numpy as np

__all__ = ["Placement", "end_counts", "end_groups_s"]


class Placement(StrEnum):
    """Where a plan's stage group sits at a clustering."""

    PURE = "pure"
    CROSSING = "crossing"


def _least_runs(steps: np.ndarray, stages: int, replicas: np.ndarray, largest: int, pure_ends: int) -> np.ndarray:
    """(D, i) the least runs ``i`` replicas add up to (``steps``: (i,) i = 1 ..) in plans of each of
    ``replicas`` (D,) replicas, by the pure end groups alone (module description)."""
    d = np.asarray(replicas, dtype=float)[:, None]
    lone = np.maximum(0.0, largest - d)  # replicas whose first (last) cell's neighbour shares its cluster
    one = steps + np.maximum(0.0, steps - lone)
    if pure_ends < 2:
        return one if pure_ends else np.broadcast_to(steps, (d.size, steps.size))
    # two pure ends sit in two clusters where no cluster holds 2 D devices
    two = 2.0 * steps if stages == 2 else 2.0 * steps + np.maximum(0.0, steps - 2.0 * lone)
    return np.where(2.0 * d > largest, two, one)


def end_counts(prefix: np.ndarray, stages: int, replicas: np.ndarray, largest: int, pure_ends: int,
               counts: np.ndarray) -> np.ndarray:
    """(S, D) how many of a plan's D replicas have ``k`` runs (rows ``k = 1 .. S``) in the profile
    ``k*`` of the least runs where ``pure_ends`` (0, 1 or 2) end groups are pure, clusters of at most
    ``largest`` devices: the increments of the larger of ``prefix`` (``replica_crossings``' least
    sums ``M_i``, i = 1 .. most) and ``_least_runs``, each at most S; ``counts`` (S, D), the profile
    without them, kept where D exceeds ``largest`` (no group is pure there)."""
    replicas = np.asarray(replicas)
    counts = np.array(counts, dtype=float)
    columns = np.flatnonzero(replicas <= largest)
    if columns.size == 0:
        return counts
    d = replicas[columns]
    most = int(d.max())
    steps = np.arange(1, most + 1, dtype=float)
    least = np.maximum(prefix[None, :most], _least_runs(steps, stages, d, largest, pure_ends))  # (D', i)
    k = np.minimum(np.diff(least, axis=1, prepend=0.0), stages).astype(int)
    inside = steps[None, :] <= d[:, None]  # the first D of each plan's replicas
    rows = np.broadcast_to(np.arange(columns.size)[:, None], k.shape)
    profile = np.zeros((stages, columns.size))
    np.add.at(profile, (k[inside] - 1, rows[inside]), 1.0)
    counts[:, columns] = profile
    return counts


def end_groups_s(term, floor: np.ndarray | None = None) -> np.ndarray:
    """(D,) the least of ``term`` (``replica_crossings_s`` with every argument but ``ends`` and
    ``floor`` given) over the four placements ``ends = (first, last)``; ``floor`` passed on (each may
    stop short below it: so may their least), and once their least so far is at most ``floor``
    everywhere the rest are not computed (the least can only be lower: it raises nothing there)."""
    least = None
    for ends in itertools.product(Placement, repeat=2):
        seconds = term(ends=ends, floor=floor)
        least = seconds if least is None else np.minimum(least, seconds)
        if floor is not None and np.all(least <= floor):
            break
    return least
