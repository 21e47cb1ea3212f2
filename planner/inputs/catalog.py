"""The device catalog: one YAML file per GPU type under ``topologies/devices/``, each citing its source."""

import functools
from dataclasses import dataclass, field
from importlib import resources

import yaml

from planner.errors import InputError
from planner.fields import Fields, closest
from planner.inputs.units import parse_bandwidth_bytes_per_s, parse_bytes, parse_flops, parse_seconds

__all__ = ["DeviceType", "PRECISIONS", "PRICE_PER_HOUR_USD", "EGRESS_USD_PER_GB", "load_catalog", "device_type",
           "parse_device_type", "peak_for", "runs"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
AUTO = "auto"  # training precision: bf16 where every used device has it, else fp16 (``planner.plan.precision``)

# Default price of one device for one hour, in US dollars: public on-demand list prices per GPU (an
# instance's price divided by its GPUs), or a rental marketplace's typical price for consumer cards.
# A topology overrides them per device group with ``price_per_hour_usd`` (0 for hardware you own).
PRICE_PER_HOUR_USD = {
    "H100-SXM": 2.99,  # Lambda On-Demand Cloud, 8x H100 SXM 80GB instance, $2.99/GPU/h (list price, 2024)
    "A100-80GB": 1.79,  # Lambda On-Demand Cloud, 8x A100 SXM 80GB instance, $1.79/GPU/h (list price, 2024)
    "A100-40GB": 1.29,  # Lambda On-Demand Cloud, 8x A100 SXM 40GB instance, $1.29/GPU/h (list price, 2024)
    "V100-16GB": 0.55,  # Lambda On-Demand Cloud, 8x V100 16GB instance, $4.40/h / 8 (list price, 2024)
    "V100-32GB": 3.90,  # AWS EC2 p3dn.24xlarge, 8x V100 32GB, us-east-1, $31.212/h / 8 (list price, 2024)
    "T4": 0.526,  # AWS EC2 g4dn.xlarge, 1x T4, us-east-1, $0.526/h (list price, 2024)
    "L4": 0.8048,  # AWS EC2 g6.xlarge, 1x L4, us-east-1, $0.8048/h (list price, 2024)
    "A40": 0.44,  # RunPod Secure Cloud, 1x A40 48GB pod, $0.44/h (list price, 2024)
    "RTX-4090": 0.34,  # RunPod Community Cloud, 1x RTX 4090, $0.34/h (typical marketplace price, March 2026)
    "RTX-3090": 0.22,  # RunPod Community Cloud, 1x RTX 3090, $0.22/h (typical marketplace price, March 2026)
    "CPU-core": 0.08925,  # AWS EC2 c7i.large, 2 vCPU = 1 physical core, us-east-1, $0.08925/h (list price, 2024)
}
# Default price of one GB leaving a region for another, in US dollars (0 inside a region): AWS data
# transfer between AWS regions, from us-east-1, $0.02/GB (list price, 2024). A topology sets its
# own with ``network.egress_usd_per_gb`` (one number, or per region pair).
EGRESS_USD_PER_GB = 0.02


@dataclass(frozen=True, kw_only=True)
class DeviceType:
    """A GPU model: datasheet numbers plus calibration factors with their origin."""

    type_name: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict = field(hash=False)  # precision -> dense FLOP/s
    efficiency: float  # achieved / peak on transformer blocks (calibration data)
    efficiency_origin: str
    memory_reserved_bytes: float  # context + allocator slack (calibration data)
    memory_reserved_origin: str
    source: str
    description: str = ""
    price_per_hour_usd: float | None = None  # on-demand price of one device (``PRICE_PER_HOUR_USD``); None: unknown
    # The least seconds a member of a tensor group takes per block and micro-batch, forward and
    # backward (``cost_models.comm.tensor_block_issue_s``; calibration data, 0 where not measured).
    tensor_block_issue_s: float = 0.0
    tensor_block_issue_origin: str = "default, not measured: no floor"

    def __post_init__(self):
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.type_name}: memory_bytes must be positive")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"{self.type_name}: efficiency must lie in (0, 1]")
        if not 0 <= self.tensor_block_issue_s < 1:
            raise ValueError(f"{self.type_name}: tensor_block_issue must lie in [0, 1) seconds")


