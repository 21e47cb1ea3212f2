"""The device catalog: one YAML file per GPU type under ``topologies/devices/``, each citing its source."""

import functools
from dataclasses import dataclass, field
from importlib import resources

import yaml

from planner.errors import InputError
from planner.fields import Fields
from planner.inputs.units import parse_bandwidth_bytes_per_s, parse_bytes, parse_flops

__all__ = ["DeviceType", "PRECISIONS", "load_catalog", "device_type", "parse_device_type", "peak_for", "runs"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
AUTO = "auto"  # training precision: bf16 where every used device has it, else fp16 (``planner.plan.precision``)


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

    def __post_init__(self):
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.type_name}: memory_bytes must be positive")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"{self.type_name}: efficiency must lie in (0, 1]")


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
        raise InputError(f"unknown device type {type_name!r}: use one of {', '.join(catalog)} "
                         "or give peak_flops and memory explicitly", field="type")
    return catalog[type_name]
