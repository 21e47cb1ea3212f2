"""The device catalog: one YAML file per GPU type under ``topologies/devices/``, each citing its source."""

import functools
from dataclasses import dataclass, field
from importlib import resources

import yaml

from planner.errors import InputError
from planner.fields import Fields
from planner.inputs.units import parse_bandwidth_bytes_per_s, parse_bytes, parse_flops

__all__ = ["DeviceType", "PRECISIONS", "load_catalog", "device_type", "parse_device_type", "peak_for"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


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


def peak_for(peak_flops: dict, precision: str) -> float:
    """Peak dense FLOP/s at ``precision`` from a per-precision table: bf16 runs on fp16 hardware
    where bf16 is missing (V100, T4), and anything else missing falls back to fp32."""
    if precision in peak_flops:
        return peak_flops[precision]
    if precision == "bf16" and "fp16" in peak_flops:
        return peak_flops["fp16"]
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
