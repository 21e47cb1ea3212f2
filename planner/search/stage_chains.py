"""The lower bound's term for every stage's own chain of work before its sync (``planner.search.bounds``).

``round_trip`` bounds the first stage: its chain of round trips, then its sync. Every other stage
``k`` of the busiest replica (``busiest`` sequences) has such a chain too, and a sync of its own
layers after it, so whichever way a plan splits the ``L`` blocks over its ``S`` stages
(``l_0 + ... + l_{S-1} = L``, each at least one), one stage's chain plus its sync is long. With
``P_k = l_0 + ... + l_{k-1}`` the blocks upstream of stage ``k``, each of the following holds on
stage ``k`` (``cost_models.simulator``: a receive blocks until its message arrived, a message holds
a link no faster than the fastest for its bytes and arrives a latency later, a device runs its ops
one after the other, and a stage's sync starts after the stage's last op of every replica):

- *arrival*: its first forward waits for the first micro-batch to cross the ``k`` boundaries
  upstream, ``T_k = k (m b + lambda)`` at least (``b``: one sequence's message over the fastest link,
  ``lambda``: the least latency, ``m``: the fewest sequences a micro-batch holds);
- *work* (every schedule): then it runs ``busiest`` sequences through its ``l_k`` blocks (and the head
  on the last stage) on one cell no faster than the fastest, and then syncs ``l_k`` blocks'
  gradients (and the embeddings on the first stage, the head on the last): ``T_k + busiest (l_k w +
  [k = S-1] h) + y(l_k)``;
- *chain* (1F1B, and ZB-H1 without compute): stage ``k`` runs ``S - k - 1`` warm-up forwards, then
  one forward and one backward (``cost_models.schedule.stage_ops``), so its forward of micro-batch
  ``i + S - k`` follows its backward of micro-batch ``i``, which follows that micro-batch's trip
  through the ``S - k - 1`` stages downstream and back: ``round_trip.round_trip_s``'s chain over the
  ``S - k`` stages from ``k``, window ``min(S - k, K)`` (``K``: an accumulation round's
  micro-batches), each sequence's trip running ``L - P_k`` blocks and the head; then ``y(l_k)``.
  ZB-H1 keeps that order for its forwards and input gradients (``_zero_bubble_round``) and counts
  no compute, as ``round_trip`` does;
- *GPipe* (where its activations fit): stage ``k`` runs every forward before any backward, and its
  first backward waits for the last forward's micro-batch to reach the last stage and the first
  one's gradient to come back, through ``2 (S - 1 - k)`` messages and a forward and a backward of
  the ``L - P_k - l_k`` blocks downstream (and the head) for one micro-batch each, idle in
  between: ``T_k + busiest l_k w + m ((L - P_k - l_k) w + h) + 2 (S - 1 - k)(m b + lambda) +
  y(l_k)``; and every activation crosses boundary ``k`` before any gradient crosses back
  (``round_trip.gpipe_phases_s`` on boundary ``k``): ``T_k + 2 busiest b + 2 lambda + y(l_k)``.

Interleaved plans (a device holds several pieces; the first device the embeddings, the last the
head) keep the arrival and the work. A plan's time is at least the least, over the schedules the
job allows, of the least over layer splits of the largest of its stages' terms. Each term grows
with ``l_k`` and does not grow with ``P_k``, so the split that keeps every stage below a time ``t``,
if any, is found by giving each stage in turn the most blocks it can hold (more upstream never
hurts downstream); a bisection on ``t`` gives the least (``_least_split_s``).
"""

import math

import numpy as np

from cost_models.schedule import Schedule

__all__ = ["stage_chains_s"]

_BISECTIONS = 40  # halvings of the bracket around the least largest stage term (relative width ~ 1e-12)


