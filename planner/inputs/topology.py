"""The hardware: devices (speed, memory, host, region) and the directed network between them.

``parse_topology`` reads the ``devices`` and ``network`` sections of a topology document into a
frozen ``Topology`` holding N x N matrices of latency (s) and bandwidth (B/s); entry ``[i, j]`` is
the link from device i to device j, so asymmetric networks are first-class.
"""

import functools
import hashlib
import json
from dataclasses import dataclass, field, replace

import numpy as np

from cost_models.links import LevelMatrix, take
from cost_models.network import Network
from planner.inputs.catalog import PRECISIONS, device_type, peak_for
from planner.errors import InputError
from planner.inputs.calibration import measured_links
from planner.inputs.prices import parse_egress, parse_price
from planner.inputs.regions import pair_directions, some_names
from planner.fields import Fields, closest
from planner.inputs.units import check_range, parse_bandwidth_bytes_per_s, parse_bytes, parse_flops, parse_seconds

__all__ = ["Device", "Topology", "parse_topology", "MAX_DEVICES"]

_LEVELS = ("host", "region", "global")
MAX_DEVICES = 16_384  # N x N link matrices: 2 GiB each at this size


@dataclass(frozen=True, kw_only=True)
class Device:
    """One accelerator. Speeds are per precision; calibration factors come from the catalog or the file."""

    name: str
    type_name: str
    memory_bytes: float
    peak_flops: dict = field(hash=False, compare=False)
    efficiency: float
    memory_bandwidth_bytes_per_s: float
    memory_reserved_bytes: float
    host: str
    region: str
    head_efficiency: float = 0.0  # measured efficiency of the LM head and loss; 0: same as the blocks
    price_per_hour_usd: float | None = None  # what one hour of this device costs; None: unknown (custom type)
    tensor_block_issue_s: float = 0.0  # a tensor group member's least time per block (catalog, file or calibration)
    # a tensor group member's block timed by plan calibrate: ((degree, ((micro-batch, seconds), ...)), ...)
    tensor_block_s: tuple = ()
    # the same for a group that receives its input (a later stage, or virtual stages), where
    # ``plan launch --compile auto`` runs the blocks compiled but not as CUDA graphs
    # (planner.runtime.graphs): None where not timed apart (the group is timed one way)
    tensor_block_received_issue_s: float | None = None
    tensor_block_received_s: tuple | None = None
    recompute_efficiency: float = 0.0  # measured efficiency of a recomputed block at 4 forwards' FLOPs; 0: as the blocks
    split_backward_efficiency: float = 0.0  # measured efficiency of ZB-H1's split-backward block; 0: as the blocks
    codec_bandwidth_bytes_per_s: float = 0.0  # what the codecs' shares refer to (codec_bandwidth); 0: memory bandwidth

    @property
    def codec_bandwidth(self) -> float:
        """The memory bandwidth the compression codecs' measured shares refer to
        (``cost_models.compression``): the type's own (catalog or typed), which a calibration's
        optimizer-measured memory bandwidth does not replace (``apply_calibration`` keeps it here)."""
        return self.codec_bandwidth_bytes_per_s or self.memory_bandwidth_bytes_per_s

    @property
    def head_slowdown(self) -> float:
        """How many times longer the head takes than its FLOPs at the blocks' efficiency suggest."""
        return self.efficiency / self.head_efficiency if self.head_efficiency else 1.0

    def block_slowdown(self, recompute: bool | str, split_backward: bool = False) -> float:
        """How many times longer a block's forward and backward take than its FLOPs
        (``cost_models.flops.training_flops_multiplier``) at the blocks' efficiency suggest: 1 without
        recomputation; with it, ``efficiency / recompute_efficiency`` where a calibration measured the
        recomputed block, else 1, the model's 4/3 of a plain block (one more forward, Chen et al. 2016,
        Korthikanti et al. 2022 sec. 4). ``split_backward`` (a ZB-H1 plan, whose blocks run the
        runtime's split backward: eager linear layers, deferred weight gradients) multiplies it by
        ``efficiency / split_backward_efficiency`` where a calibration measured that block, else by 1
        (the two measured apart, their product where both apply). ``recompute`` must be resolved: selective
        recomputation's block runs at the plain block's efficiency (its measured one is full recomputation's)."""
        assert isinstance(recompute, bool) or recompute == "selective", "recompute 'auto': resolve it first"
        full = bool(recompute) and recompute != "selective"
        slowdown = self.efficiency / self.recompute_efficiency if full and self.recompute_efficiency else 1.0
        if split_backward and self.split_backward_efficiency:
            slowdown *= self.efficiency / self.split_backward_efficiency
        return slowdown

    def effective_flops(self, precision: str) -> float:
        """Achieved FLOP/s at ``precision``: peak times the calibrated efficiency."""
        return peak_for(self.peak_flops, precision) * self.efficiency

    def peak_flops_for(self, precision: str) -> float:
        return peak_for(self.peak_flops, precision)


