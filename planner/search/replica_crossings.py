"""The lower bound's term for replicas that cross slow links unevenly (``planner.search.bounds``).

At a threshold ``tau`` of ``planner.search.link_clusters``, every cell of a plan (a device, or a
tensor group on one host) sits inside one cluster. Along a replica's pipeline of S cells, a *run* is
a longest stretch of consecutive stages inside one cluster; a replica of ``k`` runs crosses between
clusters ``c = k - 1`` times each way on every round trip. Replicas need not cross alike: where small
clusters (standalone devices) sit beside larger ones (hosts), a plan gives the replicas that fit in
few clusters more of the batch, and the others fewer sequences; ``round_trip``'s and
``slow_crossings``' terms price the busiest replica at the fewest crossings any replica may have,
so they miss that the batch must still go somewhere. This term prices every replica at its own
crossings and the batch split between them:

- Runs. A cluster of ``n`` devices holds runs of at most S cells each and ``n`` cells together, so
  ``m`` runs anywhere cover at most ``Top(m)`` cells, the ``m`` largest of the *pieces*: every
  cluster cut into ``floor(n / S)`` pieces of S and one of ``n mod S`` (each run added to a cluster
  adds S cells at most, and never past ``n``: gains that only shrink, so greedy is best). The ``i``
  replicas with the fewest runs cover ``i S`` cells, so their runs add up to at least
  ``m_i = min{m : Top(m) >= i S}`` (``fewest_runs``).
- One replica. A replica of ``b`` sequences and ``c`` crossings takes at least ``a(c) b + y(c)``
  under each of these (the plan takes at least the largest):
  - under a chained schedule (1F1B, ZB-H1: window ``w``), its first stage chains ``b / w``
    sequences' round trips at least (``round_trip.round_trip_s`` with ``busiest = b``), each sequence
    running every stage's forward and backward (``zero_bubble_share`` of them under ZB-H1,
    ``cost_models.flops.zero_bubble_trip_share``), crossing ``2 (S - 1)``
    boundaries at the fastest link and, ``c`` of them each way, paying a crossing's extra
    (``round_trip.crossing_extra_s``; per trip, its latencies, at least ``b / (m w)`` trips of ``m``
    sequences at most); then the first stage syncs (after every replica's last backward there), and
    every stage's last backward comes after all but the chain's last trip, so the largest stage
    (``params / S``, ``ceil(L / S)`` blocks, the first stage's, the most of them) syncs after the
    chain less one trip (a trip of ``m`` sequences crossing ``S - 1`` times at most, on one device a
    cell: no shorter than any replica's);
  - under GPipe, every activation of a round crosses a boundary before any gradient comes back over
    it (``round_trip.gpipe_phases_s``), at a crossing one where ``c >= 1``; in one round every
    forward crossed every boundary (over ``tau`` where ``c >= 1``) before any stage's last backward,
    so before the largest stage's sync;
  - under any schedule, the replica's sequences run through its heaviest stage
    (``bounds._heaviest_stage_flops``) and through its deepest (``ceil(L / S)`` blocks), which then
    syncs, each on one cell.
  A stage's sync is a crossing group's (``slow_crossings``: its share over ``tau``) where the D cells
  cannot sit in one cluster (D above the largest), a pure one's otherwise (``bounds``' ``ring``). A
  replica's cells are single devices at most the fastest's speed, but for the spare devices'
  tensor groups (``tensor_speedups``; below).
- The split. In time T a replica of ``k = c + 1`` runs serves at most ``phi(k) = max(0, min_j (T -
  y_j) / a_j)`` sequences, and the replicas serve ``B`` together. The chain's ``phi`` is decreasing
  and convex in ``k`` (``(T - y) / (alpha + beta (k - 1))``), GPipe's takes two values (``c = 0``
  and ``c >= 1``, the first the larger; the other forms do not depend on ``k``): convex on the whole
  numbers too. Any plan's runs, sorted, have prefix sums ``P_t`` at least ``m_t``, convex through 0
  (sorted increments), so ``P_t >= t max_{s <= t} m_s / s`` and, whole, at least its ceiling
  ``M_t``. The increments ``k*_t = M_t - M_{t - 1}`` (at least 1) add up to exactly ``M_t``: the sum
  of the ``t`` fewest of a plan's runs is at least that of ``k*``'s for every ``t`` (weak
  supermajorisation), so ``sum phi(k) <= sum phi(k*)`` (Marshall, Olkin & Arnold, *Inequalities:
  Theory of Majorization*, 2011, 3.A.8: for every decreasing convex ``phi``). The chain's bound
  alone, and GPipe's forms together, each give such a ``phi``; the heaviest and deepest stages'
  (the same for every ``k``) cap GPipe's, and give a bound of their own under any schedule.
- Tensor groups. A plan of D replicas leaves ``E = N - S D`` devices beyond one a cell: at most
  ``min(E, D)`` replicas hold a group, of at most ``1 + E`` devices, and a group of ``t`` takes
  ``t - 1`` of them. A replica with groups serves at most as many as one whose every cell runs at
  its largest group's speedup: its gain over the same replica without is at most that of ``1 + E``
  devices (at most the ``i``-th of the ``k*`` order's gain at the most replicas that may have ``k``
  runs or fewer: ``i`` of them add up to at least ``M_i``), and at most ``E`` times the most any
  group gains per device it takes (at the fewest runs); the least of both is added. Under a chained
  schedule the groups also add at most a cell's gain each, not a replica's
  (``planner.search.cell_gains``: ``T rho E / (w a)`` sequences in all): the larger of both times.
- End groups. Given where the first and last stage groups sit (``ends``, ``planner.search.end_groups``):
  a crossing one's sync over ``tau``, the first's after the chain, the last's after all but its last
  trip; pure ones raise the least runs' sums the profile ``k*`` is built from.

A plan of time T has ``B <= sum phi(k*)`` plus the groups' gain; the least such T (closed form for
the chain, ``_water_s``'s for GPipe's phases as a low end, ``_least_time_s``'s bisection otherwise)
bounds it. The plan runs one schedule: the least over the schedules the job allows.
"""

