"""The plan's gradient sync algorithm, executed with torch.distributed point-to-point messages so
that the route and the order are the plan's, not the collective library's choice.

Every algorithm sums a flat tensor in place over a stage's replicas (one bucket at a time,
``engine._all_reduce_sum``) and returns the bytes this rank sent; over the ``k`` replicas that is
``2 (k - 1)`` times the tensor's bytes for each algorithm (``Network.sync_flows``, which the cost
model charges):

- ring: reduce-scatter then all-gather of ``k`` chunks around the plan's ring order, each step a
  send to the next replica and a receive from the previous (Patarasuk & Yuan 2009);
- hierarchical: each host's replicas send to the host's lead (its first in ring order), the leads
  run the ring, and each lead sends the sum back (Jia et al. 2018, arXiv 1807.11205, sec. 4.2);
- parameter-server: every replica sends to the stage's server, which sums in ring order and sends
  the sum back (Li et al., OSDI'14; DTFM's runs, dtfm.md sec. 3);
- sharded: DTFM's all-to-all: chunk ``j`` goes to replica ``j``, which sums it and sends the sum to
  every other replica (Yuan et al. 2022, sec. 3.2).

Under ZeRO stage 1 (``planner.runtime.sharded``) a ring or sharded sync runs as its two halves:
the reduce-scatter leaves each replica its own shard's sum (``reduce_scatter_over_route``), and
after the step the all-gather sends each replica's shard to the others (``all_gather_over_route``).

Sums run in a fixed order (ring order), so every replica ends with the same bits.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from cost_models.network import Sync

__all__ = ["SyncRoute", "sync_route", "route_matters", "sum_over_route", "reduce_scatter_over_route",
           "all_gather_over_route", "ring_member_bytes"]


@dataclass(frozen=True, kw_only=True)
class SyncRoute:
    """One rank's view of its stage's sync: the algorithm, the stage's global ranks in the plan's
    ring order, each one's host, the server's rank (parameter-server only) and this rank."""

    sync: Sync
    ranks: tuple
    hosts: tuple
    me: int
    server: int | None = None
    replicas: tuple = ()  # each rank's replica index (its shard under ZeRO stage 1), in ``ranks``' order
    uniform: bool = False  # one host, and the same latency and bandwidth between every two members

    def __post_init__(self):
        if self.me not in self.ranks or len(self.hosts) != len(self.ranks):
            raise ValueError(f"rank {self.me} is not one of the sync's ranks {self.ranks}")
        if self.sync == Sync.PARAMETER_SERVER and self.server not in self.ranks:
            raise ValueError(f"the parameter server {self.server} is not one of the sync's ranks {self.ranks}")


def sync_route(plan, topology, layout, stage: int, member: int, me: int) -> SyncRoute:
    """The route of ``stage``'s sync for tensor member ``member`` (rank ``me``): the stage's replicas
    in ``plan.ring_orders`` order as ranks of ``layout``, their devices' hosts in ``topology``."""
    order = list(plan.ring_orders[stage]) if plan.ring_orders else list(range(plan.replicas))
    ranks = tuple(layout.rank(r, stage, member) for r in order)
    hosts = tuple(topology.devices[topology.index(plan.members(plan.assignment[r][stage])[member])].host
                  for r in order)
    server = layout.rank(plan.sync_servers[stage], stage, member) if plan.sync_servers else None
    devices = np.array([topology.index(plan.members(plan.assignment[r][stage])[member]) for r in order])
    off = ~np.eye(len(devices), dtype=bool)  # every ordered pair of two members
    latency = np.asarray(topology.latency_s[np.ix_(devices, devices)])[off]
    bandwidth = np.asarray(topology.bandwidth_bytes_per_s[np.ix_(devices, devices)])[off]
    uniform = len(set(hosts)) == 1 and (latency.size == 0 or (np.all(latency == latency[0])
                                                              and np.all(bandwidth == bandwidth[0])))
    return SyncRoute(sync=Sync(plan.sync), ranks=ranks, hosts=hosts, me=me, server=server, replicas=tuple(order),
                     uniform=uniform)


