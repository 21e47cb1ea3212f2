"""The network between devices: one model of what a message costs and which shared resources it
occupies, and the collectives built from such messages.

Built once from a topology (``planner.inputs.topology.Topology.network``) and used by the event
simulator, the emulation, the search's estimate, the CP-SAT coefficients, the bounds and DTFM's
objective, so that none of them can disagree about a link or a shared NIC.

A message of ``n`` bytes from device ``a`` to ``b`` takes ``latency + n / bandwidth`` (the
alpha-beta model, formulas.md, ``cost_models.comm.p2p_time_s``). Its latency is the link's plus
the measured per-message overhead of the software stack (``plan calibrate``). Its bandwidth is
the link's, capped where the two devices sit on different hosts by the sender host's egress and
the receiver host's ingress NIC when the host has a shared NIC. While it is on the wire it
occupies its resources: the directed link, and those NICs; messages sharing a resource queue.
"""

from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from cost_models import comm
from cost_models.links import LevelMatrix

__all__ = ["Network", "Sync"]


class Sync(StrEnum):
    """How a stage's replicas exchange gradients (the values plan files write); each is timed by
    ``Network.sync_s``, occupies what ``Network.sync_holds`` says and sends ``Network.sync_flows``."""

    RING = "ring"  # ring all-reduce in the plan's ring order (``Network.ring_allreduce_s``)
    HIERARCHICAL = "hierarchical"  # reduce in each host, ring among host leads, broadcast back
    PARAMETER_SERVER = "parameter-server"  # reduce to the stage's server replica, broadcast back
    SHARDED = "sharded"  # DTFM's sharded all-to-all (``Network.sharded_exchange_s``)


