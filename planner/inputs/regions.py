"""Entries that name a pair of regions (``network.region_pairs``, ``network.egress_usd_per_gb.pairs``):
``regions: [a, b]`` for both directions, or ``from: a, to: b`` for one (both with ``symmetric: true``)."""

from planner.errors import InputError
from planner.fields import Fields

__all__ = ["region_index", "pair_directions", "some_names"]


def some_names(names, shown: int = 8) -> str:
    """The first few of ``names`` for a message, and how many there are in all."""
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(str(name) for name in names[:shown]) + more


def region_index(value, where: str, regions: dict) -> int:
    """The index of region ``value``; a clear error for a non-string or a region without devices."""
    if not isinstance(value, str) or not value:
        raise InputError(f"expected a region name, got {value!r}", field=where)
    if value not in regions:
        raise InputError(f"region {value!r} has no device: use one of {some_names(regions)}", field=where)
    return regions[value]


def pair_directions(e: Fields, regions: dict) -> tuple:
    """The directed (i, j) region pairs entry ``e`` sets."""
    if e.has("regions"):
        pair = e.list("regions")
        if len(pair) != 2:
            raise InputError("must name exactly two regions", field=e.path("regions"))
        a, b = (region_index(name, e.path("regions"), regions) for name in pair)
        if not e.bool("symmetric", True):
            raise InputError("a 'regions' entry sets both directions: use from/to for one direction",
                             field=e.path("symmetric"))
        return (a, b), (b, a)
    a = region_index(e.str("from"), e.path("from"), regions)
    b = region_index(e.str("to"), e.path("to"), regions)
    return ((a, b), (b, a)) if e.bool("symmetric", False) else ((a, b),)
