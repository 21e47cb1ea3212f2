"""The lower bound's term for a device behind a slow shared NIC that a plan must use (``planner.search.bounds``).

A device alone on its host, where the host has a shared NIC (``cost_models.network``: ``nic_egress``
and ``nic_ingress``), sends and receives every message of its cell through that NIC: a cell of it is
the device alone (a tensor group sits inside one host), so every peer is on another host. The NIC is
one resource: each message holds it for its bytes at the NIC's rate, and messages holding it queue
(``Network.transfer_holds``, the simulator's ``_Resources``). A plan of ``S D`` cells uses ``S D``
devices at least, so one of them is at most the ``(S D)``-th fastest in that NIC's rate (``rho``:
the least of its host's egress and ingress; devices not alone behind a NIC count as infinitely fast)
(``slowest_used_rate``).

Say that device ``u`` sits in stage ``k`` of a replica running ``b`` sequences. With ``S >= 2`` it
sends (and receives) ``b`` activations' messages (``a`` bytes a sequence at least) one way where
``k`` is the first or the last stage, both ways otherwise (``c = 1`` or ``2``). Its stage's sync
starts when every replica reached it (``u`` after its last send and receive: its op list puts them
before the sync) and holds ``u``'s NIC (the ring's hops out of and into ``u``'s host,
``Network.ring_nic_holds``; ``nic_busy_s`` for the other algorithms), so it starts after those
messages' holds, ``c b a / rho`` at least, and then lasts a ring all-reduce whose hop out of ``u``
runs at most ``rho`` (``Network.ring_hops``): ``2 (D - 1) / D`` of the stage's gradient bytes over
``rho`` (where rings are the only sync; the ring's usual rate otherwise). The batch split decides
``b``: the other ``D - 1`` replicas hold the other ``B - b`` sequences, so the busiest replica holds
``max(b, ceil((B - b) / (D - 1)))`` at least. For ``b`` in an interval ``[lo, hi]`` the plan's time
is at least ``stage_chains_s`` with that odd stage (``u``'s), its wait ``c lo a / rho`` and the busiest
replica's ``max(lo, ceil((B - hi) / (D - 1)))`` sequences; the least over intervals covering every
``b`` bounds every plan (``uplink_chains_s``).

At a clusters' level whose clusters the plan's cells cannot fit in one of
(``stage_chains.clustered_stage_chains_s``), either every stage group sits in one cluster and every
replica's trips cross between the clusters the groups fill (``crossings``, as there), or some group
spans two clusters and syncs over the slower way between them. Where the plan's cells are the
topology's devices, one each, a cluster's devices are its pure groups' (``D`` each) and the crossing
groups': a single crossing group takes ``c_j mod D`` (or 0 or ``D``) of cluster ``j``'s ``c_j`` and
``D`` in all over two clusters at least, so where no such choice exists two groups cross
(``_one_group_may_cross``), and one of them is not ``u``'s: a second odd stage syncing at the slower
way. Otherwise the crossing group may be ``u``'s: its stage syncs no faster than the slower of
``rho`` and the slower way. Between exactly two clusters (as in ``clustered_stage_chains_s``) each
crossing group holds cells of both: where one crossing group leaves pure groups that one cluster
cannot hold, every replica crosses too (``crossing_extra(fewest=1)``, ``pure_groups_fill_both``), and
where ``2 .. x - 1`` crossing groups do so but ``x`` do not (``fewest_open_crossings``), ``x`` or more
crossing groups hold ``x - 1`` stages other than ``u``'s syncing at the slower way (``seconds``).
"""

import numpy as np

from planner.search.crossing_link import crossing_link_s
from planner.search.stage_chains import fewest_open_crossings, pure_groups_fill_both, pure_groups_s, stage_chains_s

__all__ = ["nic_rates_bytes_per_s", "slowest_used_rate", "uplink_chains_s"]

_INTERVALS = 10  # intervals of the slow device's replica's sequences (each a valid bound; more: tighter, slower)


def nic_rates_bytes_per_s(network) -> np.ndarray:
    """(N,) each device's shared NIC rate, the least of its host's egress and ingress, where the
    device is alone on its host and the host has a shared NIC; ``inf`` otherwise."""
    host = np.asarray(network.host)
    alone = np.bincount(host, minlength=network.hosts)[host] == 1
    rate = np.minimum(network.nic_egress_bytes_per_s, network.nic_ingress_bytes_per_s)[host]
    return np.where(alone, rate, np.inf)


