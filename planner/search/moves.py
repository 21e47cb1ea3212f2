"""Structural moves on a placement (an ``(R, S)`` array of device indices, rows the pipelines).

Single swaps change one cell; where the estimate is made of maxima and bottlenecks a single swap
rarely changes it, and the search converges on them. These moves change a placement's structure:

- ``stage-swap``: two stage groups (columns) trade places along every pipeline;
- ``stage-move``: one stage group leaves its depth for another, the groups between shifting by one;
- ``reverse``: every pipeline runs the other way (the links' directions differ where they are
  asymmetric, and the last stage holds the head);
- ``stage-out``: a stage group leaves for idle devices, those of one cluster where it can;
- ``cluster-swap``: the devices a plan uses in one cluster leave for the idle devices of another;
- ``drop-replica`` / ``add-replica``: one pipeline leaves, or one of idle devices joins (one cluster
  where it can);
- ``drop-stage`` / ``add-stage``: the pipeline depth changes in place: a stage group leaves, or a
  stage group of idle devices joins at some depth;
- ``split-replicas`` / ``merge-replicas``: every pipeline cut into two halves, or pairs of pipelines
  joined end to end.

Layers and micro-batches are re-balanced by the evaluation that follows a move
(``evaluate_placement``). Clusters come from the bandwidth graph
(``planner.search.locality.bandwidth_clusters``). Each move returns a new array, or None where it
does not apply (too few idle devices, a pinned degree, a depth beyond the layers); its random
choices come from ``rng`` only.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Neighbourhood", "STRUCTURAL_MOVES", "RESHAPING", "WEIGHTS", "structural_move"]


@dataclass(frozen=True, kw_only=True)
class Neighbourhood:
    """What the structural moves may do: the device clusters they act on, whether the degrees are
    pinned, and the deepest pipeline (the model's layers) and most pipelines (micro-batches)."""

    levels: list = field(default_factory=list)  # cluster labels per device, one array per level
    stages_pinned: bool = False
    replicas_pinned: bool = False
    max_stages: int = 1
    max_replicas: int = 1


def _idle(assign: np.ndarray, n: int) -> np.ndarray:
    used = np.zeros(n, dtype=bool)
    used[assign.ravel()] = True
    return np.flatnonzero(~used)


def _idle_group(idle: np.ndarray, count: int, hood: Neighbourhood, rng) -> np.ndarray | None:
    """``count`` idle devices, all of one cluster of a random level when some cluster has that many
    idle (a random such cluster), else at random; None when fewer are idle."""
    if len(idle) < count:
        return None
    if hood.levels:
        labels = hood.levels[int(rng.integers(len(hood.levels)))][idle]
        roomy = [c for c in np.unique(labels) if (labels == c).sum() >= count]
        if roomy:
            members = idle[labels == roomy[int(rng.integers(len(roomy)))]]
            return rng.permutation(members)[:count]
    return rng.permutation(idle)[:count]


def _stage_swap(assign, n, hood, rng):
    S = assign.shape[1]
    if S < 2:
        return None
    a, b = (int(x) for x in rng.choice(S, size=2, replace=False))
    out = assign.copy()
    out[:, [a, b]] = assign[:, [b, a]]
    return out


def _stage_move(assign, n, hood, rng):
    S = assign.shape[1]
    if S < 3:
        return None  # with two stages a move is a swap
    a, b = (int(x) for x in rng.choice(S, size=2, replace=False))
    return np.insert(np.delete(assign, a, axis=1), b, assign[:, a], axis=1)


def _reverse(assign, n, hood, rng):
    return None if assign.shape[1] < 2 else assign[:, ::-1].copy()


def _stage_out(assign, n, hood, rng):
    R, S = assign.shape
    group = _idle_group(_idle(assign, n), R, hood, rng)
    if group is None:
        return None
    out = assign.copy()
    out[:, int(rng.integers(S))] = group
    return out


def _cluster_swap(assign, n, hood, rng):
    if not hood.levels:
        return None
    labels = hood.levels[int(rng.integers(len(hood.levels)))]
    idle = _idle(assign, n)
    used_clusters = np.unique(labels[assign.ravel()])
    idle_clusters = np.unique(labels[idle])
    if not len(idle_clusters):
        return None
    a = int(used_clusters[int(rng.integers(len(used_clusters)))])
    b = int(idle_clusters[int(rng.integers(len(idle_clusters)))])
    cells = np.argwhere(labels[assign] == a)
    arrivals = rng.permutation(idle[labels[idle] == b])
    k = min(len(cells), len(arrivals))
    out = assign.copy()
    for (r, s), d in zip(cells[rng.permutation(len(cells))[:k]], arrivals[:k]):
        out[r, s] = d
    return out


def _drop_replica(assign, n, hood, rng):
    R = assign.shape[0]
    if R < 2 or hood.replicas_pinned:
        return None
    return np.delete(assign, int(rng.integers(R)), axis=0)


def _add_replica(assign, n, hood, rng):
    R, S = assign.shape
    if R >= hood.max_replicas or hood.replicas_pinned:
        return None
    row = _idle_group(_idle(assign, n), S, hood, rng)
    return None if row is None else np.vstack([assign, row[None, :]])


def _drop_stage(assign, n, hood, rng):
    S = assign.shape[1]
    if S < 2 or hood.stages_pinned:
        return None
    return np.delete(assign, int(rng.integers(S)), axis=1)


def _add_stage(assign, n, hood, rng):
    R, S = assign.shape
    if S >= hood.max_stages or hood.stages_pinned:
        return None
    column = _idle_group(_idle(assign, n), R, hood, rng)
    return None if column is None else np.insert(assign, int(rng.integers(S + 1)), column, axis=1)


def _split_replicas(assign, n, hood, rng):
    R, S = assign.shape
    if S < 2 or S % 2 or R * 2 > hood.max_replicas or hood.stages_pinned or hood.replicas_pinned:
        return None
    half = S // 2
    return np.vstack([assign[:, :half], assign[:, half:]])


def _merge_replicas(assign, n, hood, rng):
    R, S = assign.shape
    if R < 2 or R % 2 or S * 2 > hood.max_stages or hood.stages_pinned or hood.replicas_pinned:
        return None
    order = rng.permutation(R)
    return np.hstack([assign[order[:R // 2]], assign[order[R // 2:]]])


STRUCTURAL_MOVES = {"stage-swap": _stage_swap, "stage-move": _stage_move, "reverse": _reverse, "stage-out": _stage_out, "cluster-swap": _cluster_swap,
                    "drop-replica": _drop_replica, "add-replica": _add_replica, "drop-stage": _drop_stage,
                    "add-stage": _add_stage, "split-replicas": _split_replicas, "merge-replicas": _merge_replicas}
WEIGHTS = {"stage-swap": 3.0, "stage-move": 2.0}  # drawn this many times as often as the others (stage order)
RESHAPING = ("drop-replica", "add-replica", "drop-stage", "add-stage", "split-replicas", "merge-replicas")


def structural_move(assign: np.ndarray, n: int, hood: Neighbourhood, rng, name: str | None = None):
    """(move name, new placement) of one structural move, ``name`` or one drawn at random among those
    that apply to ``assign`` on ``n`` devices; (None, None) when none applies."""
    every = tuple(STRUCTURAL_MOVES)
    weights = np.array([WEIGHTS.get(move, 1.0) for move in every])
    names = [name] if name is not None else [every[int(i)] for i in rng.choice(len(every), size=len(every),
                                                                               replace=False, p=weights / weights.sum())]
    for move in names:
        out = STRUCTURAL_MOVES[move](assign, n, hood, rng)
        if out is not None and not (out.shape == assign.shape and np.array_equal(out, assign)):
            return move, out
    return None, None
