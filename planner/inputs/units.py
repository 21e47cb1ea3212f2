"""Human units at the YAML boundary -> SI numbers inside.

Users write ``80GB``, ``1.12Gbps``, ``67ms``, ``312TFLOPS``; the rest of the code only ever sees
bytes, bytes per second, seconds and FLOP per second. Decimal prefixes are powers of 1000,
binary prefixes (``GiB``) powers of 1024; ``bps`` counts bits, ``B/s`` bytes.
"""

import math
import re

import numpy as np

from planner.errors import InputError

__all__ = [
    "parse_bytes",
    "parse_bandwidth_bytes_per_s",
    "parse_seconds",
    "parse_flops",
    "parse_quantity",
    "format_bytes",
    "format_seconds",
    "format_flops",
    "format_bandwidth",
    "check_range",
    "RANGES",
]

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_DECIMAL = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

_BYTES = {f"{p}B": f for p, f in _DECIMAL.items() if p != "k"} | {f"{p}B": f for p, f in _BINARY.items()}
_BYTES["kB"] = 1e3
_BANDWIDTH = (
    {f"{p}bps": f / 8.0 for p, f in _DECIMAL.items()}
    | {f"{p}bit/s": f / 8.0 for p, f in _DECIMAL.items()}
    | {f"{p}B/s": f for p, f in _DECIMAL.items()}
    | {f"{p}B/s": f for p, f in _BINARY.items()}
)
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
_FLOPS = {f"{p}FLOPS": f for p, f in _DECIMAL.items() if p != "k"} | {
    f"{p}FLOP/s": f for p, f in _DECIMAL.items() if p != "k"
}

_KINDS = {
    "bytes": (_BYTES, "80GB or 16GiB"),
    "bandwidth": (_BANDWIDTH, "1.12Gbps, 100Gbps or 12.5GB/s"),
    "seconds": (_SECONDS, "67ms or 0.5s"),
    "flops": (_FLOPS, "312TFLOPS"),
}

# What this planner models, in SI units: anything outside is a typo (a wrong unit or exponent), and
# numbers near the float limits (1e-300bps) would turn transfer times into infinities.
RANGES = {
    "bytes": (1.0, 1e18, "1 B to 1 EB"),
    "bandwidth": (125.0, 1e18, "1 kbit/s to 8 Ebit/s"),
    "seconds": (0.0, 3600.0, "0 s to 1 hour"),
    "flops": (1e6, 1e21, "1 MFLOP/s to 1 ZFLOP/s"),
}

_BITS = ("b/s", "bit", "bits", "b", "bits/s", "bit/sec", "b/sec", "bitps", "bs")
_BYTE_RATES = ("Bps", "B", "B/sec", "Byte/s", "Bytes/s", "byte/s", "bytes/s", "Bs")


def check_range(values, kind: str, *, field: str, text: str) -> None:
    """Refuse SI ``values`` (a number or array; 0 passes where zero is allowed) outside ``RANGES[kind]``."""
    low, high, span = RANGES[kind]
    values = np.asarray(values, dtype=float)
    outside = (values != 0) & ((values < low) | (values > high))
    if outside.any():
        raise InputError(f"{text} lies outside {span}, the range this planner models: check the number and the unit",
                         field=field)