import math

import numpy as np

from cost_models.schedule import Schedule
from planner.plan.tensor import TENSOR_DEGREES
from planner.search.cell_gains import grouped_sequences_per_s, least_chained_time_s
from planner.search.end_groups import Placement, end_counts
from planner.search.round_trip import crossing_extra_s, schedule_windows
from planner.search.tensor_cells import gain_per_spare_device

__all__ = ["fewest_runs", "replica_crossings_s"]

_BISECTIONS = 16  # halvings of the time searched (a lower end is returned: fewer only loosen it)


def fewest_runs(cluster_sizes: np.ndarray, stages: int, most: int) -> np.ndarray:
    """(most,) ``m_i`` for ``i = 1 .. most``: the fewest runs (stretches of a replica's consecutive
    stages inside one cluster) ``i`` replicas of ``stages`` cells each add up to, where clusters hold
    ``cluster_sizes`` devices (module description; ``inf`` where the clusters cannot hold them)."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    whole = sizes // stages
    pieces = np.concatenate([np.repeat(np.full(sizes.size, stages), whole), (sizes % stages)[sizes % stages > 0]])
    top = np.cumsum(np.sort(pieces)[::-1])  # top[m - 1]: the most cells m runs cover
    needed = stages * np.arange(1, most + 1)
    runs = np.searchsorted(top, needed, side="left") + 1.0
    return np.where(needed <= top[-1], runs, np.inf)


def _least_time_s(rate, total: float, low: np.ndarray, high: np.ndarray, iterations: int = _BISECTIONS) -> np.ndarray:
    """(D,) a T below which ``rate(T)`` (D,), non-decreasing in T, stays below ``total``: the low end
    of a bisection between ``low`` (below which it is known to) and ``high`` (returning the low end
    keeps it a bound whatever the precision: every T it ruled out had ``rate(T) < total``)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        enough = rate(middle) >= total
        low, high = np.where(enough, low, middle), np.where(enough, middle, high)
    return low


def _water_s(a: np.ndarray, y: np.ndarray, weight: np.ndarray, total: float) -> np.ndarray:
    """(D,) the least T with ``sum_k w_k max(0, (T - y_k) / a_k) >= total`` over the rows of the (K, D)
    arrays: the sum is the largest of its partial sums over the rows of the ``j`` smallest ``y`` (the
    rows past T add less than nothing), so T is the least of their roots ``(total + sum w y / a) / sum
    w / a``; a row of ``a = 0`` and ``w > 0`` serves any number past its ``y``."""
    order = np.argsort(y, axis=0)
    a, y, weight = (np.take_along_axis(np.broadcast_to(v, weight.shape), order, axis=0) for v in (a, y, weight))
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(a > 0, weight / a, 0.0)
        rate = np.cumsum(inverse, axis=0)
        roots = np.where(rate > 0, (total + np.cumsum(inverse * y, axis=0)) / rate, np.inf)
    free = np.where((a <= 0) & (weight > 0), y, np.inf)
    return np.minimum(roots.min(axis=0), free.min(axis=0))