def route_matters(route: SyncRoute) -> bool:
    """Whether the sync must follow ``route`` message by message: not for a ring over members of one
    host joined by equal links, where no order is faster than another and torch's collective
    (NCCL's own ring or tree on GPUs) moves the same bytes per link without a Python step per chunk."""
    return len(route.ranks) > 1 and not (route.sync == Sync.RING and route.uniform)


def sum_over_route(flat: torch.Tensor, route: SyncRoute) -> int:
    """Sum ``flat`` in place over ``route``'s ranks by its algorithm; the bytes this rank sent."""
    if len(route.ranks) <= 1:
        return 0
    if route.sync == Sync.RING:
        return _ring(flat, list(route.ranks), route.me)
    if route.sync == Sync.SHARDED:
        return _sharded(flat, list(route.ranks), route.me)
    if route.sync == Sync.PARAMETER_SERVER:
        return _star(flat, list(route.ranks), route.server, route.me)
    return _hierarchical(flat, route)


def ring_member_bytes(flat: torch.Tensor, group) -> int:
    """Bytes one of ``group``'s ``k`` ranks sends in a ring all-reduce of ``flat``, as torch's
    collective is counted: ``2 (k - 1) / k`` of the message (Patarasuk & Yuan 2009)."""
    k = dist.get_world_size(group)
    return 2 * (k - 1) * _bytes(flat) // k


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _exchange(sends: list, receives: list) -> None:
    """Post every (tensor, peer) send and receive at once, then wait for all."""
    ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends] + \
          [dist.P2POp(dist.irecv, t, peer) for t, peer in receives]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _ring(flat: torch.Tensor, ranks: list, me: int) -> int:
    """Ring all-reduce over ``ranks`` in order: ``k - 1`` reduce-scatter steps, then ``k - 1``
    all-gather steps, one chunk to the next rank and one from the previous each step."""
    chunks = list(torch.tensor_split(flat, len(ranks)))
    return _ring_phase(chunks, ranks, me, reduce=True) + _ring_phase(chunks, ranks, me, reduce=False)


def _ring_phase(chunks: list, ranks: list, me: int, *, reduce: bool) -> int:
    """One half of a ring all-reduce over ``chunks`` (slot ``j`` of ``k``): the reduce-scatter,
    after which position ``i`` holds slot ``(i + 1) % k`` summed over every rank, or the
    all-gather, which sends each position's slot around; the bytes this rank sent."""
    k, i = len(ranks), ranks.index(me)
    nxt, prev = ranks[(i + 1) % k], ranks[(i - 1) % k]
    sent = 0
    for t in range(k - 1):
        out, into = (chunks[(i - t) % k], chunks[(i - t - 1) % k]) if reduce else \
            (chunks[(i + 1 - t) % k], chunks[(i - t) % k])
        incoming = torch.empty_like(into)
        _exchange([(out, nxt)], [(incoming, prev)])
        if reduce:
            into.add_(incoming)
        else:
            into.copy_(incoming)
        sent += _bytes(out)
    return sent


def _shard_slots(shards: list, route: SyncRoute) -> list:
    """``shards`` (shard ``r`` belongs to replica ``r``) in ring slot order: the reduce-scatter
    leaves slot ``(i + 1) % k`` at position ``i``, so that slot is position ``i``'s replica's shard."""
    k = len(route.ranks)
    return [shards[route.replicas[(j - 1) % k]] for j in range(k)]


def reduce_scatter_over_route(flat: torch.Tensor, route: SyncRoute) -> int:
    """ZeRO stage 1's gradient sync by the plan's algorithm (ring or sharded): ``flat`` in as many
    equal shards as replicas; afterwards this rank's replica's shard holds its sum over every rank.
    Returns the bytes this rank sent."""
    shards = list(flat.chunk(len(route.ranks)))
    if route.sync == Sync.RING:
        return _ring_phase(_shard_slots(shards, route), list(route.ranks), route.me, reduce=True)
    assert route.sync == Sync.SHARDED, route.sync
    ranks, i = list(route.ranks), route.ranks.index(route.me)
    mine = shards[route.replicas[i]]
    others = [j for j in range(len(ranks)) if j != i]
    incoming = {j: torch.empty_like(mine) for j in others}
    _exchange([(shards[route.replicas[j]], ranks[j]) for j in others], [(incoming[j], ranks[j]) for j in others])
    total = torch.zeros_like(mine)
    for j in range(len(ranks)):  # in ring order, the same on every rank
        total.add_(mine if j == i else incoming[j])
    mine.copy_(total)
    return sum(_bytes(shards[route.replicas[j]]) for j in others)