def parse_quantity(value, kind: str, *, field: str, allow_zero: bool = False) -> float:
    """Parse ``value`` (a string with a unit) as a quantity of ``kind`` and return SI units.

    Plain numbers are refused (except 0 where ``allow_zero``): a bare ``1.12`` could be Gbit/s or
    GB/s, and guessing is how plans go wrong by a factor of eight.
    """
    table, example = _KINDS[kind]
    if isinstance(value, bool):
        raise InputError(f"expected a {kind} quantity such as {example}, got {value!r}", field=field)
    if isinstance(value, (int, float)):
        if allow_zero and value == 0:
            return 0.0
        raise InputError(f"{value!r} has no unit: write it with one, e.g. {example}", field=field)
    if not isinstance(value, str):
        raise InputError(f"expected a {kind} quantity such as {example}, got {type(value).__name__}", field=field)
    if re.fullmatch(_NUMBER, value.strip()):
        if allow_zero and float(value) == 0:
            return 0.0
        raise InputError(f"{value!r} has no unit: write it with one, e.g. {example}", field=field)
    match = re.fullmatch(_NUMBER + r"\s*([^\d\s.]\S*)", value.strip())
    if not match and re.fullmatch(r"-\s*" + _NUMBER + r"\s*([^\d\s.]\S*)", value.strip()):
        raise InputError(f"{value!r} is negative: give " + ("0 or more" if allow_zero else "a value greater than zero")
                         + f", e.g. {example}", field=field)
    if not match:
        raise InputError(f"cannot read {value!r}: write a number and a unit, e.g. {example}", field=field)
    number, unit = float(match.group(1)), match.group(2)
    if unit not in table:
        hint = _unit_hint(unit, table)
        raise InputError(f"unknown unit {unit!r} in {value!r}{hint}; e.g. {example}", field=field)
    result = number * table[unit]
    if not math.isfinite(result):
        raise InputError(f"{value!r} is not a finite number", field=field)
    if result < 0 or (result == 0 and not allow_zero):
        raise InputError(f"{value!r} must be greater than zero", field=field)
    check_range(result, kind, field=field, text=repr(value))
    return result


def _unit_hint(unit: str, table: dict) -> str:
    """A likely intended unit: the bit or byte rate the spelling shows (``Gb/s`` -> ``Gbps``), else a case fix."""
    if table is _BANDWIDTH:
        prefixes = sorted(set(_DECIMAL) | set(_BINARY), key=len, reverse=True)
        prefix = next((p for p in prefixes if p and unit.startswith(p)), "")
        rest = unit[len(prefix):]
        if rest in _BITS and f"{prefix}bps" in table:
            return f" (did you mean {prefix + 'bps'!r}? b = bit, B = byte)"
        if rest in _BYTE_RATES and f"{prefix}B/s" in table:
            return f" (did you mean {prefix + 'B/s'!r}? b = bit, B = byte)"
    lowered = {u.lower(): u for u in table}
    guess = lowered.get(unit.lower())
    if guess is None:
        return ""
    swaps = ("b" in unit) != ("b" in guess) or ("B" in unit) != ("B" in guess)
    if table is _BANDWIDTH and swaps:  # a case fix must not turn bits into bytes (8x) or back
        prefix = guess[:-3] if guess.endswith(("bps", "B/s")) else guess.split("b")[0]
        return f" (bits or bytes? {prefix + 'bps'!r} for bits, {prefix + 'B/s'!r} for bytes per second)"
    return f" (did you mean {guess!r}? units are case-sensitive: b = bit, B = byte)"


def parse_bytes(value, *, field: str) -> float:
    """Memory size in bytes (``80GB`` = 8e10, ``16GiB`` = 16 * 2**30)."""
    return parse_quantity(value, "bytes", field=field)


def parse_bandwidth_bytes_per_s(value, *, field: str) -> float:
    """Bandwidth in bytes per second (``8Gbps`` = 1e9 B/s)."""
    return parse_quantity(value, "bandwidth", field=field)


def parse_seconds(value, *, field: str, allow_zero: bool = True) -> float:
    """Duration in seconds (``67ms`` = 0.067); zero latency is allowed."""
    return parse_quantity(value, "seconds", field=field, allow_zero=allow_zero)


def parse_flops(value, *, field: str) -> float:
    """Compute rate in FLOP per second (``312TFLOPS`` = 3.12e14)."""
    return parse_quantity(value, "flops", field=field)


def _format(value: float, unit: str, steps: tuple[tuple[float, str], ...]) -> str:
    for factor, prefix in steps:
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def format_bytes(value_bytes: float) -> str:
    return _format(value_bytes, "B", ((2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki")))


def format_flops(value_flops: float) -> str:
    return _format(value_flops, "FLOP/s", ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")))


def format_bandwidth(value_bytes_per_s: float) -> str:
    return _format(value_bytes_per_s * 8, "bit/s", ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")))


def format_seconds(value_s: float) -> str:
    if value_s >= 1:
        return f"{value_s:.3f} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.2f} ms"
    return f"{value_s * 1e6:.1f} us"