@dataclass(frozen=True, kw_only=True, eq=False)
class Topology:
    """Devices plus directed link matrices (dense ``N x N`` arrays, or ``LevelMatrix`` where the
    network is described by levels) and per-host shared NICs (egress, ingress in B/s)."""

    name: str
    devices: tuple
    latency_s: np.ndarray  # or LevelMatrix
    bandwidth_bytes_per_s: np.ndarray  # or LevelMatrix
    nic_bytes_per_s: dict = field(default_factory=dict)  # host -> (egress, ingress)
    message_overhead_s: float = 0.0  # measured per-message software cost (a calibration's network section)
    sha256: str = ""
    source: str = ""
    egress_usd_per_gb: np.ndarray | None = None  # R x R over ``regions``; None: the catalog's default

    def __post_init__(self):
        n = len(self.devices)
        assert self.latency_s.shape == (n, n) and self.bandwidth_bytes_per_s.shape == (n, n)
        names = tuple(d.name for d in self.devices)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(names)})
        hosts = sorted({d.host for d in self.devices})
        regions = sorted({d.region for d in self.devices})
        host_index = {name: h for h, name in enumerate(hosts)}
        region_index = {name: r for r, name in enumerate(regions)}
        object.__setattr__(self, "host_ids", np.array([host_index[d.host] for d in self.devices], dtype=np.int64))
        object.__setattr__(self, "region_ids", np.array([region_index[d.region] for d in self.devices],
                                                        dtype=np.int64))
        object.__setattr__(self, "hosts", tuple(hosts))
        object.__setattr__(self, "regions", tuple(regions))
        if self.egress_usd_per_gb is None:
            object.__setattr__(self, "egress_usd_per_gb", parse_egress(None, regions))

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> list:
        return list(self._names)

    def index(self, name: str) -> int:
        return self._index[name]

    def has_device(self, name: str) -> bool:
        return name in self._index

    def effective_flops(self, precision: str, devices=None) -> np.ndarray:
        """Each device's FLOP/s at ``precision``; given ``devices`` (an index array), theirs only, in
        its shape: a precision a plan's devices run need not exist on the idle ones."""
        if devices is None:
            return np.array([d.effective_flops(precision) for d in self.devices])
        devices = np.asarray(devices)
        return np.array([self.devices[i].effective_flops(precision) for i in devices.ravel()]).reshape(devices.shape)

    def head_slowdowns(self) -> np.ndarray:
        return np.array([d.head_slowdown for d in self.devices])

    def memory_bandwidths(self) -> np.ndarray:
        """Per device, the memory bandwidth (the optimizer step's)."""
        return np.array([d.memory_bandwidth_bytes_per_s for d in self.devices])

    def codec_bandwidths(self) -> np.ndarray:
        """Per device, ``Device.codec_bandwidth``."""
        return np.array([d.codec_bandwidth for d in self.devices])

    def block_slowdowns(self, recompute: bool, split_backward: bool = False) -> np.ndarray:
        """Per device, ``Device.block_slowdown``: a block's FLOPs count this many times."""
        return np.array([d.block_slowdown(recompute, split_backward) for d in self.devices])

    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes - d.memory_reserved_bytes for d in self.devices])

    def nic_of(self, host: str):
        return self.nic_bytes_per_s.get(host)

    def on_devices(self, members, devices=None) -> "Topology":
        """The topology of the devices ``members`` (indices), their links as they were (a network
        described by levels stays so, ``cost_models.links.take``) and the NICs; ``devices`` (one per
        member) in their place where given (a tensor group's lead standing for the group)."""
        members = np.asarray(members, dtype=np.int64)
        devices = tuple(self.devices[i] for i in members.tolist()) if devices is None else tuple(devices)
        return type(self)(name=self.name, devices=devices, latency_s=take(self.latency_s, members),
                          bandwidth_bytes_per_s=take(self.bandwidth_bytes_per_s, members),
                          nic_bytes_per_s=dict(self.nic_bytes_per_s), message_overhead_s=self.message_overhead_s,
                          sha256=self.sha256, source=self.source)

    @functools.cached_property
    def network(self) -> Network:
        """The one network model of these devices (``cost_models.network``), built once."""
        egress = np.full(len(self.hosts), np.inf)
        ingress = np.full(len(self.hosts), np.inf)
        for h, name in enumerate(self.hosts):
            nic = self.nic_of(name)
            if nic:
                egress[h], ingress[h] = nic
        return Network(link_latency_s=self.latency_s, link_bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
                       host=self.host_ids, nic_egress_bytes_per_s=egress, nic_ingress_bytes_per_s=ingress,
                       message_overhead_s=self.message_overhead_s)