def all_gather_over_route(flat: torch.Tensor, route: SyncRoute) -> int:
    """ZeRO stage 1's all-gather by the plan's algorithm: every replica's shard of ``flat`` (its
    own, just stepped) to every rank. Returns the bytes this rank sent."""
    shards = list(flat.chunk(len(route.ranks)))
    if route.sync == Sync.RING:
        return _ring_phase(_shard_slots(shards, route), list(route.ranks), route.me, reduce=False)
    ranks, i = list(route.ranks), route.ranks.index(route.me)
    others = [j for j in range(len(ranks)) if j != i]
    _exchange([(shards[route.replicas[i]], ranks[j]) for j in others],
              [(shards[route.replicas[j]], ranks[j]) for j in others])
    return len(others) * _bytes(shards[route.replicas[i]])


def _sharded(flat: torch.Tensor, ranks: list, me: int) -> int:
    """DTFM's sharded exchange: every rank sends chunk ``j`` to rank ``j`` and sums its own chunk
    (reduce-scatter), then sends its summed chunk to every other rank (all-gather)."""
    k, i = len(ranks), ranks.index(me)
    chunks = list(torch.tensor_split(flat, k))
    others = [j for j in range(k) if j != i]
    incoming = {j: torch.empty_like(chunks[i]) for j in others}
    _exchange([(chunks[j], ranks[j]) for j in others], [(incoming[j], ranks[j]) for j in others])
    total = torch.zeros_like(chunks[i])
    for j in range(k):  # in ring order, the same on every rank
        total.add_(chunks[i] if j == i else incoming[j])
    chunks[i].copy_(total)
    _exchange([(chunks[i], ranks[j]) for j in others], [(chunks[j], ranks[j]) for j in others])
    return sum(_bytes(chunks[j]) for j in others) + len(others) * _bytes(chunks[i])


def _star(flat: torch.Tensor, ranks: list, center: int, me: int) -> int:
    """Reduce to ``center`` and send the sum back: every other rank sends ``flat`` to it; it sums
    in ``ranks`` order and sends the sum to each."""
    if me != center:
        _exchange([(flat, center)], [])
        _exchange([], [(flat, center)])
        return _bytes(flat)
    others = [r for r in ranks if r != center]
    incoming = {r: torch.empty_like(flat) for r in others}
    _exchange([], [(incoming[r], r) for r in others])
    total = torch.zeros_like(flat)
    for r in ranks:
        total.add_(flat if r == center else incoming[r])
    flat.copy_(total)
    _exchange([(flat, r) for r in others], [])
    return len(others) * _bytes(flat)


def _hierarchical(flat: torch.Tensor, route: SyncRoute) -> int:
    """Reduce inside each host to its lead (its first rank in ring order), a ring among the leads in
    ring order, then each lead sends the sum back inside its host."""
    by_host = {}
    for rank, host in zip(route.ranks, route.hosts):
        by_host.setdefault(host, []).append(rank)
    mine = next(group for group in by_host.values() if route.me in group)
    lead = mine[0]
    if route.me != lead:
        return _star(flat, mine, lead, route.me)
    others = mine[1:]
    incoming = {r: torch.empty_like(flat) for r in others}
    _exchange([], [(incoming[r], r) for r in others])
    for r in others:
        flat.add_(incoming[r])
    leads = [group[0] for group in by_host.values()]
    sent = _ring(flat, leads, lead) if len(leads) > 1 else 0
    _exchange([(flat, r) for r in others], [])
    return sent + len(others) * _bytes(flat)
