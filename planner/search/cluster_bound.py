"""The lower bound's term for clusters that only slow links join (``planner.search.bounds``).

At each threshold ``tau`` of ``planner.search.link_clusters``, any two devices in different
clusters are joined, both ways, by links of at most ``tau`` bytes/s and at least ``latency`` seconds
(the least latency between clusters, the software's per-message overhead included), and every cell
of a plan (a device, or a tensor group on one host) sits inside one cluster. A plan of S stages x D
replicas either sits inside one cluster, or its grid spans two clusters or more, and then some
stage group or some replica crosses between clusters: if every stage group and every replica sat
inside one cluster, the whole grid would (each stage meets each replica in a cell).

Traffic across clusters often goes both ways between them, and then the slower direction counts:
a stage boundary's activations go one way and its gradients come back over the same pair, and a
sync of two members sends its bytes each way between them, so both run no faster than ``tau_2``,
the largest least-of-both-directions of a pair in different clusters
(``link_clusters.fastest_both_ways_between``); a sync whose members sit in exactly two clusters
crosses from each to the other (a ring's cycle, the leads' ring, a server's messages out and back,
the sharded exchange's pairs), so no faster than ``tau_s``, the slower direction's fastest link
(``link_clusters.slower_way_between``; ``tau`` for three clusters or more).

Notation (``cluster_bound``): ``B`` sequences, ``L`` blocks; ``P = B m / tau_2``, the whole batch's
activations (``m`` per sequence, ``bounds._least_boundary_bytes``) over a crossing boundary;
``A = K + L p g x / tau_sync`` (``tau_sync``: ``min(tau_2, tau_s)`` for two replicas, ``tau_s``
otherwise), where ``p g`` is a block's least sync bytes
(``bounds._least_sync_bytes_per_param``), ``x`` the share of a stage's sync bytes that one member
sends over one crossing link, the least of the algorithms allowed (``2 (D - 1) / D`` for a ring,
every hop carrying that; 1 for a parameter server's and a hierarchical all-reduce's ``n``, the
leads' ring carrying ``2 (h - 1) / h >= 1`` of them; ``2 / D`` for DTFM's sharded exchange:
``cost_models.network.Network.sync_flows``),
and ``K`` the busiest replica's (at least ``ceil(B / D)`` sequences) compute of every block on one
cell at its fastest: a stage's sync starts after every replica's last backward on it (formulas.md,
Pipeline schedules), so a crossing stage of a fraction ``f`` of the blocks takes at least ``f A``,
plus ``Lambda``, the latencies of the sync's steps (``2 (D - 1)`` steps for a ring, each as slow as
its slowest hop: ``cost_models.comm.ring_allreduce_time_s``; at least 2 messages one after the other
for every other algorithm), over ``H`` with local steps. A crossing replica of a fraction ``phi`` of
the batch sends at least ``phi P`` across (forward; the gradients go back over the reverse link), and
its first micro-batch crosses there and back before its backward reaches the upstream cell: ``2``
latencies. ``C``: the blocks' work over the most FLOP/s the plan's cells reach together.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from planner.search.crossing_link import crossing_link_s
from planner.search.link_clusters import (clusters_at, fastest_both_ways_between, least_latency_between,
                                          link_thresholds, pair_latencies_between, slower_way_between)
from planner.search.replica_throughput import replica_throughput_s
from planner.search.stage_split import stage_split_s

__all__ = ["MAX_CLUSTERS", "ClusterLevel", "Crossing", "cluster_levels", "cluster_bound"]

MAX_CLUSTERS = 16  # clusters kept apart per threshold; the rest share one envelope (a weaker, valid bound)


@dataclass(frozen=True, kw_only=True, eq=False)
class ClusterLevel:
    """The clusters at one threshold: links between clusters are at most ``tau_bytes_per_s`` and at
    least ``latency_s``."""

    tau_bytes_per_s: float
    latency_s: float
    # the most bytes/s a pair of devices of different clusters passes both ways (at most tau)
    both_ways_bytes_per_s: float
    # two clusters: the slower direction's fastest link between them (at most tau); tau otherwise
    slower_way_bytes_per_s: float
    sizes: np.ndarray  # (K,) devices per cluster
    memory_bytes: np.ndarray  # (K,) each cluster's largest device memory
    speed: np.ndarray  # (K, M) FLOP/s of each cluster's k + 1 fastest devices (its total past its size)
    cluster_sizes: np.ndarray  # devices per cluster, every cluster (none merged)
    # each pair of clusters' least latency, ascending, every cluster (none merged); empty: not looked
    # up (``link_clusters.pair_latencies_between``), every pair then at least ``latency_s``
    pair_latencies_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (N,) each device's cluster
    merged: int = 1  # how many clusters the last row of sizes, memory_bytes and speed stands for

    @property
    def multiplicity(self) -> np.ndarray:
        """(K,) how many clusters each row of ``sizes``, ``memory_bytes`` and ``speed`` stands for."""
        counts = np.ones(len(self.sizes), dtype=np.int64)
        counts[-1] = self.merged
        return counts


@dataclass(frozen=True, kw_only=True)
class Crossing:
    """What crosses between clusters, for one job (module description's notation)."""

    model_sync_bytes: float  # L p g: every block's least sync bytes
    end_sync_bytes: float  # the least sync bytes of a first or last stage of a pipeline: a block and its extras
    layers: int  # L
    batch_bytes: float  # B m: the whole batch's activations at one boundary
    batch: int  # B
    sharded: bool  # DTFM's sharded exchange allowed
    ring_only: bool  # the ring is the only sync allowed
    sync_every: int  # H


def cluster_levels(topology, training) -> list:
    """The clusters at each of the network's thresholds where they are more than one: each
    cluster's size, largest memory and fastest devices' speed, and the least latency between
    clusters. Past ``MAX_CLUSTERS`` clusters, the smaller ones are replaced by one that dominates
    each of them (the largest size, memory and speed of any): a plan inside one of them is inside it."""
    network = topology.network
    flops = topology.effective_flops(training.precision)
    memory = topology.memory_bytes()
    levels, seen = [], set()
    for tau in link_thresholds(network):  # ascending: of equal clusters, the first has the slowest links
        labels = clusters_at(network, tau)
        k = int(labels.max()) + 1
        if k <= 1 or labels.tobytes() in seen:
            continue
        seen.add(labels.tobytes())
        order = np.lexsort((-flops, labels))  # by cluster, fastest first
        sizes = np.bincount(labels, minlength=k)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        rank = np.arange(labels.size) - starts[labels[order]]
        speed = np.zeros((k, int(sizes.max())))
        speed[labels[order], rank] = flops[order]
        speed = np.cumsum(speed, axis=1)  # saturates at the cluster's total past its size
        every_size, merged_count = sizes, 1
        most = np.full(k, -np.inf)
        np.maximum.at(most, labels, memory)
        if k > MAX_CLUSTERS:
            keep = np.argsort(-sizes, kind="stable")
            kept, merged = keep[:MAX_CLUSTERS - 1], keep[MAX_CLUSTERS - 1:]
            sizes = np.append(sizes[kept], sizes[merged].max())
            most = np.append(most[kept], most[merged].max())
            speed = np.vstack([speed[kept], speed[merged].max(axis=0)])
            merged_count = len(merged)
        both_ways = min(float(tau), fastest_both_ways_between(network, labels))
        levels.append(ClusterLevel(tau_bytes_per_s=float(tau), latency_s=least_latency_between(network, labels),
                                   both_ways_bytes_per_s=both_ways,
                                   slower_way_bytes_per_s=min(float(tau), slower_way_between(network, labels)),
                                   sizes=sizes, memory_bytes=most, speed=speed, cluster_sizes=every_size,
                                   pair_latencies_s=pair_latencies_between(network, labels), labels=labels,
                                   merged=merged_count))
    return levels


def cluster_bound(level: ClusterLevel, crossing: Crossing, stages: int, replicas: np.ndarray, used: np.ndarray,
                  speedup: float, cells_flops: np.ndarray, work_flops: float, block_flops: float,
                  busiest_s: np.ndarray, state_bytes: float, inside_sync_s: np.ndarray = None,
                  crossing_trip_s: np.ndarray = None, reordering: bool = True, parts: dict | None = None) -> np.ndarray:
    """A bound, per replica count ``replicas`` (D), on plans of ``stages`` (S) stages from the
    clusters of ``level`` (module description; ``used``: U; ``cells_flops``: the most FLOP/s the
    plan's cells reach together, the U fastest devices' at most and ``speedup`` (a tensor group's
    most over one device) times the ``S D`` fastest's; ``work_flops``: the iteration's;
    ``block_flops``: the blocks' alone; ``busiest_s``: K; ``state_bytes``: the largest stage's
    least state).

    Either the plan sits inside one cluster with at least ``S D`` devices and a device of at least
    ``state_bytes``: then its work bound over that cluster's ``U`` fastest devices, and
    ``stage_split.stage_split_s`` over them with ``inside_sync_s`` (every block's sync over the
    fastest ring, the bound's sync term; None: not counted). Or it spans
    clusters, and then (the time ``T`` is at least each of the terms, so at least their largest
    minimised over what the plan may choose):

    (i) no stage crosses: the stages sit in two clusters or more, so every replica crosses, the
        busiest (``ceil(B / D)`` sequences) too: ``max(ceil(B / D) P / B, P C / (P + C), 2 latencies)``,
        the second from ``max(phi P, (1 - phi) C)``, the rest of the batch running elsewhere; and
        the busiest replica's round trips crossing once at least (``crossing_trip_s``, from
        ``round_trip.crossing_extra_s`` with ``fewest=1``; None: not counted), and its messages over
        the slower way between clusters, then a block's sync at the fastest ring (``inside_sync_s``
        over ``L``: ``crossing_link.crossing_link_s``; not counted where ``inside_sync_s`` is None);
    (ii) no replica crosses: every stage crosses, the deepest (``ceil(L / S)`` blocks) too:
        ``max(ceil(L / S) A / L + Lambda, C (A + Lambda) / (A + C))``, the second from
        ``max(f A + Lambda, (1 - f) C)``, the other stages' blocks running elsewhere; and each stage
        computes, then syncs its blocks across with ``Lambda``'s latencies (``stage_split``: the
        blocks' work over ``cells_flops`` plus an average stage's crossing sync, plus ``Lambda``);
    (iii) some stage and some replica cross: ``T`` with ``T = (1 - T / A)(1 - T / P) C`` (the cells
        outside both do ``(1 - f)(1 - phi)`` of the blocks' work), at least ``A / L + Lambda`` and
        ``P / B`` (a stage has a block, a replica a sequence); and, unless every stage or every
        replica crosses (cases (ii), (i)), ``_crowded_s`` and ``_split_stages_s`` (no cluster
        holding ``S + D - 1`` cells rules it out) at the busiest replica's load that the crossing
        replicas' slow messages force (``_loaded_split_s``).

    Where no cluster has ``D`` devices, every stage group crosses, so (ii)'s bound holds whatever
    the replicas do; where none has ``S``, every replica crosses and (i)'s holds; both where both.
    Where every cluster is one device, the first stage's last backward waits for the busiest
    replica's last gradient over a crossing link that carried all its ``ceil(B / D)`` sequences'
    gradients, and its sync (at least a block and the embeddings, ``end_sync_bytes``) crosses
    after it; the last stage's likewise waits for the activations and syncs a block and the head.

    Whatever the case, the batch goes through the replicas inside clusters and those crossing
    (``replica_throughput``). Without ``reordering`` (the table the search orders its degree pairs
    by, ``bounds.pair_bounds_s``), neither that nor (ii)'s stage split is counted.

    Given a dict ``parts``, each case's (D,) seconds go in it, for a reader of which case holds a
    pair (``benchmarks/generated_layouts.py``): "inside", "(i)", "(ii)", "(iii)", "throughput", and
    "every stage crosses" / "every replica crosses" (D,) where the cluster sizes force it.
    """
    latency = level.latency_s
    cells = stages * replicas
    width = level.speed.shape[1]
    # (K, D) the most FLOP/s the plan's cells reach inside each cluster, as ``cells_flops`` overall
    best_cluster = np.minimum(level.speed[:, np.minimum(used, width) - 1],
                              speedup * level.speed[:, np.minimum(cells, width) - 1])
    fits = (level.memory_bytes >= state_bytes)[:, None] & (level.sizes[:, None] >= cells[None, :])
    with np.errstate(divide="ignore"):
        inside = work_flops / np.where(fits, best_cluster, 0.0).max(axis=0)  # inf where no cluster holds it
        if inside_sync_s is not None:  # and its stages compute, then sync (``stage_split``)
            staged = stage_split_s(block_flops, np.where(fits, best_cluster, 0.0), inside_sync_s, stages).min(axis=0)
            inside = np.maximum(inside, staged)
    share = 2.0 * (replicas - 1) / replicas if crossing.ring_only else np.ones(replicas.shape)
    if crossing.sharded:
        share = np.minimum(share, 2.0 / replicas)
    # two members sync over both directions of one pair (``fastest_both_ways_between``)
    # and any sync across two clusters crosses both ways (``slower_way_between``)
    sync_tau = np.where(replicas == 2, min(level.both_ways_bytes_per_s, level.slower_way_bytes_per_s),
                        level.slower_way_bytes_per_s)
    crossing_sync_s = crossing.model_sync_bytes * share / sync_tau  # every block's sync across
    A = busiest_s + crossing_sync_s
    steps = 2.0 * (replicas - 1) if crossing.ring_only and crossing.sync_every == 1 else 2.0
    lam = steps * latency / crossing.sync_every
    P = crossing.batch_bytes / level.both_ways_bytes_per_s  # a boundary's messages go both ways
    C = block_flops / cells_flops
    L, B = crossing.layers, crossing.batch
    never = np.full(replicas.shape, np.inf)
    one = (np.maximum.reduce([np.ceil(B / replicas) * P / B, P * C / (P + C), np.full(replicas.shape, 2.0 * latency)])
           if stages > 1 else never)  # a replica of one cell never crosses
    if stages > 1 and crossing_trip_s is not None:  # the busiest crosses: its round trips do
        one = np.maximum(one, crossing_trip_s)
    if stages > 1 and inside_sync_s is not None:  # its messages over the slower way, then a stage's sync
        one = np.maximum(one, crossing_link_s(np.ceil(B / replicas), crossing.batch_bytes / B,
                                              level.slower_way_bytes_per_s, latency, inside_sync_s / L))
    two = np.maximum(math.ceil(L / stages) * A / L + lam, np.maximum(lam, C * (A + lam) / (A + C)))
    if reordering:  # each stage computes, then syncs across (``stage_split``)
        two = np.maximum(two, stage_split_s(block_flops, cells_flops, crossing_sync_s, stages) + lam)
    two = np.where(replicas > 1, two, np.inf)
    if stages > 1:
        a, b = C / (A * P), -(C / A + C / P + 1.0)
        both = np.maximum.reduce([2.0 * C / (-b + np.sqrt(b * b - 4.0 * a * C)), A / L + lam,
                                  np.full(replicas.shape, P / B)])
        crowded = _crowded_s(block_flops / best_cluster.max(axis=0), (stages - 1) / A, (replicas - 1) / P)
        both = np.where(replicas > 1, np.maximum(both, np.minimum.reduce([one, two, crowded])), np.inf)
    else:
        both = never
    # A stage group of more cells than any cluster has devices crosses; so does a replica.
    every_stage, every_replica = replicas > level.sizes.max(), stages > level.sizes.max()
    all_cross = np.maximum(one, two)
    if level.sizes.max() == 1 and stages > 1:  # every cell alone: every boundary and stage crosses
        all_cross = np.maximum(all_cross, np.ceil(B / replicas) * P / B
                               + crossing.end_sync_bytes * share / sync_tau + lam)
    if stages > 1 and inside_sync_s is not None:
        # refined only up to the least of the other cases and inside: past it, it cannot change the result
        needed = np.where(every_stage | every_replica, 0.0, np.minimum.reduce([one, two, inside]))
        both = np.maximum(both, _loaded_split_s(stages, replicas, cells, level.sizes.max(), crossing_sync_s,
                                                inside_sync_s, busiest_s, batch=B, batch_s=P, layers=L, cap=needed))
    crossing_s = np.where(every_stage, all_cross if every_replica else two,
                          one if every_replica else np.minimum.reduce([one, two, both]))
    bound = np.minimum(inside, crossing_s)
    if parts is not None:
        parts.update({"inside": inside, "(i)": one, "(ii)": two, "(iii)": both, "every stage crosses": every_stage,
                      "every replica crosses": np.broadcast_to(every_replica, replicas.shape)})
    if not reordering:
        return bound
    # however many replicas cross, the batch goes through them and the clusters the others sit in
    holds = (level.sizes >= stages)[:, None]  # a replica inside a cluster has S cells there
    through = replica_throughput_s(np.where(holds, best_cluster, 0.0), level.multiplicity, cells_flops, block_flops,
                                   replicas, P, crossing=stages > 1)
    if parts is not None:
        parts["throughput"] = through
    return np.maximum(bound, through)


def _split_stages_s(stages: int, replicas: np.ndarray, cells: np.ndarray, largest: int, crossing_s: np.ndarray,
                    inside_s: np.ndarray, layers: int | None = None) -> np.ndarray:
    """The least ``T`` of case (iii) of ``cluster_bound`` from the stages' shares of the blocks:
    each stage of a share ``f`` of the blocks takes at least ``f X`` (its sync starts after the
    busiest replica's backwards of those blocks, ``K``, and sends ``f`` of every block's sync bytes),
    with ``X = A`` (``crossing_s``) for a crossing stage and ``X = K + Y`` (``inside_s``, ``Y`` every
    block's sync over the fastest ring, ``bounds.lower_bound_s``'s sync term) for the others; the
    shares adding up to 1, ``T >= 1 / sum_s (1 / X_s)``. Case (iii) leaves at most ``c`` crossing
    stages times crossing replicas' cells outside one cluster of at most ``largest`` devices, so
    ``c`` crossing stages and at most ``D - 1`` crossing replicas need ``c (D - 1) >= S D - largest``:
    ``c >= max(1, ceil((S D - largest) / (D - 1)))``, up to ``S - 1``; the least over the two ends
    (the bound is monotone in ``c``), and inf where even ``S - 1`` are too few (no cluster holds the
    ``S + D - 1`` cells of a stage and a replica that stay inside: case (iii) cannot happen).

    Given ``layers`` (``L``), the shares are whole blocks, each stage one at least (a plan splits the
    blocks, never one block): with ``m`` blocks on the ``c`` crossing stages the largest of them holds
    ``ceil(m / c)`` and the largest of the others ``ceil((L - m) / (S - c))``, so ``T`` is at least
    the least over ``m`` of ``max(ceil(m / c) A, ceil((L - m) / (S - c)) (K + Y)) / L``
    (``_whole_blocks_s``), never below the shares' bound above; still monotone in ``c`` (a crossing
    stage in place of an inside one changes its ``X`` one way only)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fewest = np.maximum(1.0, np.ceil((cells - largest) / np.maximum(replicas - 1, 1)))
        ends = [np.minimum(fewest, stages - 1), np.full(np.shape(replicas), stages - 1.0)]
        bounds = [1.0 / (c / crossing_s + (stages - c) / inside_s) for c in ends]
    least = np.where(fewest > stages - 1, np.inf, np.minimum(*bounds))
    if layers is not None:  # whole blocks, only where the case can happen (time)
        room = np.flatnonzero(np.isfinite(least))
        if room.size:
            def both_ends(values):  # each end's replica counts, one after the other (one call)
                return np.tile(np.broadcast_to(values, least.shape)[room], 2)
            whole = _whole_blocks_s(layers, stages, np.concatenate([np.broadcast_to(c, least.shape)[room] for c in ends]),
                                    both_ends(crossing_s), both_ends(inside_s)).reshape(2, room.size)
            least = least.copy()
            least[room] = np.maximum(least[room], whole.min(axis=0))
    return least


def _loaded_split_s(stages: int, replicas: np.ndarray, cells: np.ndarray, largest: int, crossing_sync_s: np.ndarray,
                    inside_sync_s: np.ndarray, busiest_s: np.ndarray, *, batch: int, batch_s: float,
                    layers: int, cap: np.ndarray | None = None) -> np.ndarray:
    """``_split_stages_s`` with the busiest replica's load that case (iii) of ``cluster_bound`` forces:
    the least ``T`` with ``T >= split(T)``, where ``split(T)`` is ``_split_stages_s`` with ``X = K(T)
    + crossing_sync_s`` for a crossing stage and ``K(T) + inside_sync_s`` for the others.

    In case (iii) some replica stays inside one cluster and ``r`` of the ``D`` replicas cross
    (``1 <= r <= D - 1``). A crossing replica sends each of its sequences' activations across and
    their gradients back over one pair of clusters, ``m`` bytes each way a sequence, so in ``T`` it
    holds at most ``x = floor(T B / P)`` sequences (``batch_s``: ``P``, the whole batch's ``B``
    sequences both ways). The inside replicas hold the rest, at least ``B - r x`` over ``D - r``
    of them, whose least over ``r`` is ``(B - x) / (D - 1)`` where ``D x <= B`` (at ``r = 1``) and
    at most ``B / D`` otherwise, so the busiest replica holds at least ``b(T) = max(ceil(B / D),
    ceil((B - x) / (D - 1)))`` sequences, and ``K(T)``, every block on one cell for it, is
    ``busiest_s`` (``K`` for ``ceil(B / D)``) times ``b(T) / ceil(B / D)``; and ``T >= P / B``, a
    crossing replica holding one sequence at least. ``split`` is non-increasing in ``T``, so the
    wanted ``T`` is ``lo = max(split(inf), P / B)`` (``split(inf)``: ``_split_stages_s`` at
    ``ceil(B / D)``) where ``split(lo) <= lo``, and otherwise lies between ``lo`` and ``split(lo)``;
    a bisection returns a ``T`` below it, within 1e-3 of it (relative). Given ``cap`` (D,), a value
    the caller takes the least of with this one, ``T`` is sought only up to it (within 1e-3 below
    the cap where the cap binds; time: at 16,384 devices most pairs need no more than ``lo``)."""
    least = np.ceil(batch / replicas)
    spare = np.maximum(replicas - 1, 1)

    def split(T):  # (D,) _split_stages_s with the busiest replica's load at T
        crossers = np.floor(np.where(np.isfinite(T), T, 0.0) * batch / batch_s)
        loaded = np.where(np.isfinite(T), np.maximum(least, np.ceil((batch - crossers) / spare)), least)
        K = busiest_s * loaded / least
        return _split_stages_s(stages, replicas, cells, largest, K + crossing_sync_s, K + inside_sync_s,
                               layers=layers)
    # at ceil(B / D), and a crossing replica's one sequence at least: a bound already
    lo = np.maximum(split(np.full(np.shape(replicas), np.inf)), batch_s / batch)
    limit = np.full(lo.shape, np.inf) if cap is None else np.broadcast_to(cap, lo.shape)
    room = np.flatnonzero(np.isfinite(lo) & (lo > 0) & (lo < limit))
    if room.size == 0:
        return lo
    full = np.full(lo.shape, np.inf)
    full[room] = lo[room]
    # T >= split(T) at split(lo) (split(split(lo)) <= split(lo)); past the cap, the cap will do
    below, above = lo[room], np.minimum(split(full)[room], limit[room])
    while True:
        open_ = above > below * (1.0 + 1e-3)
        if not open_.any():
            break
        mid = np.where(open_, 0.5 * (below + above), below)
        full = np.full(np.shape(replicas), np.inf)
        full[room] = mid
        holds = mid >= split(full)[room]
        above = np.where(open_ & holds, mid, above)
        below = np.where(open_ & ~holds, mid, below)
    lo = lo.copy()
    lo[room] = below
    return lo


def _whole_blocks_s(layers: int, stages: int, crossing: np.ndarray, crossing_s: np.ndarray,
                    inside_s: np.ndarray) -> np.ndarray:
    """(D,) the least over splits of ``layers`` whole blocks over ``stages`` stages (one block each at
    least), ``crossing`` (D,) of them crossing, of the largest stage's blocks times its ``X / L``:
    ``crossing_s`` (D,) for a crossing stage, ``inside_s`` (D,) for the others (``_split_stages_s``);
    inf where ``crossing`` is not between 1 and ``stages - 1``.

    With ``q`` blocks on the largest crossing stage, the crossing stages hold ``m = min(c q, L - p)``
    at most (``p = S - c`` inside stages of one block at least; fewer with the same ``q`` only load
    the inside stages more), the largest inside one ``ceil((L - m) / p)``: ``f(q) = max(q a, g(q))``
    with ``q a`` increasing and ``g`` non-increasing, so the least is at the first ``q`` where
    ``q a >= g(q)`` or the one before (a bisection over ``q``, every replica count at once)."""
    c = np.asarray(crossing, dtype=float)
    a, b = np.asarray(crossing_s) / layers, np.asarray(inside_s) / layers
    valid = (c >= 1) & (stages - c >= 1) & (layers >= stages)
    c = np.where(valid, c, 1.0)
    p = np.where(valid, stages - c, 1.0)
    most = np.ceil((layers - p) / c)  # the most blocks the largest crossing stage holds

    def g(q):  # the largest inside stage's blocks, times its X / L
        return np.ceil((layers - np.minimum(c * q, layers - p)) / p) * b
    lo, hi = np.ones(c.shape), most + 1.0  # the first q in [lo, hi) with q a >= g(q); most + 1 if none
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = np.floor((lo + hi) / 2.0)
        ok = mid * a >= g(mid)
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1.0, lo)
    above = np.where(lo <= most, lo * a, np.inf)
    below = np.where(lo > 1, g(lo - 1.0), np.inf)
    return np.where(valid, np.minimum(above, below), np.inf)


def _crowded_s(C, a, b):
    """The least ``T`` with ``T >= (1 - min(1, a T) min(1, b T)) C`` (case (iii) of ``cluster_bound``
    where some stage and some replica stay inside; ``C``: the blocks' work over the fastest
    cluster's ``U`` fastest devices, ``a = (S - 1) / A``, ``b = (D - 1) / P``).

    A stage and a replica that stay inside share a cell, so they sit in one cluster, and so do all
    the cells of such stages and replicas: every cell but those of a crossing stage and a crossing
    replica. Those do a share ``F Phi`` of the blocks' work, with ``F`` the crossing stages' share
    of the blocks (at most ``S - 1`` of them, each ``f <= T / A``) and ``Phi`` the crossing
    replicas' share of the batch (at most ``D - 1``, each ``phi <= T / P``); the rest runs in one
    cluster: ``T >= (1 - F Phi) C``. Each of ``m(T) = a b T^2``, ``a T``, ``b T`` is at least
    ``min(1, a T) min(1, b T)``, so the root of ``T = (1 - m(T)) C`` is at most the wanted one,
    which is one of them: their largest."""
    ab = a * b
    quadratic = 2.0 * C / (1.0 + np.sqrt(1.0 + 4.0 * ab * C * C))
    return np.maximum.reduce([quadratic, C / (1.0 + a * C), C / (1.0 + b * C)])
