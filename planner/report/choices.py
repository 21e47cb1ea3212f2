"""Plans side by side in time and dollars: the chosen plan's price, the time / $ front, the K best."""

from collections import Counter

import numpy as np

__all__ = ["render_dollars", "render_entries", "devices_summary", "format_usd"]


def format_usd(value: float) -> str:
    """Dollars with enough digits to tell cheap iterations apart ($0.00891, $12.40)."""
    return f"${value:.2f}" if value >= 10 else f"${value:.4g}"


def devices_summary(plan, topology) -> str:
    """``4 (2 RTX-4090, 2 RTX-3090)``: how many devices the plan uses, by type."""
    types = Counter(topology.devices[topology.index(name)].type_name for name in plan.used_devices)
    return f"{len(plan.used_devices)} ({', '.join(f'{n} {t}' for t, n in types.most_common())})"


def _egress_prices(topology) -> str:
    table = topology.egress_usd_per_gb
    off = table[~np.eye(len(table), dtype=bool)]
    if off.size == 0:
        return "one region, no egress"
    if np.all(off == off[0]):
        return f"egress ${off[0]:g}/GB between regions (network.egress_usd_per_gb)"
    return f"egress ${off.min():g} to ${off.max():g}/GB by region pair (network.egress_usd_per_gb)"


def render_dollars(dollars, topology, *, charge_idle: bool) -> str:
    """The chosen plan's price per iteration, per million tokens and per hour, and what it counts."""
    charged = ("every device of the topology (--charge-idle)" if charge_idle
               else "the used devices only; idle devices cost nothing (--charge-idle charges them)")
    egress = _egress_prices(topology)
    return (f"Cost: {format_usd(dollars.usd_per_iteration)} per iteration = {format_usd(dollars.device_usd)} "
            f"device time ({dollars.devices_charged} devices at {format_usd(dollars.usd_per_hour)}/h) + "
            f"{format_usd(dollars.egress_usd)} egress ({dollars.egress_bytes / 1e9:.3f} GB between regions); "
            f"{format_usd(dollars.usd_per_million_tokens)} per million tokens\n"
            f"  (device prices: {charged}; {egress})")


def render_entries(entries: list, topology, title: str, *, files: list = ()) -> str:
    """A table of pool entries (``planner.search.pareto.PoolEntry``), with the file each was written to."""
    header = ["#", "stages x replicas", "iteration", "$ / iteration", "$ / M tokens", "egress $", "devices used"]
    if files:
        header.append("plan file")
    rows = []
    for rank, entry in enumerate(entries, 1):
        plan, d = entry.plan, entry.dollars
        row = [rank, f"{plan.stages} x {plan.replicas}", f"{entry.iteration_s:.3f} s", format_usd(d.usd_per_iteration),
               format_usd(d.usd_per_million_tokens), format_usd(d.egress_usd), devices_summary(plan, topology)]
        if files:
            row.append(files[rank - 1])
        rows.append(row)
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([title, line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
