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
- *chain* (1F1B, and ZB-H1 without its weight gradients): stage ``k`` runs ``S - k - 1`` warm-up forwards, then
  one forward and one backward (``cost_models.schedule.stage_ops``), so its forward of micro-batch
  ``i + S - k`` follows its backward of micro-batch ``i``, which follows that micro-batch's trip
  through the ``S - k - 1`` stages downstream and back: ``round_trip.round_trip_s``'s chain over the
  ``S - k`` stages from ``k``, window ``min(S - k, K)`` (``K``: an accumulation round's
  micro-batches), each sequence's trip running ``L - P_k`` blocks and the head; then ``y(l_k)``.
  1F1B of warm-up depth ``d`` (``warmup_depth``; the deepest it tries where the search picks it,
  ``round_trip.bound_depth``) runs ``d (S - k - 1)`` warm-up forwards: window ``min(d (S - k - 1) + 1, K)``.
  ZB-H1 keeps that order for its forwards and input gradients (``_zero_bubble_round``) and counts
  ``zero_bubble_share`` of the compute (``cost_models.flops.zero_bubble_trip_share``; 0 counts none),
  as ``round_trip`` does;
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
hurts downstream); a search on ``t`` gives the least (``_least_split_s``).
"""

import itertools
import math

import numpy as np

from cost_models.schedule import Schedule

__all__ = ["stage_chains_s", "placed_stage_chains_s", "clustered_stage_chains_s", "pure_groups_s", "pure_groups_fill_both",
           "fewest_open_crossings"]

_POINTS = 15  # limits tried at once in each pass: the bracket shrinks 16-fold a pass
_PASSES = 6  # passes: the bracket's width ends at 16 ** -6 ~ 6e-8 of the even split's


def stage_chains_s(*, stages: int, layers: int, busiest: np.ndarray, schedules, interleaved: bool,
                   per_round: float, micro_batch: float, layer_s: float, head_s: float, boundary_s: float,
                   latency_s: float, layer_sync_s: np.ndarray, first_sync_s: np.ndarray, last_sync_s: np.ndarray,
                   gpipe_fits=True, crossings: tuple = (0, 0.0, 0.0), odd_sync: tuple | None = None,
                   odd_wait: tuple | None = None, second_sync: tuple | None = None, seconds: int = 1,
                   zero_bubble_share: float = 0.0, warmup_depth: float = 1) -> np.ndarray:
    """(D,) seconds at least of any plan of ``stages`` (S >= 2) stages over ``layers`` blocks whose
    busiest replica runs ``busiest`` sequences (module description): ``layer_s``/``head_s`` one
    sequence's forward and backward of a block / the head on the fastest cell, ``boundary_s`` one
    sequence's message over the fastest link, ``latency_s`` the least latency, ``layer_sync_s`` a
    block's gradient sync (D,), ``first_sync_s``/``last_sync_s`` the first / last stage's extra
    parameters' (D,); ``per_round`` an accumulation round's micro-batches (inf: one round),
    ``micro_batch`` the micro-batch size where the job fixes it (inf: searched), ``gpipe_fits``
    False (or (D,) False) where GPipe's activations cannot fit, ``warmup_depth`` 1F1B's deepest.

    ``crossings``: ``(q, per sequence, per trip)``: at least ``q`` of the busiest replica's
    boundaries cross between clusters, each adding those seconds to a trip across it
    (``round_trip.crossing_extra_s``); at most ``k`` of them lie upstream of stage ``k``, so its
    chain's trips (and GPipe's gap) cross ``q - k`` of them at least. ``odd_sync``: ``(block,
    first, last)`` syncs (D,) of one stage, any, in place of the others' (a stage whose ring
    crosses a slow link): the least over which stage it is. ``odd_wait``: ``(end, middle)`` seconds
    (broadcast with ``busiest``) before which the odd stage's sync cannot start, where it is the first
    or last stage / another one (``planner.search.slow_uplinks``: the messages a slow NIC carries
    first). ``second_sync``: ``(block, first, last)`` syncs of ``seconds`` more stages, others than
    the odd one (all the least over which stages they are)."""
    busiest = np.asarray(busiest, dtype=float)
    assert second_sync is None or 1 <= seconds < stages, "the odd stage and its seconds are distinct stages"
    normal = (layer_sync_s, first_sync_s, last_sync_s)
    # one row per stage (or stage and set of ``seconds`` others) that may be the odd one(s), a single
    # row without one, then busiest's axes
    if odd_sync is None:
        firsts, others = np.array([-1]), np.zeros((1, stages), dtype=bool)
    elif second_sync is None:
        firsts, others = np.arange(stages), np.zeros((stages, stages), dtype=bool)
    else:
        rows = [(k, rest) for k in range(stages)
                for rest in itertools.combinations([j for j in range(stages) if j != k], seconds)]
        firsts = np.array([k for k, _ in rows])
        others = np.zeros((len(rows), stages), dtype=bool)
        for i, (_, rest) in enumerate(rows):
            others[i, list(rest)] = True
    shape = (firsts.size,) + busiest.shape
    which = firsts.reshape((firsts.size,) + (1,) * busiest.ndim)
    syncs = [[np.broadcast_to(np.where(which == k, odd, np.where(
        others[:, k].reshape(which.shape), second, usual)), shape)
              for odd, second, usual in zip(odd_sync or normal, second_sync or normal, normal)]
             for k in range(stages)]
    waits = None
    if odd_wait is not None:
        end, middle = odd_wait
        waits = [np.broadcast_to(np.where(which == k, end if k in (0, stages - 1) else middle, 0.0), shape)
                 for k in range(stages)]
    return _least_schedule_s(stages, layers, np.broadcast_to(busiest, shape), schedules, interleaved, per_round,
                             micro_batch, layer_s, head_s, boundary_s, latency_s, syncs, gpipe_fits,
                             crossings, waits, zero_bubble_share=zero_bubble_share,
                             warmup_depth=warmup_depth).min(axis=0)


def placed_stage_chains_s(*, syncs: list, downstream: tuple, stages: int, layers: int, busiest: np.ndarray, schedules,
                          interleaved: bool, per_round: float, micro_batch: float, layer_s: float, head_s: float,
                          boundary_s: float, latency_s: float, gpipe_fits=True,
                          zero_bubble_share: float = 0.0, warmup_depth: float = 1) -> np.ndarray:
    """``stage_chains_s`` of plans whose stages' syncs and crossings are known stage by stage:
    ``syncs[k]`` stage ``k``'s (block, first, last) sync seconds, ``downstream`` ``(per sequence,
    per trip)``, each a list of what the busiest replica's boundaries downstream of stage ``k`` add
    to a trip over them (``round_trip.crossing_extra_s``'s two parts, summed), in place of
    ``crossings``; every value broadcast with ``busiest``, over which the answer runs."""
    busiest = np.asarray(busiest, dtype=float)
    syncs = [tuple(np.broadcast_to(y, busiest.shape) for y in stage) for stage in syncs]
    return _least_schedule_s(stages, layers, busiest, schedules, interleaved, per_round, micro_batch, layer_s, head_s,
                             boundary_s, latency_s, syncs, gpipe_fits, (0, 0.0, 0.0), downstream=downstream,
                             zero_bubble_share=zero_bubble_share, warmup_depth=warmup_depth)


def _least_schedule_s(stages, layers, busiest, schedules, interleaved, per_round, micro_batch, layer_s, head_s,
                      boundary_s, latency_s, syncs, gpipe_fits, crossings, waits=None, downstream=None,
                      zero_bubble_share: float = 0.0, warmup_depth: float = 1) -> np.ndarray:
    """``stage_chains_s`` with stage ``k``'s syncs ``syncs[k]`` (block, first, last), (D,) each, and
    (``waits``) its sync starting after ``waits[k]`` seconds at least; ``downstream``: what stage
    ``k``'s chain crosses, ``placed_stage_chains_s``'s, in place of ``crossings``'."""
    shape = busiest.shape
    fixed = math.isfinite(micro_batch)
    fewest = micro_batch if fixed else 1.0  # the fewest sequences in a micro-batch
    most = np.minimum(micro_batch, busiest)  # the most sequences in a micro-batch
    arrival = fewest * boundary_s + latency_s
    crossed, per_sequence, per_trip = crossings
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
            block_sync, first_sync, last_sync = syncs[k]
            base = k * arrival + (first_sync if k == 0 else 0.0) + (last_sync if last else 0.0)
            head = head_s if last else 0.0
            terms = [(base + busiest * head, busiest * layer_s + block_sync)]  # the work
            if waits is not None:  # the sync after what must pass first
                terms.append((waits[k] + (first_sync if k == 0 else 0.0) + (last_sync if last else 0.0), block_sync))
            hops = stages - 1 - k
            across = max(0, crossed - k)  # crossings downstream of stage k, at least
            if downstream is None:
                extra_sequence, extra_trip = across * per_sequence, across * per_trip
            else:
                extra_sequence, extra_trip = downstream[0][k], downstream[1][k]
            if kind in (Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE) and hops > 0:
                window = min(warmup_depth * hops + 1, per_round)  # 1F1B's and ZB-H1's
                carried = np.maximum(1.0, busiest / window)
                trips = np.maximum(1.0, np.ceil(np.ceil(busiest / most) / window))
                if fixed:
                    carried = np.maximum(carried, np.ceil(np.ceil(busiest / micro_batch) / window) * micro_batch)
                compute = ((layers - upstream) * layer_s + head_s) * (zero_bubble_share if kind == Schedule.ZERO_BUBBLE
                                                                      else 1.0)
                terms.append((base + carried * (compute + 2 * hops * boundary_s + extra_sequence)
                              + trips * (2 * hops * latency_s + extra_trip), block_sync))
            if kind == "gpipe" and hops > 0:
                gap = (fewest * ((layers - upstream) * layer_s + head_s) + 2 * hops * arrival
                       + fewest * extra_sequence + extra_trip)
                terms.append((base + gap, busiest * layer_s + block_sync - fewest * layer_s))
                terms.append((base + 2.0 * busiest * boundary_s + 2.0 * latency_s, block_sync))
            return terms

        value = _least_split_s(stages, layers, stage_terms, shape)
        if kind == "gpipe":
            value = np.where(gpipe_fits, value, np.inf)
        least = np.minimum(least, value)
    return least


def _least_split_s(stages: int, layers: int, stage_terms, shape) -> np.ndarray:
    """(D,) the least, over splits of ``layers`` blocks into ``stages`` stages of one block at least,
    of the largest ``a + b l_k`` over stages ``k`` and ``stage_terms(k, P_k)``'s terms (each ``b >= 0``,
    each ``a`` not growing with ``P_k``), from below: the search's lower end, a limit no split
    keeps to (or 0), within ``16 ** -_PASSES`` of the even split's largest term."""
    low = np.zeros(shape)
    high = _even_split_s(stages, layers, stage_terms, np.ones(shape))
    steps = (np.arange(1, _POINTS + 1) / (_POINTS + 1)).reshape((_POINTS,) + (1,) * len(shape))
    for _ in range(_PASSES):  # a search over _POINTS limits at once: whether a split fits grows with the limit
        limits = low + steps * (high - low)
        fits = _fits(stages, layers, stage_terms, limits)
        high = np.minimum(high, np.where(fits, limits, np.inf).min(axis=0))
        low = np.maximum(low, np.where(~fits & (limits < high), limits, -np.inf).max(axis=0))
    return low


def _even_split_s(stages, layers, stage_terms, ones) -> np.ndarray:
    """The largest stage term of the split of ``layers`` into ``stages`` as even as can be: one
    split's, so at least the least (the search's upper end)."""
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
            positive = b > 0
            allowed = np.floor(np.divide(limit - a, b, out=np.zeros(limit.shape), where=positive))
            most = np.minimum(most, np.where(positive, allowed, np.where(a <= limit, np.inf, -np.inf)))
        ok &= most >= 1
        upstream = upstream + np.clip(most, 1, None)
    rest = layers - upstream
    ok &= rest >= 1
    for a, b in stage_terms(stages - 1, upstream):
        ok &= a + b * rest <= limit
    return ok


def pure_groups_fill_both(cluster_sizes: np.ndarray, stages: int, replicas: int, groups: str) -> bool:
    """Between two clusters of ``cluster_sizes`` devices, whether a plan of ``stages`` stage groups
    of ``replicas`` cells, ``x`` of them spanning both clusters (a cell of each in each at least),
    has pure groups in both, for ``x = 1`` (``groups`` "one") or every ``x >= 2`` a plan may have
    ("many"): the ``S - x`` pure groups outnumber the ``floor((c_j - x) / D)`` one cluster holds."""
    counts = [1] if groups == "one" else range(2, stages + 1)
    for x in counts:
        if x > int(cluster_sizes.min()):
            continue  # no plan has that many crossing groups
        if stages - x <= int(((cluster_sizes - x) // replicas).max()):
            return False
    return True


def fewest_open_crossings(cluster_sizes: np.ndarray, stages: int, replicas: int) -> int:
    """Between two clusters of ``cluster_sizes`` devices, the fewest ``x >= 2`` stage groups of
    ``replicas`` cells spanning both (a cell of each in each, so ``x`` at most the smaller cluster's
    devices, and at most ``stages``) whose ``S - x`` pure groups fit in one cluster
    (``pure_groups_fill_both``'s converse); 0 where no such ``x`` exists."""
    for x in range(2, min(stages, int(cluster_sizes.min())) + 1):
        if stages - x <= int(((cluster_sizes - x) // replicas).max()):
            return x
    return 0


def clustered_stage_chains_s(level, *, replicas: np.ndarray, ring_only: bool, share: np.ndarray,
                             block_sync_bytes: float, first_sync_bytes: float, last_sync_bytes: float,
                             crossing_extra, ring_bytes_per_s: np.ndarray, **chains) -> np.ndarray:
    """(D,) ``stage_chains_s`` of plans of ``replicas`` (D,) replicas that cannot fit in one cluster
    of ``level`` (``planner.search.cluster_bound.ClusterLevel``; 0 where they can): every cell (one
    device or a tensor group, inside a host) sits in one cluster, so either some stage's group of
    ``D >= 2`` cells spans two clusters, and its ring (``ring_only``: the only sync allowed) crosses
    between them over a link of at most ``slower_way`` (``tau``, or between exactly two clusters the
    slower direction's fastest; and no faster than ``ring_bytes_per_s``, (D,), the others' ring): that
    stage's syncs run ``share`` (``2 (D - 1) / D``) of its bytes (``*_sync_bytes``) at that rate
    (``odd_sync``, the least over which stage; without ``ring_only`` this case counts 0), while each
    replica's cells still visit ``ceil(S / c)`` clusters (``crossing_extra(fewest=0)``); between exactly
    two clusters, every spanning group holds cells of both, so either one group spans, or two or more
    (a second stage syncing as slowly), and where the other, pure groups cannot all fit in one cluster
    they fill both and each replica crosses between them (``pure_groups_fill_both``); where that holds
    for 2 .. x - 1 spanning groups but not for ``x`` (``fewest_open_crossings``), the plans of ``x`` or
    more spanning groups have ``x`` stages syncing that slowly (each spanning group's ring crosses, the
    stage chains' ``seconds``: the more slow stages, the longer the largest stage's term can only be),
    the others cross as above; or every group sits
    in one cluster, which holds ``floor(c / D)`` of them at most, so the ``S`` groups fill at least
    ``n`` clusters and each replica's path visits them all: ``n - 1`` of its boundaries cross at
    least (``crossings``, priced by ``crossing_extra(fewest=n - 1)``, ``round_trip.crossing_extra_s``).
    The least of the two cases. ``chains``: ``stage_chains_s``'s other arguments."""
    stages = chains["stages"]
    replicas = np.asarray(replicas)
    spans = stages * replicas > int(level.cluster_sizes.max())
    least = np.zeros(replicas.shape)
    if not spans.any():
        return least
    crossing = np.zeros(replicas.shape)
    if ring_only:
        rate = share / np.minimum(level.slower_way_bytes_per_s, ring_bytes_per_s)  # s per byte
        odd = (block_sync_bytes * rate, first_sync_bytes * rate, last_sync_bytes * rate)
        spread = crossing_extra(fewest=0)
        crossing = stage_chains_s(**chains, odd_sync=odd, crossings=spread)
        one = np.array([level.cluster_sizes.size == 2 and pure_groups_fill_both(level.cluster_sizes, stages, int(d),
                                                                                  "one") for d in replicas])
        if one.any():  # two clusters: every crossing group holds cells of both; elsewhere one group may do
            keep = np.flatnonzero(one)
            at = {k: v[keep] if isinstance(v, np.ndarray) and v.shape == replicas.shape else v
                  for k, v in chains.items()}
            odd_at = tuple(y[keep] for y in odd)
            crossed = crossing_extra(fewest=1)
            many = np.array([pure_groups_fill_both(level.cluster_sizes, stages, int(d), "many")
                             for d in replicas[keep]])
            alone = stage_chains_s(**at, odd_sync=odd_at, crossings=crossed)
            several = stage_chains_s(**at, odd_sync=odd_at, second_sync=odd_at, crossings=spread)
            if many.any():
                several = np.where(many, stage_chains_s(**at, odd_sync=odd_at, second_sync=odd_at, crossings=crossed),
                                   several)
            opens = np.array([fewest_open_crossings(level.cluster_sizes, stages, int(d)) for d in replicas[keep]])
            if (opens > 2).any():  # 2 .. x - 1 crossing groups fill both; x or more sync slowly, x stages at least
                two_crossed = stage_chains_s(**at, odd_sync=odd_at, second_sync=odd_at, crossings=crossed)
                for count in np.unique(opens[opens > 2]):
                    wider = stage_chains_s(**at, odd_sync=odd_at, second_sync=odd_at, seconds=int(count) - 1,
                                           crossings=spread)
                    several = np.where(opens == count, np.minimum(two_crossed, wider), several)
            crossing[keep] = np.maximum(crossing[keep], np.minimum(alone, several))
        crossing = np.where(replicas >= 2, crossing, np.inf)
    pure = pure_groups_s(level.cluster_sizes, stages, replicas, spans,
                         lambda fewest: stage_chains_s(**chains, crossings=crossing_extra(fewest=fewest)))
    return np.where(spans, np.minimum(crossing, pure), 0.0)


def pure_groups_s(cluster_sizes: np.ndarray, stages: int, replicas: np.ndarray, spans: np.ndarray,
                  chain) -> np.ndarray:
    """Per replica count, where every stage group sits inside one cluster: a cluster of ``n`` devices
    holds ``n // D`` groups, so the ``S`` groups fill ``k`` clusters at least and every replica
    crosses between them ``k - 1`` times at least: ``chain(k - 1)`` (an array over the replica counts)
    where the groups fit and ``spans``, else infinite (no such plan)."""
    pure = np.full(replicas.shape, np.inf)
    capacity = np.sort(cluster_sizes)[::-1][None, :] // replicas[:, None]  # groups each cluster holds
    filled = np.cumsum(capacity, axis=1)
    holds = filled[:, -1] >= stages
    clusters = np.argmax(filled >= stages, axis=1) + 1  # the fewest clusters the groups fill
    for count in np.unique(clusters[holds & spans]):
        mask = holds & spans & (clusters == count)
        pure = np.where(mask, chain(int(count) - 1), pure)
    return pure