def _parse_peak(value, where: str) -> dict:
    if isinstance(value, dict):
        f = Fields(value, where)
        result = {p: f.quantity(p, parse_flops) for p in PRECISIONS if f.has(p)}
        f.finish()
        if not result:
            raise InputError("give at least one of fp32, tf32, fp16, bf16", field=where)
        result.setdefault("fp32", min(result.values()))
        return result
    flops = parse_flops(value, field=where)
    return {p: flops for p in PRECISIONS}


def _parse_devices(entries) -> list:
    if not isinstance(entries, list) or not entries:
        raise InputError("expected a non-empty list of devices", field="devices")
    devices, total, entry_of = [], 0, {}
    for position, entry in enumerate(entries):
        where = f"devices[{position}]"
        f = Fields(entry, where)
        count = f.int("count", 1)
        total += count
        if total > MAX_DEVICES:
            raise InputError(f"brings the device count to {total}, above the {MAX_DEVICES} this planner handles: "
                             "lower the counts", field=f.path("count"))
        per_host = f.int("gpus_per_host", 0, minimum=0)
        name = f.str("name", None)
        type_name = f.str("type", None)
        if name is None and type_name is None:
            raise InputError("give a name or a type", field=where)
        base = name or type_name
        if type_name is not None:
            try:
                kind = device_type(type_name)
            except InputError as error:
                raise error.located(field_prefix=where) from None
            peak, memory, eff = dict(kind.peak_flops), kind.memory_bytes, kind.efficiency
            mem_bw, reserved = kind.memory_bandwidth_bytes_per_s, kind.memory_reserved_bytes
            price, issue = kind.price_per_hour_usd, kind.tensor_block_issue_s
        else:
            peak = memory = price = None
            eff, mem_bw, reserved, issue = 0.4, 1e12, 2.0**30, 0.0
        if f.has("price_per_hour_usd"):
            price = parse_price(f.raw("price_per_hour_usd"), field=f.path("price_per_hour_usd"))
        if f.has("peak_flops"):
            peak = _parse_peak(f.raw("peak_flops"), f.path("peak_flops"))
        if peak is None:
            raise f.missing("peak_flops", "give a catalog 'type' or 'peak_flops'", instead=("type",))
        memory = f.quantity("memory", parse_bytes, memory)
        if memory is None:
            raise f.missing("memory", "give a catalog 'type' or 'memory'", instead=("type",))
        eff = f.float("efficiency", eff, high=1.0)
        mem_bw = f.quantity("memory_bandwidth", parse_bandwidth_bytes_per_s, mem_bw)
        reserved = f.quantity("memory_reserved", parse_bytes, reserved)
        issue = f.quantity("tensor_block_issue", parse_seconds, issue)
        if issue >= 1.0:
            raise InputError(f"is {issue:g} s, which no block takes: give the time of one block, e.g. 3ms",
                             field=f.path("tensor_block_issue"))
        if reserved >= memory:
            raise InputError("memory_reserved is not below memory: lower it", field=f.path("memory_reserved"))
        host = f.str("host", None)
        region = f.str("region", "default")
        f.finish()
        for i in range(count):
            dev_name = f"{base}-{i}" if count > 1 else base
            if dev_name in entry_of:
                first = entry_of[dev_name]
                named = f"devices[{first}] makes it too" if first != position else "this entry makes it twice"
                raise InputError(f"device name {dev_name!r} appears twice ({named}): names must be unique, "
                                 "rename one entry", field=f.path("name") if name else f.path("type"))
            entry_of[dev_name] = position
            if per_host:
                dev_host = f"{host or base}-h{i // per_host}"
            else:
                dev_host = host or dev_name
            devices.append(Device(name=dev_name, type_name=type_name or "custom", memory_bytes=memory,
                                  peak_flops=peak, efficiency=eff, memory_bandwidth_bytes_per_s=mem_bw,
                                  memory_reserved_bytes=reserved, host=dev_host, region=region,
                                  price_per_hour_usd=price, tensor_block_issue_s=issue))
    return devices