@dataclass(frozen=True, kw_only=True, eq=False)
class Network:
    """Directed links among ``N`` devices and the shared NICs of their hosts, in SI units.

    ``link_latency_s``/``link_bandwidth_bytes_per_s`` are ``N x N`` (entry ``[a, b]`` is the link
    from a to b; the diagonal is unused): dense arrays, or ``cost_models.links.LevelMatrix`` for a
    network described by levels, looked up by (host, region) keys in memory linear in N; ``host[d]`` is device d's host id; ``nic_egress`` and
    ``nic_ingress`` hold each host's shared NIC bandwidth (inf where the host has none).
    """

    link_latency_s: np.ndarray
    link_bandwidth_bytes_per_s: np.ndarray
    host: np.ndarray
    nic_egress_bytes_per_s: np.ndarray
    nic_ingress_bytes_per_s: np.ndarray
    message_overhead_s: float = 0.0

    def __post_init__(self):
        n = self.link_latency_s.shape[0]
        assert self.link_latency_s.shape == (n, n) == self.link_bandwidth_bytes_per_s.shape and self.host.shape == (n,)
        object.__setattr__(self, "_nic_egress", np.isfinite(self.nic_egress_bytes_per_s))
        object.__setattr__(self, "_nic_ingress", np.isfinite(self.nic_ingress_bytes_per_s))
        if isinstance(self.link_latency_s, LevelMatrix):  # the same entries, looked up by level
            assert isinstance(self.link_bandwidth_bytes_per_s, LevelMatrix)
            latency = replace(self.link_latency_s, host=self.host)  # host ids as the NIC arrays number them
            bandwidth = replace(self.link_bandwidth_bytes_per_s, host=self.host)
            object.__setattr__(self, "latency_s", latency.shifted(self.message_overhead_s, 0.0))
            object.__setattr__(self, "bandwidth_bytes_per_s", bandwidth.capped(
                self.nic_egress_bytes_per_s, self.nic_ingress_bytes_per_s, np.inf))
            return
        other_host = self.host[:, None] != self.host[None, :]
        cap = np.minimum(self.nic_egress_bytes_per_s[self.host][:, None],
                         self.nic_ingress_bytes_per_s[self.host][None, :])
        bandwidth = np.where(other_host, np.minimum(self.link_bandwidth_bytes_per_s, cap),
                             self.link_bandwidth_bytes_per_s).astype(float)
        latency = np.asarray(self.link_latency_s, dtype=float) + self.message_overhead_s
        np.fill_diagonal(latency, 0.0)
        np.fill_diagonal(bandwidth, np.inf)
        object.__setattr__(self, "latency_s", latency)
        object.__setattr__(self, "bandwidth_bytes_per_s", bandwidth)

    # -- one message -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.host.shape[0]

    @property
    def hosts(self) -> int:
        return self.nic_egress_bytes_per_s.shape[0]

    @property
    def has_shared_nics(self) -> bool:
        """Whether any host's devices share a NIC (then concurrent messages between hosts queue)."""
        return bool(self._nic_egress.any() or self._nic_ingress.any())

    def busy_s(self, a, b, message_bytes):
        """How long a message holds its resources (the wire time, ``n / bandwidth``); vectorised."""
        return message_bytes / self.bandwidth_bytes_per_s[a, b]

    def transfer_s(self, a, b, message_bytes):
        """Time of one message alone on the network: ``latency + n / bandwidth``; vectorised."""
        return comm.p2p_time_s(message_bytes, self.latency_s[a, b], self.bandwidth_bytes_per_s[a, b])

    def transfer_matrix_s(self, message_bytes: float) -> np.ndarray:
        """``N x N`` times of one message of ``message_bytes`` over every directed pair (0 on the diagonal)."""
        times = comm.p2p_time_s(message_bytes, np.asarray(self.latency_s), np.asarray(self.bandwidth_bytes_per_s))
        np.fill_diagonal(times, 0.0)
        return times

    def transfer_holds(self, a: int, b: int, message_bytes: float) -> list:
        """(resource, seconds held) of one message from ``a`` to ``b``: the directed link for its
        wire time (``busy_s``), and each shared NIC it crosses for the message's bytes at the NIC's
        own rate, so flows slower than a NIC (a WAN link behind a fast NIC) share it instead of
        taking turns; a NIC slower than the link holds as long as the link."""
        holds = [(("link", int(a), int(b)), float(self.busy_s(a, b, message_bytes)))]
        ha, hb = int(self.host[a]), int(self.host[b])
        if ha != hb:
            if self._nic_egress[ha]:
                holds.append((("egress", ha), float(message_bytes / self.nic_egress_bytes_per_s[ha])))
            if self._nic_ingress[hb]:
                holds.append((("ingress", hb), float(message_bytes / self.nic_ingress_bytes_per_s[hb])))
        return holds

    def ring_nic_rates(self, order) -> list:
        """(NIC, seconds per byte of the ring's per-hop traffic) of every shared NIC a ring over
        ``order`` crosses: each hop that leaves a host goes through its egress NIC and the next
        host's ingress, at that NIC's rate (``ring_nic_holds`` scales it by the bytes)."""
        idx = np.asarray(order, dtype=np.int64)
        if idx.size <= 1:
            return []
        nxt = np.roll(idx, -1)
        ha, hb = self.host[idx], self.host[nxt]
        between = ha != hb
        out_hops = np.bincount(ha[between], minlength=self.hosts)
        in_hops = np.bincount(hb[between], minlength=self.hosts)
        return ([(("egress", int(h)), float(out_hops[h] / self.nic_egress_bytes_per_s[h]))
                 for h in np.flatnonzero(out_hops) if self._nic_egress[h]]
                + [(("ingress", int(h)), float(in_hops[h] / self.nic_ingress_bytes_per_s[h]))
                   for h in np.flatnonzero(in_hops) if self._nic_ingress[h]])

    def ring_nic_holds(self, order, message_bytes: float, ring_s: float, rates=None) -> list:
        """(NIC, seconds held) of a ring all-reduce of ``message_bytes`` over ``order`` lasting
        ``ring_s``: every hop that leaves a host sends ``2(k-1)/k * n`` bytes (Patarasuk & Yuan 2009)
        through the NICs it crosses, so a NIC is held for those bytes at its rate, at most ``ring_s``
        (``rates``: ``ring_nic_rates(order)`` when the caller has it)."""
        k = len(order)
        if k <= 1:
            return []
        per_hop = 2.0 * (k - 1) / k * float(message_bytes)
        rates = self.ring_nic_rates(order) if rates is None else rates
        return [(nic, min(per_hop * seconds_per_byte, ring_s)) for nic, seconds_per_byte in rates]

    def ring_nics(self, members) -> tuple:
        """The shared NICs a ring over ``members`` occupies, whatever its order: a ring that spans
        two hosts or more leaves and enters every one of them."""
        return tuple(nic for nic, _ in self.ring_nic_rates(members))

    def nic_busy_s(self, senders, receivers, message_bytes) -> tuple:
        """Per host, the wire time its egress and its ingress NIC spend on one message over each of
        the directed pairs ``senders[k] -> receivers[k]`` (all sent in the same period): (egress,
        ingress) arrays of length ``hosts``, zero where the host has no shared NIC."""
        senders, receivers = np.asarray(senders).ravel(), np.asarray(receivers).ravel()
        message = np.broadcast_to(np.asarray(message_bytes, dtype=float), senders.shape)
        hs, hr = self.host[senders], self.host[receivers]
        between = hs != hr
        egress = np.bincount(hs[between], weights=message[between], minlength=self.hosts)
        ingress = np.bincount(hr[between], weights=message[between], minlength=self.hosts)
        with np.errstate(invalid="ignore"):
            return (np.where(self._nic_egress, egress / self.nic_egress_bytes_per_s, 0.0),
                    np.where(self._nic_ingress, ingress / self.nic_ingress_bytes_per_s, 0.0))

    def fastest_out_bytes_per_s(self) -> np.ndarray:
        """Each device's fastest link to another device (NIC caps included), 0 for a lone device.

        By levels: one row per host (its devices' links to other hosts are alike), the host level
        for a host of two devices or more, and a row of its own for a device with pair entries."""
        bandwidth = self.bandwidth_bytes_per_s
        n = self.size
        if not isinstance(bandwidth, LevelMatrix):
            dense = np.array(bandwidth, dtype=float)
            np.fill_diagonal(dense, 0.0)
            return dense.max(axis=1) if n else np.zeros(0)
        out = np.zeros(n)
        own_row = {a for a, _ in bandwidth.overrides}
        members = {}
        for d, h in enumerate(self.host.tolist()):
            members.setdefault(h, []).append(d)
        for host, group in members.items():
            plain = [d for d in group if d not in own_row]
            if plain:
                row = bandwidth[plain[0], np.arange(n)]
                row[group] = 0.0
                best = max(float(row.max()), float(bandwidth.host_value) if len(group) > 1 else 0.0)
                out[plain] = best
            for d in group:
                if d in own_row:
                    row = bandwidth[d, np.arange(n)]
                    row[d] = 0.0
                    out[d] = row.max()
        return out

    # -- collectives -------------------------------------------------------------------------
    def ring_hops(self, order) -> tuple:
        """Latency and bandwidth of each hop ``order[i] -> order[i+1]`` (cyclic) of a ring; ``order``
        (C, k): C rings at once, each priced alone ((C, k) arrays).

        All hops run at once, so a host's shared NIC is split evenly among the ring's hops that
        leave (or enter) that host.
        """
        idx = np.asarray(order, dtype=np.int64)
        if idx.shape[-1] <= 1:
            return np.zeros(idx.shape[:-1] + (0,)), np.zeros(idx.shape[:-1] + (0,))
        rings = idx.reshape(-1, idx.shape[-1])
        nxt = np.roll(rings, -1, axis=1)
        latency = self.latency_s[rings, nxt]
        bandwidth = np.asarray(self.link_bandwidth_bytes_per_s[rings, nxt], dtype=float)
        ha, hb = self.host[rings], self.host[nxt]
        between = ha != hb
        offset = np.arange(rings.shape[0])[:, None] * self.hosts  # one row of host counts per ring
        size = rings.shape[0] * self.hosts
        out_count = np.bincount((ha + offset)[between], minlength=size).reshape(-1, self.hosts)
        in_count = np.bincount((hb + offset)[between], minlength=size).reshape(-1, self.hosts)
        with np.errstate(divide="ignore"):
            egress = np.where(between & self._nic_egress[ha], self.nic_egress_bytes_per_s[ha]
                              / np.maximum(np.take_along_axis(out_count, ha, axis=1), 1), np.inf)
            ingress = np.where(between & self._nic_ingress[hb], self.nic_ingress_bytes_per_s[hb]
                               / np.maximum(np.take_along_axis(in_count, hb, axis=1), 1), np.inf)
        bandwidth = np.minimum(bandwidth, np.minimum(egress, ingress))
        return latency.reshape(idx.shape), bandwidth.reshape(idx.shape)

    def ring_cost(self, order) -> tuple:
        """(seconds per byte, fixed seconds) of a ring all-reduce over ``order``: its time for ``n``
        bytes is ``n * per_byte + fixed`` (``cost_models.comm.ring_allreduce_time_s``)."""
        latency, bandwidth = self.ring_hops(order)
        return (comm.ring_allreduce_time_s(1.0, np.zeros_like(latency), bandwidth),
                comm.ring_allreduce_time_s(0.0, latency, bandwidth))

    def ring_allreduce_s(self, message_bytes: float, order) -> float:
        """Ring all-reduce of ``message_bytes`` over the devices ``order`` (Patarasuk & Yuan 2009)."""
        latency, bandwidth = self.ring_hops(order)
        return comm.ring_allreduce_time_s(message_bytes, latency, bandwidth)

    def ring_order(self, members, *, improve: bool = True) -> list:
        """A ring order (positions into ``members``, device indices) that keeps slow links out.

        Nearest-neighbour by (bandwidth, -latency) from the first member, then (up to 16 members)
        2-opt improvement of the ring's all-reduce time; ring order is a bottleneck TSP (formulas.md).
        """
        idx = [int(m) for m in members]
        k = len(idx)
        if k <= 2:
            return list(range(k))
        members = np.asarray(idx, dtype=np.int64)
        left = np.ones(k, dtype=bool)
        left[0] = False
        order = [0]
        row = self._score_rows(members)
        for _ in range(k - 1):  # one row of scores at a time: memory linear in k
            score = row(order[-1])
            best = int(np.argmax(np.where(left, score, -np.inf)))  # the first of equal scores: the smallest j
            order.append(best)
            left[best] = False

        def cost(o):
            return self.ring_allreduce_s(1e9, [idx[i] for i in o])

        best_cost = cost(order)
        improved = improve and k <= 16  # 2-opt costs O(k^3) per pass; larger rings keep the greedy order
        while improved:
            improved = False
            for i in range(1, k - 1):
                for j in range(i + 1, k):
                    candidate = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
                    c = cost(candidate)
                    if c < best_cost - 1e-12:
                        order, best_cost, improved = candidate, c, True
        return order

    def _score_rows(self, members: np.ndarray):
        """``row(i)``: the nearest-neighbour score ``bandwidth - 1e-3 latency`` of the links from
        ``members[i]`` to every member. By levels: the (region, region) table's and the host level's
        scores gathered by the members' keys, pair entries put over them (the same numbers)."""
        bandwidth, latency = self.link_bandwidth_bytes_per_s, self.link_latency_s
        if not (isinstance(bandwidth, LevelMatrix) and isinstance(latency, LevelMatrix)
                and np.array_equal(bandwidth.host, latency.host) and np.array_equal(bandwidth.region, latency.region)):
            return lambda i: bandwidth[members[i], members] - 1e-3 * latency[members[i], members]
        table = bandwidth.table - 1e-3 * latency.table
        host_score = bandwidth.host_value - 1e-3 * latency.host_value
        hosts, regions = bandwidth.host[members], bandwidth.region[members]
        position = {int(m): k for k, m in enumerate(members.tolist())}
        pairs = {}  # row position -> (column positions, scores) of its pair entries
        for a, b in set(bandwidth.overrides) | set(latency.overrides):
            if a in position and b in position:
                pairs.setdefault(position[a], []).append((position[b], bandwidth[a, b] - 1e-3 * latency[a, b]))

        def row(i: int) -> np.ndarray:
            score = np.where(hosts == hosts[i], host_score, table[regions[i]][regions])
            for j, value in pairs.get(i, ()):
                score[j] = value
            return score

        return row

    def sharded_exchange_s(self, message_bytes: float, members) -> float:
        """DTFM's sharded all-to-all among ``members`` (``cost_models.comm.sharded_exchange_time_s``)."""
        block = np.ix_(list(members), list(members))
        return comm.sharded_exchange_time_s(message_bytes, self.latency_s[block], self.bandwidth_bytes_per_s[block])

    def parameter_server_s(self, message_bytes: float, members, server: int) -> float:
        """Central parameter server: every other member sends its ``n`` bytes of gradients to
        ``server``, which sends the ``n`` summed bytes back (Li et al., OSDI'14, sec. 3, one server
        node; DTFM's runs: reduce to one rank, then broadcast, dtfm.md sec. 3).

        Each phase lasts its slowest member's ``latency + n / bandwidth``; the messages run at once,
        so a shared NIC is split among those of them that cross it: the server host's ingress (then
        egress) among the members on other hosts, and each other host's egress (then ingress) among
        its members.
        """
        others = np.array([int(m) for m in members if int(m) != int(server)], dtype=np.int64)
        if others.size == 0:
            return 0.0
        server = int(server)
        phases = 0.0
        for to_server in (True, False):
            a, b = (others, np.full_like(others, server)) if to_server else (np.full_like(others, server), others)
            phases += float(np.max(comm.p2p_time_s(message_bytes, self.latency_s[a, b], self._shared_bandwidth(a, b))))
        return phases

    def _shared_bandwidth(self, senders: np.ndarray, receivers: np.ndarray) -> np.ndarray:
        """Bandwidth of each of the messages ``senders[k] -> receivers[k]`` sent at once: its link's,
        capped by each shared NIC it crosses split evenly among the messages crossing that NIC."""
        hs, hr = self.host[senders], self.host[receivers]
        between = hs != hr
        out_count = np.bincount(hs[between], minlength=self.hosts)
        in_count = np.bincount(hr[between], minlength=self.hosts)
        bandwidth = self.bandwidth_bytes_per_s[senders, receivers].astype(float)
        with np.errstate(divide="ignore"):
            egress = np.where(between & self._nic_egress[hs],
                              self.nic_egress_bytes_per_s[hs] / np.maximum(out_count[hs], 1), np.inf)
            ingress = np.where(between & self._nic_ingress[hr],
                               self.nic_ingress_bytes_per_s[hr] / np.maximum(in_count[hr], 1), np.inf)
        return np.minimum(bandwidth, np.minimum(egress, ingress))

    def parameter_server_of(self, members) -> int:
        """The member (a device index) that serves ``members`` fastest as their parameter server
        (``parameter_server_s`` of 1 GB; ties: the first listed, ``fastest_servers``)."""
        return self.fastest_servers(members)[0]

    def fastest_servers(self, members) -> list:
        """The members (device indices) that serve ``members`` fastest as their parameter server, all
        equally (``parameter_server_s`` of 1 GB, within a relative 1e-12), in ``members``' order."""
        members = [int(m) for m in members]
        seconds = np.array([self.parameter_server_s(1e9, members, m) for m in members])
        return [m for m, t in zip(members, seconds) if t <= seconds.min() * (1.0 + 1e-12)]

    def spread_servers(self, fastest) -> list:
        """One parameter server per stage (``fastest``: each stage's ``fastest_servers``): the first
        on a host that serves no stage before it, else the first. Servers of stages that sync at
        about the same time then do not queue for one host's shared NIC: on
        ``benchmarks/estimate_syncs.py``'s instance 58, two stages served from one host simulated
        4.784 s, from two hosts 4.347 s."""
        servers, serving = [], set()
        for candidates in fastest:
            server = next((m for m in candidates if int(self.host[m]) not in serving), candidates[0])
            servers.append(int(server))
            serving.add(int(self.host[server]))
        return servers

    def host_groups(self, order) -> list:
        """``order``'s members by host, hosts in order of first appearance, each host's members in
        ``order``'s order (the first, the host's lead, in a hierarchical all-reduce)."""
        by_host = {}
        for m in order:
            by_host.setdefault(int(self.host[int(m)]), []).append(int(m))
        return list(by_host.values())

    def _star_s(self, message_bytes: float, lead: int, group: list, to_lead: bool) -> float:
        """Every member of ``group`` but ``lead`` sends ``n`` bytes to ``lead`` at once (or ``lead``
        to each of them): the slowest message's ``latency + n / bandwidth``."""
        others = np.array([m for m in group if m != lead], dtype=np.int64)
        if others.size == 0:
            return 0.0
        leads = np.full_like(others, lead)
        a, b = (others, leads) if to_lead else (leads, others)
        return float(np.max(comm.p2p_time_s(message_bytes, self.latency_s[a, b], self._shared_bandwidth(a, b))))

    def hierarchical_allreduce_s(self, message_bytes: float, order) -> float:
        """Two-level all-reduce (Jia et al. 2018, arXiv 1807.11205, sec. 4.2): each host's members
        send their ``n`` bytes to the host's lead (its first member in ``order``), the leads run a
        ring all-reduce in ``order``'s order (Patarasuk & Yuan 2009), then each lead sends the sum
        back to its host's members. Inside a host the messages run at once (the slowest one's
        ``latency + n / bandwidth``); each phase waits for the slowest host."""
        groups = self.host_groups(order)
        inside = max(self._star_s(message_bytes, g[0], g, True) + self._star_s(message_bytes, g[0], g, False)
                     for g in groups)
        return inside + self.ring_allreduce_s(message_bytes, [g[0] for g in groups])

    def sync_s(self, sync: Sync, message_bytes: float, order, server: int | None = None) -> float:
        """Seconds of one gradient sync of ``message_bytes`` among the devices ``order`` (the plan's
        ring order) by ``sync``; ``server``: the parameter server's device index."""
        if len(order) <= 1:
            return 0.0
        if sync == Sync.RING:
            return self.ring_allreduce_s(message_bytes, order)
        if sync == Sync.SHARDED:
            return self.sharded_exchange_s(message_bytes, order)
        if sync == Sync.HIERARCHICAL:
            return self.hierarchical_allreduce_s(message_bytes, order)
        return self.parameter_server_s(message_bytes, order, order[0] if server is None else server)

    def sync_flows(self, sync: Sync, order, message_bytes: float, server: int | None = None) -> tuple:
        """The directed messages of one gradient sync by ``sync``: (senders, receivers, bytes) arrays.

        Ring: ``2 (k - 1) / k * n`` over each hop of ``order`` (Patarasuk & Yuan 2009); sharded:
        ``2 n / k`` between every ordered pair (Yuan et al. 2022, sec. 3.2); parameter server: ``n``
        from every member to the server and back; hierarchical: ``n`` from each host member to its
        lead and back, and the ring's bytes among the leads. Every algorithm sends ``2 (k - 1) n`` in
        all; they differ in which links and NICs carry it."""
        order = [int(m) for m in order]
        k, n = len(order), float(message_bytes)
        pairs = []
        if k > 1 and sync == Sync.RING:
            pairs = [(a, b, 2.0 * (k - 1) / k * n) for a, b in zip(order, order[1:] + order[:1])]
        elif k > 1 and sync == Sync.SHARDED:  # k (k - 1) pairs: built as arrays, not one tuple each
            members = np.array(order, dtype=np.int64)
            a, b = np.repeat(members, k), np.tile(members, k)
            other = a != b
            return a[other], b[other], np.full(int(other.sum()), 2.0 * n / k)
        elif k > 1 and sync == Sync.PARAMETER_SERVER:
            server = order[0] if server is None else int(server)
            pairs = [p for m in order if m != server for p in ((m, server, n), (server, m, n))]
        elif k > 1:
            groups = self.host_groups(order)
            pairs = [p for g in groups for m in g[1:] for p in ((m, g[0], n), (g[0], m, n))]
            leads = [g[0] for g in groups]
            h = len(leads)
            if h > 1:
                pairs += [(a, b, 2.0 * (h - 1) / h * n) for a, b in zip(leads, leads[1:] + leads[:1])]
        senders = np.array([p[0] for p in pairs], dtype=np.int64)
        receivers = np.array([p[1] for p in pairs], dtype=np.int64)
        return senders, receivers, np.array([p[2] for p in pairs], dtype=float)

    def sync_holds(self, sync: Sync, order, message_bytes: float, sync_s: float, server: int | None = None,
                   *, links: bool = True) -> list:
        """(resource, seconds held) of one gradient sync by ``sync`` lasting ``sync_s``: every link
        its messages use for the whole sync, and each shared NIC they cross for their bytes through
        it at the NIC's rate, at most ``sync_s`` (the ring: ``ring_nic_holds``). ``links`` False: the
        NICs' holds only (a sharded sync of ``k`` members uses ``k (k - 1)`` links)."""
        senders, receivers, sizes = self.sync_flows(sync, order, message_bytes, server)
        holds = {("link", int(a), int(b)): float(sync_s) for a, b in zip(senders, receivers)} if links else {}
        if sync == Sync.RING:
            holds.update(dict(self.ring_nic_holds(order, message_bytes, sync_s)))
            return list(holds.items())
        egress, ingress = self.nic_busy_s(senders, receivers, sizes) if sizes.size else ((), ())
        holds.update({("egress", h): min(float(t), sync_s) for h, t in enumerate(egress) if t > 0})
        holds.update({("ingress", h): min(float(t), sync_s) for h, t in enumerate(ingress) if t > 0})
        return list(holds.items())

    def ring_order_of(self, members) -> list:
        """``members`` (device indices) in the order ``ring_order`` chooses."""
        return [members[i] for i in self.ring_order(members)]