def _sequences(T: np.ndarray, forms: list) -> np.ndarray:
    """(K, D) the most sequences a replica serves in ``T`` (D,): ``max(0, min_j (T - y_j) / a_j)`` over
    the bounds ``a_j b + y_j`` of ``forms`` (each (K, D) arrays)."""
    most = np.full(np.broadcast_shapes(*[np.shape(a) for a, _ in forms]), np.inf)
    for a, y in forms:
        with np.errstate(divide="ignore", invalid="ignore"):
            most = np.minimum(most, np.where(a > 0, (T - y) / a, np.where(T > y, np.inf, 0.0)))
    return np.maximum(most, 0.0)


def replica_crossings_s(level, training, *, stages: int, replicas: np.ndarray, batch: int, devices: int,
                        sequence_s: float, heaviest_s: float, deepest_s: float, deepest_sync_bytes: float,
                        tensor_speedups: np.ndarray, boundary_s: float,
                        latency_s: float, sequence_bytes: float, most_sequences: float, first_sync_bytes: float,
                        largest_sync_bytes: float, fast_rate: np.ndarray, ring_only: bool,
                        sharded: bool, floor: np.ndarray | None = None, gpipe_fits=True,
                        spare_gain: float | None = None, ends: tuple | None = None,
                        last_sync_bytes: float = 0.0, zero_bubble_share: float = 0.0) -> np.ndarray:
    """(D,) the bound of the module description on plans of ``stages`` (S >= 2) stages and ``replicas``
    (D = 1 .. len) replicas at ``level`` (a ``cluster_bound.ClusterLevel``; its ``cluster_sizes``) of
    ``devices`` devices.

    ``sequence_s``: one sequence's forward and backward through every stage on the fastest device;
    ``heaviest_s``: through the heaviest stage (``bounds._heaviest_stage_flops``) there;
    ``deepest_s``, ``deepest_sync_bytes``: through the ``ceil(L / S)`` blocks of the deepest stage
    there, and their least sync bytes;
    ``tensor_speedups``: (t,) the most a cell of at most ``1 .. t`` devices runs faster (a tensor
    group; ``bounds._tensor_speedup``): a plan of D replicas has ``E = devices - S D`` devices beyond
    one a cell, so at most ``min(E, D)`` replicas hold a group, each at most ``1 + E`` devices, and a
    group of ``t`` takes ``t - 1`` of them: its replica's gain (over the same replica without it) is
    at most ``E`` times the most any group gains per device it takes (``_group_gain``);
    ``boundary_s``, ``latency_s``: one sequence's message over the fastest link, the least latency;
    ``sequence_bytes``: one sequence's message; ``most_sequences``: the most sequences a micro-batch
    holds (``inf`` where searched); ``first_sync_bytes``: the first stage's least sync bytes (its block
    and embeddings); ``largest_sync_bytes``: the largest stage's least; ``fast_rate``: (D,) seconds
    per sync byte of a pure group (``bounds``' ``ring``); ``ring_only``, ``sharded``: as in
    ``slow_crossings.slow_crossing_s``; ``floor``: (D,) a bound known otherwise, below which the
    term may stop short (GPipe's bisection runs only where it may end above it); ``gpipe_fits``: (D,)
    False where no GPipe plan fits (``round_trip.gpipe_fits`` of the busiest replica's ``ceil(B /
    D)`` sequences): GPipe counts nowhere else; ``spare_gain``: the most a tensor group adds per
    device it takes (``tensor_cells.gain_per_spare_device`` of ``tensor_speedups`` where None);
    ``ends``: (first, last) ``end_groups.Placement``s, the plans whose first and last stage groups sit
    so only (None: any plan); ``last_sync_bytes``: the last stage's least sync bytes (its block and
    head), counted where its group crosses."""
    D = np.asarray(replicas)
    most = int(D.max())
    runs = fewest_runs(level.cluster_sizes, stages, most)
    runs = np.where(np.isfinite(runs), runs, stages * np.arange(1, most + 1))  # no such plan: any bound holds
    # sorted runs have convex prefix sums through 0, whole numbers: at least ceil(t max_{s <= t} m_s / s)
    steps = np.arange(1, most + 1)
    prefix = np.ceil(steps * np.maximum.accumulate(runs / steps) - 1e-9)
    k = np.minimum(np.diff(np.concatenate(([0.0], prefix))), stages).astype(int)  # k*, fewest first; S at most
    count = np.cumsum(np.eye(stages)[k - 1], axis=0)[D - 1].T  # (S, D): replicas of each k* in a plan of D
    fewest = int(k.min())
    largest_cluster = int(np.max(level.cluster_sizes))
    first, last = ends if ends is not None else (None, None)
    pure_ends = (first == Placement.PURE) + (last == Placement.PURE)
    if pure_ends:  # the replicas cross more (``end_groups``)
        count = end_counts(prefix, stages, D, largest_cluster, pure_ends, count)
    groups = np.minimum(np.maximum(devices - stages * D, 0), D)  # replicas that may hold a tensor group
    # the most replicas of k runs or fewer: the i fewest add up to ceil(M_i) <= i k at least
    within = (prefix[None, :] <= np.arange(1, stages + 1)[:, None] * steps[None, :])  # (S, i)
    held = np.minimum(np.where(within, steps[None, :], 0).max(axis=1)[:, None], groups[None, :])  # (S, D)
    newly = np.diff(np.vstack([np.zeros((1, D.size)), held]), axis=0)  # (S, D) grouped replicas at each k, at most
    c = np.arange(stages, dtype=float)[:, None]  # (S, 1) crossings of k = c + 1 runs
    crossed = (c >= 1).astype(float)
    _, per_sequence_s, per_trip_s = crossing_extra_s(
        stages=2, largest=1, tau_bytes_per_s=level.tau_bytes_per_s, both_ways_bytes_per_s=level.both_ways_bytes_per_s,
        between_latency_s=level.latency_s, sequence_bytes=sequence_bytes, boundary_s=boundary_s,
        latency_s=latency_s, fewest=1)
    forward_s = np.where(c >= 1, max(boundary_s, sequence_bytes / level.tau_bytes_per_s), boundary_s)
    share = 2.0 * (D - 1) / D if ring_only else np.ones(D.shape)
    if sharded:
        share = np.minimum(share, 2.0 / D)
    every_crosses = D > largest_cluster  # no cluster holds a stage group's D cells
    slow_rate = np.maximum(share / level.tau_bytes_per_s, fast_rate)
    rate = np.where(every_crosses & (D > 1), slow_rate, fast_rate)
    first_sync_s, largest_sync_s = first_sync_bytes * rate, largest_sync_bytes * rate  # (D,)
    if first == Placement.CROSSING:
        first_sync_s = first_sync_bytes * slow_rate
    if last == Placement.CROSSING:  # it syncs after all but the chain's last trip, as the largest stage
        largest_sync_s = np.maximum(largest_sync_s, last_sync_bytes * slow_rate)
    # plans of no such end groups: any bound holds
    impossible = (every_crosses if pure_ends else np.zeros(D.shape, bool)) | (
        (D < 2) if Placement.CROSSING in (first, last) else False)
    deepest_sync_s = deepest_sync_bytes * rate
    hops = 2.0 * (stages - 1)
    spare = np.maximum(devices - stages * D, 0)
    tensor_speedups = np.asarray(tensor_speedups, dtype=float)
    rho = gain_per_spare_device(tensor_speedups) if spare_gain is None else spare_gain  # per device taken
    biggest = np.minimum(1 + spare, tensor_speedups.size)  # (D,) the most devices a cell holds
    # (taken, speedup) of each size of group a plan of D replicas may hold: its D-th entry 1 where none
    sizes = [(t - 1.0, np.where(biggest >= t, tensor_speedups[t - 1], 1.0)) for t in TENSOR_DEGREES
             if 1 < t <= tensor_speedups.size]
    plain_speedup, grouped_speedup = np.ones(D.shape), tensor_speedups[biggest - 1]

    def group_gain(gain_of):
        """(D,) the most the grouped replicas add: ``gain_of(speedup)`` (S, D) one replica's at each k."""
        envelope = np.maximum.accumulate(gain_of(grouped_speedup)[::-1], axis=0)[::-1]  # at k runs or more
        by_profile = (newly * envelope).sum(axis=0)
        if not sizes:
            return by_profile
        per_device = np.max([gain_of(speedup)[fewest - 1:].max(axis=0) / taken for taken, speedup in sizes], axis=0)
        return np.minimum(by_profile, spare * np.maximum(per_device, 0.0))

    def chain(window, compute_s, speedup):
        trip_s = (hops * latency_s + c * per_trip_s) / (most_sequences * window)
        a = (compute_s / speedup + hops * boundary_s + c * per_sequence_s) / window + trip_s
        y = first_sync_s
        if math.isfinite(most_sequences):  # the largest stage syncs after all but the chain's last trip
            last_trip = (most_sequences * (compute_s + hops * boundary_s + (stages - 1) * per_sequence_s)
                         + hops * latency_s + (stages - 1) * per_trip_s)
            y = np.maximum(y, largest_sync_s - last_trip)
        return [(a, y + 0.0 * c)]

    def phases(one_round, speedup):
        forms = [(2.0 * boundary_s + crossed * per_sequence_s + 0.0 * speedup,
                  first_sync_s + 2.0 * latency_s + crossed * per_trip_s),
                 (heaviest_s / speedup + 0.0 * c, 0.0 * first_sync_s + 0.0 * c),
                 (deepest_s / speedup + 0.0 * c, deepest_sync_s + 0.0 * c)]
        if one_round:  # every forward crossed each boundary before any stage's last backward
            forms.append((forward_s + 0.0 * speedup, largest_sync_s + 0.0 * c))
        return forms

    def chain_s(window, compute_s):  # every form shares y: the least T in closed form, y + B / rate
        (a, y), = chain(window, compute_s, plain_speedup)
        with np.errstate(divide="ignore"):
            plain_rate = 1.0 / a
            plain = (count * plain_rate).sum(axis=0)
            rate = plain + group_gain(lambda speedup: 1.0 / chain(window, compute_s, speedup)[0][0] - plain_rate)
        with np.errstate(divide="ignore", invalid="ignore"):
            whole = np.where(rate > 0, y[0] + batch / rate, np.inf)
        # per grouped cell, a cell's gain (``cell_gains``), none without compute in the chain
        grouped = grouped_sequences_per_s(rho if compute_s > 0 else 0.0, spare, window, a[fewest - 1])
        return np.maximum(whole, least_chained_time_s(batch, plain, y[0], grouped))

    def phases_s(one_round, above):
        """GPipe's bound where below ``above`` (D,), ``above`` elsewhere; where ``floor`` is at least
        GPipe's bound, any bound at most it."""
        plain = phases(one_round, plain_speedup)
        # the phases alone serve no fewer (a tensor group gains nothing there), nor the deepest stage's: a low end
        (a, y), = plain[:1]
        low = np.maximum(_water_s(a, y, count, float(batch)), widest)
        high = np.max([np.max(y) for _, y in plain]) + batch * np.max(
            [np.max(np.where(np.isfinite(a), a, 0.0)) for a, _ in plain]) + 1.0
        high = np.where(np.isfinite(above), above, high)  # served(high) >= B: one replica serves B there
        start = low if floor is None else np.maximum(low, np.minimum(floor, high))
        todo = start < high
        if not todo.any():
            return np.minimum(low, above)

        def served(T):
            base = _sequences(T, plain)  # (S, D)
            return (count * base).sum(axis=0) + group_gain(
                lambda speedup: _sequences(T, phases(one_round, speedup)) - base)

        todo &= served(start) < batch  # elsewhere GPipe's bound is at most ``start``: ``low`` will do
        if not todo.any():
            return np.minimum(low, above)
        found = _least_time_s(served, float(batch), np.where(todo, start, 0.0), np.where(todo, high, 0.0))
        return np.where(todo, np.minimum(found, above), np.minimum(low, above))

    # any schedule: the deepest stage syncs after each replica's sequences ran through it, on its cell
    with np.errstate(divide="ignore"):
        widest_rate = D / deepest_s + group_gain(
            lambda speedup: np.broadcast_to((speedup - 1.0) / deepest_s, count.shape))
        widest = np.where(widest_rate > 0, deepest_sync_s + batch / widest_rate, np.inf)
    best = np.full(D.shape, np.inf)
    windows = schedule_windows(training, stages)
    for schedule in sorted(windows, key=lambda one: one == Schedule.GPIPE):  # GPipe last
        window = windows[schedule]
        bound = np.zeros(D.shape)
        if math.isfinite(window):
            bound = chain_s(window, sequence_s * (zero_bubble_share if schedule == Schedule.ZERO_BUBBLE else 1.0))
        if schedule == Schedule.GPIPE:  # it only matters below the other schedules' least, where it fits
            if not np.any(gpipe_fits):
                continue
            bound = np.where(gpipe_fits, np.maximum(bound, phases_s(not math.isfinite(window), best)), np.inf)
        best = np.minimum(best, np.maximum(bound, widest))
    return np.where(impossible, np.inf, best)