def _link(document, where: str) -> tuple:
    f = Fields(document, where)
    latency = f.quantity("latency", parse_seconds)
    bandwidth = f.quantity("bandwidth", parse_bandwidth_bytes_per_s)
    f.finish()
    return latency, bandwidth


def _matrix(f: Fields, n: int) -> tuple:
    m = Fields(f.raw("matrix"), f.path("matrix"))
    lat_unit = m.str("latency_unit", "ms")
    bw_unit = m.str("bandwidth_unit", "Gbps")
    lat_scale = parse_seconds(f"1{lat_unit}", field=m.path("latency_unit"))
    bw_scale = parse_bandwidth_bytes_per_s(f"1{bw_unit}", field=m.path("bandwidth_unit"))
    result = []
    for key, scale, positive in (("latency", lat_scale, False), ("bandwidth", bw_scale, True)):
        rows = m.list(key)
        if len(rows) != n or any(not isinstance(row, list) or len(row) != n for row in rows):
            shape = f"{len(rows)} rows of lengths {sorted({len(r) if isinstance(r, list) else 0 for r in rows})}"
            raise InputError(f"must be {n} x {n} (one row and column per device), got {shape}", field=m.path(key))
        for i, row in enumerate(rows):
            for j, cell in enumerate(row):
                if isinstance(cell, bool) or not isinstance(cell, (int, float)):
                    raise InputError(f"holds {cell!r}, not a number: write a plain number (its unit is {key}_unit)",
                                     field=f"{m.path(key)}[{i}][{j}]")
        array = np.array(rows, dtype=float)
        off = ~np.eye(n, dtype=bool)
        if not np.all(np.isfinite(array)):
            raise InputError("holds a value that is not a finite number", field=m.path(key))
        bad = (array[off] <= 0) if positive else (array[off] < 0)
        if bad.any():
            raise InputError(f"holds a {'non-positive' if positive else 'negative'} value off the diagonal: "
                             "every link needs a positive bandwidth and non-negative latency", field=m.path(key))
        array = array * scale
        array[np.eye(n, dtype=bool)] = 0.0  # the diagonal is ignored (a device to itself)
        check_range(array, "seconds" if key == "latency" else "bandwidth", field=m.path(key),
                    text="holds a value that")
        result.append(array)
    m.finish()
    return result[0], result[1]


