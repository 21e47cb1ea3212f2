"""The training precision of a plan, per device type.

A topology asks for ``fp32``, ``bf16``, ``fp16`` or ``auto``. ``auto`` becomes bf16 when every device
the plan uses has bf16 and fp16 (with dynamic loss scaling in the runtime) otherwise, so one V100 or
T4 does not force the whole cluster off bf16 unless the plan puts work on it. The cost model times
each device at the peak of the format it actually runs (``planner.inputs.catalog.peak_for``).
"""

from planner.errors import InputError
from planner.inputs.catalog import AUTO, runs

__all__ = ["check_precision", "check_replan_precision", "resolve_precision", "plan_precision_problem"]


def _without(topology, names, precision: str) -> list:
    return [n for n in names if not runs(topology.devices[topology.index(n)].peak_flops, precision)]


def _describe(topology, names: list) -> str:
    types = sorted({topology.devices[topology.index(n)].type_name or "custom" for n in names})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} device(s) ({shown}; {', '.join(types)})"


def check_precision(topology, training) -> None:
    """Refuse ``precision: bf16`` on a topology with devices that have no bf16."""
    if training.precision != "bf16":
        return
    missing = _without(topology, [d.name for d in topology.devices], "bf16")
    if missing:
        raise InputError(f"bf16, but {_describe(topology, missing)} have no bf16: write 'auto' (bf16 where every "
                         "used device has it, else fp16) or 'fp16', or remove those devices", field="training.precision")


def check_replan_precision(topology, training, old_plan_path) -> None:
    """Refuse a re-plan of a bf16 plan onto a topology with devices that have no bf16 (the precision
    is the old plan's, so the fix is in the topology or in a fresh plan)."""
    if training.precision != "bf16":
        return
    missing = _without(topology, [d.name for d in topology.devices], "bf16")
    if missing:
        raise InputError(f"the old plan {old_plan_path} trains in bf16, but {_describe(topology, missing)} have no "
                         "bf16: remove them from this topology, or plan it afresh with precision auto (fp16 where "
                         "a used device lacks bf16)", field="devices")


def resolve_precision(topology, used_devices, precision: str) -> str:
    """The precision a plan on ``used_devices`` trains in: ``auto`` resolved, anything else as asked."""
    if precision != AUTO:
        return precision
    return "fp16" if _without(topology, list(used_devices), "bf16") else "bf16"


def plan_precision_problem(topology, used_devices, precision: str) -> str | None:
    """Why a plan cannot train in ``precision`` on ``used_devices``, or None."""
    missing = _without(topology, list(used_devices), precision) if precision != AUTO else []
    if missing:
        return (f"{precision}, but {_describe(topology, missing)} in the plan have no {precision}: "
                "plan again with precision auto or fp16")
    return None
