"""Prices in a topology file: a device group's ``price_per_hour_usd`` and the network's
``egress_usd_per_gb`` between regions (defaults: ``planner.inputs.catalog``)."""

import math

import numpy as np

from planner.errors import InputError
from planner.fields import Fields
from planner.inputs.catalog import EGRESS_USD_PER_GB
from planner.inputs.regions import pair_directions

__all__ = ["parse_price", "parse_egress", "MAX_PRICE_USD"]

MAX_PRICE_USD = 1e6  # per device-hour or per GB: anything above is a typo (cents written as dollars x 100...)


def parse_price(value, *, field: str, unit: str = "US dollars per device-hour") -> float:
    """A price: a plain number of dollars, 0 or more (0: hardware you own, or free traffic)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " without the unit or the $ sign" if isinstance(value, str) else ""
        raise InputError(f"expected a number of {unit}, got {value!r}: write it as a plain number{hint}, e.g. 2.5",
                         field=field)
    if not math.isfinite(value) or value < 0 or value > MAX_PRICE_USD:
        raise InputError(f"must be a number of {unit} from 0 to {MAX_PRICE_USD:g}, got {value!r}", field=field)
    return float(value)


def parse_egress(value, regions: list) -> np.ndarray:
    """The ``R x R`` table of dollars per GB sent from region i to region j (0 on the diagonal).

    ``value`` is the file's ``network.egress_usd_per_gb``: None (the catalog's default between any
    two regions), one number (every pair of regions), or ``{default: X, pairs: [...]}`` where each
    pair is ``{regions: [a, b], usd_per_gb: Y}`` (both directions) or ``{from: a, to: b, usd_per_gb: Y}``.
    """
    where = "network.egress_usd_per_gb"
    index = {name: i for i, name in enumerate(regions)}
    pairs = []
    if value is None:
        default = EGRESS_USD_PER_GB
    elif isinstance(value, dict):
        f = Fields(value, where)
        default = parse_price(f.raw("default", EGRESS_USD_PER_GB), field=f.path("default"), unit="US dollars per GB")
        entries = f.list("pairs", [])
        f.finish()
        for k, entry in enumerate(entries):
            e = Fields(entry, f"{where}.pairs[{k}]")
            directions = pair_directions(e, index)
            price = parse_price(e.raw("usd_per_gb"), field=e.path("usd_per_gb"), unit="US dollars per GB")
            e.finish()
            pairs += [(i, j, price) for i, j in directions]
    else:
        default = parse_price(value, field=where, unit="US dollars per GB")
    table = np.full((len(regions), len(regions)), default)
    for i, j, price in pairs:
        table[i, j] = price
    np.fill_diagonal(table, 0.0)
    return table