def _calibrated_links(f: Fields, devices: list, latency, bandwidth, calibration) -> tuple:
    """Fill the pairs that a calibration measured; returns (its hash, its per-message overhead)."""
    if calibration is None:
        raise InputError("names a calibration file: load the topology with planner.inputs.job.load_topology, "
                         "which reads it", field="network.calibration")
    if calibration.network is None:
        raise InputError(f"{calibration.path} has no network section: run 'plan calibrate' with 2 or more processes",
                         field="network.calibration")
    lat, bw, known = measured_links(calibration, [d.name for d in devices])
    if not known.any():
        raise InputError(f"{calibration.path} measured {', '.join(calibration.network['devices'])}, none of this "
                         "topology's devices: calibrate with --names", field="network.calibration")
    latency[known], bandwidth[known] = lat[known], bw[known]
    return calibration.sha256, float(calibration.network.get("message_overhead_s", 0.0))


def _region_pairs(f: Fields, regions: dict, table_lat: np.ndarray, table_bw: np.ndarray) -> None:
    """Fill the region-to-region tables from ``network.region_pairs``: one O(1) step per entry."""
    for k, entry in enumerate(f.list("region_pairs", [])):
        e = Fields(entry, f"network.region_pairs[{k}]")
        directions = pair_directions(e, regions)
        lat = e.quantity("latency", parse_seconds)
        bw = e.quantity("bandwidth", parse_bandwidth_bytes_per_s)
        e.finish()
        for i, j in directions:
            table_lat[i, j], table_bw[i, j] = lat, bw


def _level_links(f: Fields, devices: list) -> tuple:
    """Latency and bandwidth (``cost_models.links.LevelMatrix`` each) from the host/region/global
    levels and region pairs: linear in devices plus entries, never N x N."""
    regions = {name: r for r, name in enumerate(dict.fromkeys(d.region for d in devices))}
    region_of = np.array([regions[d.region] for d in devices], dtype=np.int64)
    links = {level: _link(f.raw(level), f.path(level)) for level in _LEVELS if f.has(level)}
    table_lat = np.full((len(regions), len(regions)), np.nan)
    table_bw = np.full((len(regions), len(regions)), np.nan)
    if "global" in links:
        table_lat[:], table_bw[:] = links["global"]
    if "region" in links:
        np.fill_diagonal(table_lat, links["region"][0])
        np.fill_diagonal(table_bw, links["region"][1])
    else:
        np.fill_diagonal(table_lat, np.nan)
        np.fill_diagonal(table_bw, np.nan)
    _region_pairs(f, regions, table_lat, table_bw)
    host_lat, host_bw = links.get("host", (np.nan, np.nan))
    host_index = {name: h for h, name in enumerate(sorted({d.host for d in devices}))}  # as Topology.host_ids
    host_of = np.array([host_index[d.host] for d in devices], dtype=np.int64)
    return (LevelMatrix(host=host_of, region=region_of, host_value=host_lat, table=table_lat, diagonal=0.0),
            LevelMatrix(host=host_of, region=region_of, host_value=host_bw, table=table_bw, diagonal=np.inf))