def stage_chains_s(*, stages: int, layers: int, busiest: np.ndarray, schedules, interleaved: bool,
                   per_round: float, micro_batch: float, layer_s: float, head_s: float, boundary_s: float,
                   latency_s: float, layer_sync_s: np.ndarray, first_sync_s: np.ndarray, last_sync_s: np.ndarray,
                   gpipe_fits=True) -> np.ndarray:
    """(D,) seconds at least of any plan of ``stages`` (S >= 2) stages over ``layers`` blocks whose
    busiest replica runs ``busiest`` sequences (module description): ``layer_s``/``head_s`` one
    sequence's forward and backward of a block / the head on the fastest cell, ``boundary_s`` one
    sequence's message over the fastest link, ``latency_s`` the least latency, ``layer_sync_s`` a
    block's gradient sync (D,), ``first_sync_s``/``last_sync_s`` the first / last stage's extra
    parameters' (D,); ``per_round`` an accumulation round's micro-batches (inf: one round),
    ``micro_batch`` the micro-batch size where the job fixes it (inf: searched), ``gpipe_fits``
    False (or (D,) False) where GPipe's activations cannot fit."""
    busiest = np.asarray(busiest, dtype=float)
    shape = busiest.shape
    fixed = math.isfinite(micro_batch)
    fewest = micro_batch if fixed else 1.0  # the fewest sequences in a micro-batch
    most = np.minimum(micro_batch, busiest)  # the most sequences in a micro-batch
    arrival = fewest * boundary_s + latency_s
    sync = [np.broadcast_to(np.asarray(layer_sync_s, dtype=float), shape)]
    extra = [np.broadcast_to(np.asarray(v, dtype=float), shape) for v in (first_sync_s, last_sync_s)]
    least = np.full(shape, np.inf)
    for schedule in schedules:
        if interleaved:
            kind = "work"
        elif schedule == Schedule.GPIPE:
            kind = "gpipe"
        elif schedule in (Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE):
            kind = schedule
        else:
            kind = "work"

        def stage_terms(k, upstream, kind=kind):
            """[(intercept (D,), slope (D,))]: stage ``k``'s terms as ``a + b l_k`` given ``upstream``
            (D,) blocks before it."""
            last = k == stages - 1
            base = k * arrival + (extra[0] if k == 0 else 0.0) + (extra[1] if last else 0.0)
            head = head_s if last else 0.0
            terms = [(base + busiest * head, busiest * layer_s + sync[0])]  # the work
            hops = stages - 1 - k
            if kind in (Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE) and hops > 0:
                window = min(stages - k, per_round)
                carried = np.maximum(1.0, busiest / window)
                trips = np.maximum(1.0, np.ceil(np.ceil(busiest / most) / window))
                if fixed:
                    carried = np.maximum(carried, np.ceil(np.ceil(busiest / micro_batch) / window) * micro_batch)
                compute = 0.0 if kind == Schedule.ZERO_BUBBLE else (layers - upstream) * layer_s + head_s
                terms.append((base + carried * (compute + 2 * hops * boundary_s) + trips * 2 * hops * latency_s,
                              sync[0]))
            if kind == "gpipe" and hops > 0:
                gap = fewest * ((layers - upstream) * layer_s + head_s) + 2 * hops * arrival
                terms.append((base + gap, busiest * layer_s + sync[0] - fewest * layer_s))
                terms.append((base + 2.0 * busiest * boundary_s + 2.0 * latency_s, sync[0]))
            return terms

        value = _least_split_s(stages, layers, stage_terms, shape)
        if kind == "gpipe":
            value = np.where(gpipe_fits, value, np.inf)
        least = np.minimum(least, value)
    return least


def _least_split_s(stages: int, layers: int, stage_terms, shape) -> np.ndarray:
    """(D,) the least, over splits of ``layers`` blocks into ``stages`` stages of one block at least,
    of the largest ``a + b l_k`` over stages ``k`` and ``stage_terms(k, P_k)``'s terms (each ``b >= 0``,
    each ``a`` not growing with ``P_k``), from below: the bisection's lower end, a limit no split
    keeps to (or 0)."""
    low = np.zeros(shape)
    high = _even_split_s(stages, layers, stage_terms, np.ones(shape))
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        fits = _fits(stages, layers, stage_terms, middle)
        high = np.where(fits, middle, high)
        low = np.where(fits, low, middle)
    return low


def _even_split_s(stages, layers, stage_terms, ones) -> np.ndarray:
    """The largest stage term of the split of ``layers`` into ``stages`` as even as can be: one
    split's, so at least the least (the bisection's upper end)."""
    sizes = [layers // stages + (1 if k < layers % stages else 0) for k in range(stages)]
    largest, upstream = np.zeros_like(ones), 0
    for k, size in enumerate(sizes):
        for a, b in stage_terms(k, upstream * ones):
            largest = np.maximum(largest, a + b * size)
        upstream += size
    return largest


def _fits(stages, layers, stage_terms, limit) -> np.ndarray:
    """(D,) whether some split keeps every stage's terms at most ``limit``: each stage but the last
    takes the most blocks its terms allow (leaving one for each later stage), the last the rest."""
    upstream = np.zeros_like(limit)
    ok = np.ones(limit.shape, dtype=bool)
    for k in range(stages - 1):
        room = layers - upstream - (stages - 1 - k)
        most = room.copy()
        for a, b in stage_terms(k, upstream):
            with np.errstate(divide="ignore", invalid="ignore"):
                allowed = np.where(b > 0, np.floor((limit - a) / np.where(b > 0, b, 1.0)),
                                   np.where(a <= limit, np.inf, -np.inf))
            most = np.minimum(most, allowed)
        ok &= most >= 1
        upstream = upstream + np.clip(most, 1, None)
    rest = layers - upstream
    ok &= rest >= 1
    for a, b in stage_terms(stages - 1, upstream):
        ok &= a + b * rest <= limit
    return ok