def runs(peak_flops: dict, precision: str) -> bool:
    """Whether a device with this per-precision table can train in ``precision``: bf16 needs a bf16
    entry (V100 and T4 have none); fp16 storage and fp32 run everywhere."""
    return precision != "bf16" or "bf16" in peak_flops


def peak_for(peak_flops: dict, precision: str) -> float:
    """Peak dense FLOP/s at ``precision`` from a per-precision table; a missing entry (tf32, or fp16
    on a part without fp16 tensor cores) falls back to fp32. ``auto`` is the 16-bit format the
    device would run under the ``auto`` rule: bf16 where it has it, else fp16. bf16 on a device
    without it is not a speed but an impossible plan (``runs``)."""
    if precision == AUTO:
        precision = "bf16" if "bf16" in peak_flops else "fp16"
    if not runs(peak_flops, precision):
        raise ValueError(f"no bf16 on this device (peak table {sorted(peak_flops)})")
    if precision in peak_flops:
        return peak_flops[precision]
    return peak_flops["fp32"]


def parse_device_type(document, *, source: str) -> DeviceType:
    """Read one catalog entry (the document of a ``topologies/devices/*.yaml`` file)."""
    f = Fields(document, "")
    peaks = Fields(f.raw("peak_flops"), "peak_flops")
    peak_flops = {p: peaks.quantity(p, parse_flops) for p in PRECISIONS if peaks.has(p)}
    peaks.finish()
    if "fp32" not in peak_flops:
        raise InputError("needs at least an fp32 entry", source=source, field="peak_flops")
    cal = Fields(f.raw("calibration", {}), "calibration")
    result = DeviceType(
        type_name=f.str("type"),
        description=f.str("description", ""),
        memory_bytes=f.quantity("memory", parse_bytes),
        memory_bandwidth_bytes_per_s=f.quantity("memory_bandwidth", parse_bandwidth_bytes_per_s),
        peak_flops=peak_flops,
        source=f.str("source"),
        efficiency=cal.float("efficiency", 0.4, high=1.0),
        efficiency_origin=cal.str("efficiency_origin", "default, not measured"),
        memory_reserved_bytes=cal.quantity("memory_reserved", parse_bytes, 2.0**30),
        memory_reserved_origin=cal.str("memory_reserved_origin", "default, not measured"),
        tensor_block_issue_s=cal.quantity("tensor_block_issue", parse_seconds, 0.0),
        tensor_block_issue_origin=cal.str("tensor_block_issue_origin", "default, not measured: no floor"),
        price_per_hour_usd=PRICE_PER_HOUR_USD.get(f.str("type")),
    )
    cal.finish()
    f.finish()
    return result


@functools.cache
def load_catalog() -> dict:
    """All shipped device types by name (read once, on first use)."""
    catalog = {}
    folder = resources.files("topologies") / "devices"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            try:
                kind = parse_device_type(yaml.safe_load(entry.read_text()), source=entry.name)
            except InputError as error:
                raise error.located(source=f"topologies/devices/{entry.name}") from None
            catalog[kind.type_name] = kind
    return catalog


def device_type(type_name: str) -> DeviceType:
    catalog = load_catalog()
    if type_name not in catalog:
        def fold(name) -> str:  # case and separators, as a user may type a type name
            return str(name).lower().replace("-", "").replace("_", "").replace(" ", "")

        spelled = {fold(name): name for name in catalog}.get(fold(type_name))
        close = closest(type_name, catalog)
        hint = (f" (did you mean {spelled!r}? type names are case-sensitive)" if spelled else
                f" (did you mean {close!r}?)" if close else "")
        raise InputError(f"unknown device type {type_name!r}{hint}: use one of {', '.join(catalog)} "
                         "or give peak_flops and memory explicitly", field="type")
    return catalog[type_name]