def _parse_network(document, devices: list, calibration) -> tuple:
    n = len(devices)
    f = Fields(document, "network")
    measured, overhead = "", 0.0
    if f.has("matrix"):
        latency, bandwidth = _matrix(f, n)
    else:
        latency, bandwidth = _level_links(f, devices)
    if f.has("calibration"):  # measured links fill pairs one by one: the dense matrices
        f.str("calibration")
        latency, bandwidth = np.asarray(latency, dtype=float), np.asarray(bandwidth, dtype=float)
        measured, overhead = _calibrated_links(f, devices, latency, bandwidth, calibration)
    index = {d.name: i for i, d in enumerate(devices)}
    pairs = {}  # (a, b) -> (latency, bandwidth), the last entry of a pair wins
    for k, entry in enumerate(f.list("pairs", [])):
        where = f"network.pairs[{k}]"
        e = Fields(entry, where)
        a, b = e.str("from"), e.str("to")
        symmetric = e.bool("symmetric", False)
        lat = e.quantity("latency", parse_seconds)
        bw = e.quantity("bandwidth", parse_bandwidth_bytes_per_s)
        e.finish()
        for name in (a, b):
            if name not in index:
                close = closest(name, index)
                raise InputError(f"unknown device {name!r}" + (f" (did you mean {close!r}?)" if close else "")
                                 + f": use one of {some_names(index)}", field=where)
        for i, j in ([(index[a], index[b]), (index[b], index[a])] if symmetric else [(index[a], index[b])]):
            pairs[(i, j)] = (lat, bw)
    if isinstance(latency, LevelMatrix):
        latency = replace(latency, overrides={ij: lb[0] for ij, lb in pairs.items()})
        bandwidth = replace(bandwidth, overrides={ij: lb[1] for ij, lb in pairs.items()})
    else:
        for (i, j), (lat, bw) in pairs.items():
            latency[i, j], bandwidth[i, j] = lat, bw
    nics = {}
    default_nic = f.quantity("nic", parse_bandwidth_bytes_per_s, None)
    if default_nic is not None:
        nics = {d.host: (default_nic, default_nic) for d in devices}
    host_names = {d.host for d in devices}
    for k, entry in enumerate(f.list("nics", [])):
        where = f"network.nics[{k}]"
        e = Fields(entry, where)
        host = e.str("host")
        if host not in host_names:
            raise InputError(f"host {host!r} has no device: use one of {some_names(sorted(host_names))}", field=where)
        both = e.quantity("bandwidth", parse_bandwidth_bytes_per_s, None)
        egress = e.quantity("egress", parse_bandwidth_bytes_per_s, both)
        ingress = e.quantity("ingress", parse_bandwidth_bytes_per_s, both)
        e.finish()
        if egress is None or ingress is None:
            raise InputError("give bandwidth, or both egress and ingress", field=where)
        nics[host] = (egress, ingress)
    f.finish()
    if isinstance(latency, LevelMatrix):
        missing = latency.first_missing() or bandwidth.first_missing()
    else:
        np.fill_diagonal(latency, 0.0)
        np.fill_diagonal(bandwidth, np.inf)
        nan = np.isnan(latency) | np.isnan(bandwidth)
        missing = np.unravel_index(int(np.argmax(nan)), nan.shape) if nan.any() else None
    if missing is not None:
        i, j = missing
        a, b = devices[i], devices[j]
        level = "host" if a.host == b.host else ("region" if a.region == b.region else "global")
        raise InputError(f"no link from {a.name} (host {a.host}, region {a.region}) to {b.name} "
                         f"(host {b.host}, region {b.region}): add network.{level}"
                         + (" or a region_pairs entry" if level == "global" else ""), field=f"network.{level}")
    return latency, bandwidth, nics, measured, overhead


def topology_hash(devices_doc, network_doc, measured: str = "") -> str:
    """SHA-256 of the canonical JSON of the devices and network sections (formatting does not matter),
    plus the hash of a calibration file the network takes measured links from."""
    document = {"devices": devices_doc, "network": network_doc}
    if measured:
        document["measured_links_sha256"] = measured
    canonical = json.dumps(document, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_topology(document: dict, *, name: str = "topology", source: str = "", calibration=None) -> Topology:
    """Build a ``Topology`` from the ``devices`` and ``network`` sections of a parsed document.

    ``calibration``: the file that ``network.calibration`` names, already read
    (``planner.inputs.job.load_topology`` does that); its measured links replace typed ones.
    """
    if "devices" not in document:
        raise InputError("is missing: list the devices", field="devices")
    if "network" not in document:
        raise InputError("is missing: describe the links (levels host/region/global or a matrix)", field="network")
    devices = _parse_devices(document["devices"])
    network = document["network"]
    egress = None
    if isinstance(network, dict) and "egress_usd_per_gb" in network:  # prices, not links: read apart
        network = {k: v for k, v in network.items() if k != "egress_usd_per_gb"}
        egress = parse_egress(document["network"]["egress_usd_per_gb"], sorted({d.region for d in devices}))
    latency, bandwidth, nics, measured, overhead = _parse_network(network, devices, calibration)
    return Topology(name=name, devices=tuple(devices), latency_s=latency, bandwidth_bytes_per_s=bandwidth,
                    nic_bytes_per_s=nics, message_overhead_s=overhead, egress_usd_per_gb=egress, sha256=topology_hash(document["devices"], document["network"], measured),
                    source=source)