def slowest_used_rate(rates: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The ``cells``-th highest of ``rates`` (each entry of ``cells`` from 1 to ``len(rates)``): the
    fastest the slowest of ``cells`` distinct devices can be."""
    ordered = np.sort(np.asarray(rates, dtype=float))[::-1]
    return ordered[np.asarray(cells) - 1]


def _one_group_may_cross(cluster_sizes: np.ndarray, replicas: int) -> bool:
    """Whether one stage group of ``replicas`` cells may span clusters while every other group sits
    in one and every device of the clusters (``cluster_sizes``) is a cell: the crossing group takes
    ``c_j mod D`` of each cluster where that is not 0 (and 0 or ``D`` where it is), ``D`` in all,
    from two clusters at least."""
    residues = np.asarray(cluster_sizes) % replicas
    taken = residues[residues > 0]
    return int(taken.sum()) == replicas and taken.size >= 2


def _sequence_intervals(batch: int, replicas: np.ndarray) -> tuple:
    """``(lo, busiest)``, (K, D) each: intervals ``[lo, hi]`` of the slow device's replica's
    sequences ``b`` covering ``0 .. inf`` (an empty one only adds a value to the least), with the busiest replica's least sequences over the
    interval, ``max(lo, ceil((B - hi) / (D - 1)))``; the last interval starts at ``ceil(B / D)``,
    where the busiest is ``b`` itself (one replica: ``b = B``)."""
    replicas = np.asarray(replicas, dtype=float)
    top = np.ceil(batch / replicas)
    steps = np.linspace(0.0, 1.0, _INTERVALS)[:, None]
    points = np.concatenate([np.zeros((1, replicas.size)), 1.0 + np.floor(steps * (top - 1.0))])  # 0, 1 .. top
    lo, hi = points[:-1], points[1:] - 1.0  # [p_i, p_(i+1) - 1]: every b below the top (empty where equal)
    others = np.ceil((batch - hi) / np.maximum(replicas - 1.0, 1.0))
    busiest = np.where(replicas > 1, np.maximum(lo, others), batch)
    lo = np.concatenate([np.where(replicas > 1, lo, batch), top[None, :]])
    busiest = np.concatenate([busiest, top[None, :]])
    return lo, busiest


def uplink_chains_s(levels, *, stages: int, replicas: np.ndarray, batch: int, rate: np.ndarray,
                    sequence_bytes: float, share: np.ndarray, ring_bytes_per_s: np.ndarray, ring_only: bool,
                    every_device_a_cell: np.ndarray, block_sync_bytes: float, first_sync_bytes: float,
                    last_sync_bytes: float, crossing_extras, **chains) -> np.ndarray:
    """(D,) seconds at least of any plan of ``stages`` (S >= 2) stages and ``replicas`` (D,) whose
    cells use a device of NIC rate at most ``rate`` (D,) bytes/s (module description; 0 where
    ``rate`` is infinite): ``sequence_bytes`` one sequence's message, ``share`` (D,) a ring's share
    ``2 (D - 1) / D``, ``ring_bytes_per_s`` (D,) the usual ring's rate, ``ring_only`` whether rings
    are the only sync, ``every_device_a_cell`` (D,) whether the plan's cells are every device, one
    each; ``*_sync_bytes`` a block's and the first and last stages' extra gradient bytes;
    ``levels`` the clusters' levels (``cluster_bound.ClusterLevel``) and ``crossing_extras`` each's
    ``round_trip.crossing_extra_s`` taking ``fewest``; ``chains``: ``stage_chains_s``'s others
    (``busiest``, the syncs and ``crossings`` are set here)."""
    replicas = np.asarray(replicas)
    slow = np.isfinite(rate)
    bound = np.zeros(replicas.shape)
    if stages < 2 or not slow.any():
        return bound
    # only the replica counts whose rate is finite (time): every (D,) argument sliced to them
    keep = np.flatnonzero(slow)

    def sliced(value):
        return value[keep] if isinstance(value, np.ndarray) and value.shape == replicas.shape else value

    chains = {k: sliced(v) for k, v in chains.items()}
    replicas, rate, share, ring_bytes_per_s, every_device_a_cell = (
        sliced(v) for v in (replicas, rate, share, ring_bytes_per_s, every_device_a_cell))
    bound[keep] = _uplink_chains_s(levels, stages, replicas, batch, rate, sequence_bytes, share, ring_bytes_per_s,
                                   ring_only, every_device_a_cell, block_sync_bytes, first_sync_bytes,
                                   last_sync_bytes, crossing_extras, chains)
    return bound


def _uplink_chains_s(levels, stages, replicas, batch, rate, sequence_bytes, share, ring_bytes_per_s, ring_only,
                     every_device_a_cell, block_sync_bytes, first_sync_bytes, last_sync_bytes, crossing_extras,
                     chains) -> np.ndarray:
    """``uplink_chains_s`` on replica counts whose ``rate`` is finite."""
    lo, busiest = _sequence_intervals(batch, replicas)
    per_sequence = sequence_bytes / rate  # seconds a sequence's message holds the slow NIC
    waits = (lo * per_sequence, 2.0 * lo * per_sequence)

    def syncs(rate_bytes_per_s):  # (block, first, last) syncs (D,) at this rate
        seconds_per_byte = share / rate_bytes_per_s
        return tuple(b * seconds_per_byte for b in (block_sync_bytes, first_sync_bytes, last_sync_bytes))

    usual = syncs(ring_bytes_per_s)
    odd = syncs(np.minimum(rate, ring_bytes_per_s)) if ring_only else usual
    base = dict(chains, stages=stages, busiest=busiest, odd_wait=waits, layer_sync_s=usual[0], first_sync_s=usual[1],
                last_sync_s=usual[2])
    spanned = [stages * replicas > int(level.cluster_sizes.max()) for level in levels]
    # the clusters' cases below only raise it: left out where one of them holds (time)
    plain = ~np.logical_or.reduce(spanned) if spanned else np.ones(replicas.shape, dtype=bool)
    least = np.zeros(replicas.shape)
    if plain.any():
        least = np.where(plain, stage_chains_s(**base, odd_sync=odd).min(axis=0), 0.0)
    for level, crossing_extra, spans in zip(levels, crossing_extras, spanned):
        if not spans.any():
            continue
        crossing = np.where(replicas >= 2, 0.0, np.inf)  # one replica: no group spans; no ring: this case counts 0
        if ring_only and (replicas >= 2).any():
            slower = syncs(np.minimum(level.slower_way_bytes_per_s, ring_bytes_per_s))
            spread = crossing_extra(fewest=0)  # every replica still spans ceil(S / c) clusters
            sizes, pair = level.cluster_sizes, level.cluster_sizes.size == 2
            crossed = crossing_extra(fewest=1) if pair else spread  # where the pure groups fill both clusters
            fills = np.array([pair and pure_groups_fill_both(sizes, stages, int(d), "one") for d in replicas])
            opens = np.array([fewest_open_crossings(sizes, stages, int(d)) if pair else 2 for d in replicas])

            def chains_s(crossings, **syncs_of):
                return stage_chains_s(**base, crossings=crossings, **syncs_of).min(axis=0)
            two_spread = chains_s(spread, odd_sync=odd, second_sync=slower)
            two_crossed = chains_s(crossed, odd_sync=odd, second_sync=slower) if pair else two_spread
            two = np.where(opens == 0, two_crossed, two_spread)  # two groups cross or more
            for count in np.unique(opens[opens > 2]):
                wider = chains_s(spread, odd_sync=odd, second_sync=slower, seconds=int(count) - 1)
                two = np.where(opens == count, np.minimum(two_crossed, wider), two)
            single = np.array([_one_group_may_cross(sizes, int(d)) for d in replicas])
            alone = ~every_device_a_cell | single  # one group may cross alone: u's, or another
            if alone.any():
                slower_odd = syncs(np.minimum.reduce([rate, ring_bytes_per_s,
                                                      np.full(replicas.shape, level.slower_way_bytes_per_s)]))
                one = np.where(fills, chains_s(crossed, odd_sync=slower_odd), chains_s(spread, odd_sync=slower_odd))
                other = np.where(fills, two_crossed, two_spread)
                two = np.where(alone, np.minimum.reduce([two, one, other]), two)
            crossing = np.where(replicas >= 2, two, np.inf)
        # every replica crosses where the pure groups fill two clusters or more: the busiest's messages
        # over the slower way, then a stage's sync (``crossing_link``), over the same intervals
        linked = crossing_link_s(busiest, sequence_bytes, level.slower_way_bytes_per_s, level.latency_s, usual[0])
        pure = pure_groups_s(level.cluster_sizes, stages, replicas, spans, lambda fewest: np.maximum(
            stage_chains_s(**base, odd_sync=odd, crossings=crossing_extra(fewest=fewest)),
            linked if fewest >= 1 else 0.0).min(axis=0))
        least = np.where(spans, np.maximum(least, np.minimum(crossing, pure)), least)
    return least
