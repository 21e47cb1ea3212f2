"""What a launch needs from disk, read and checked once before any process starts."""

from dataclasses import dataclass, replace
from pathlib import Path

from planner.errors import InputError
from planner.inputs.model import ModelSpec, TrainingSpec, parse_model, parse_training
from planner.plan.plan import Plan, validate_plan
from planner.plan.document import read_plan
from planner.plan.precision import resolve_precision
from planner.inputs.job import load_topology
from planner.inputs.topology import Topology

__all__ = ["RunInputs", "load_run_inputs", "emulated_model"]


@dataclass(frozen=True, kw_only=True, eq=False)
class RunInputs:
    plan: Plan
    plan_document: dict
    plan_path: str
    topology: Topology
    topology_path: str
    model: ModelSpec
    training: TrainingSpec
    calibration: object = None  # the plan's calibration (``planner.inputs.calibration.Calibration``), if any


def _topology_path(plan_path: Path, document: dict, override) -> Path:
    if override:
        return Path(override)
    recorded = str((document.get("topology") or {}).get("path") or "")
    if not recorded:
        raise InputError("names no topology file: pass --topology FILE", source=str(plan_path), field="topology.path")
    candidate = Path(recorded)
    if candidate.exists():
        return candidate
    if candidate.is_absolute():
        raise InputError(f"names {recorded}, which no longer exists: restore it or pass --topology FILE",
                         source=str(plan_path), field="topology.path")
    beside = plan_path.parent / candidate
    if beside.exists():
        return beside
    raise InputError(f"names {recorded}, which is neither there (from {Path.cwd()}) nor beside the plan: run from "
                     "the folder the plan was made in, or pass --topology FILE", source=str(plan_path),
                     field="topology.path")


def load_run_inputs(plan_path, topology_path=None) -> RunInputs:
    """The plan, its topology (``topology.path`` in the plan, or ``topology_path``), model and training.

    Refuses a plan that does not match its topology, lacks its model or training sections, or asks
    for bf16 on a device without it; ``auto`` precision is resolved by the plan's devices.
    """
    plan_path = Path(plan_path)
    plan, document = read_plan(plan_path)
    source = str(plan_path)
    for key in ("model", "training"):
        if not isinstance(document.get(key), dict):
            raise InputError("is missing: write the plan with 'plan TOPOLOGY -o FILE'", source=source, field=key)
    try:
        model = parse_model(document["model"], where="model")
        training = parse_training(document["training"], where="training")
    except InputError as error:
        raise error.located(source=source) from None
    _check_training_agrees(plan, training, source)
    if training.recompute == "auto":  # False, True and "selective" run (``planner.plan.recompute.mode_of``)
        raise InputError("is 'auto', which 'plan' decides: plan again and launch the plan it writes", source=source,
                         field="training.recompute")
    training = replace(training, schedule=plan.schedule, micro_batch_size=plan.micro_batch_size)
    path = _topology_path(plan_path, document, topology_path)
    topology = load_topology(path)
    calibration = None
    if plan.calibration:
        topology, calibration = _calibrated(topology, plan.calibration, plan_path)
    training = replace(training, precision=resolve_precision(topology, plan.used_devices, training.precision))
    try:
        validate_plan(plan, topology, model, training)
    except InputError as error:
        raise error.located(source=source) from None
    _check_idle(plan, document, topology, source)
    for stage in range(plan.stages):
        degrees = sorted({plan.tensor_degree(r, stage) for r in range(plan.replicas)})
        if len(degrees) > 1:  # each member syncs its shard with the same shard of the other replicas
            raise InputError(f"give stage {stage}'s replicas tensor degrees {', '.join(map(str, degrees))}; the "
                             "runtime needs one degree per stage: edit tensor_groups or plan with '--tensor-degrees 1'",
                             source=source, field="tensor_groups")
    return RunInputs(plan=plan, plan_document=document, plan_path=str(plan_path), topology=topology,
                     topology_path=str(path), model=model, training=training, calibration=calibration)


def _check_training_agrees(plan: Plan, training: TrainingSpec, source: str) -> None:
    """The training section may leave schedule and micro-batch size to the search ('auto'); where it
    names them they must be the plan's, or an edit of one would be silently ignored."""
    if training.micro_batch_size and training.micro_batch_size != plan.micro_batch_size:
        raise InputError(f"is {training.micro_batch_size} but the plan's micro_batch_size is {plan.micro_batch_size}: "
                         "make both agree or plan again", source=source, field="training.micro_batch_size")
    if training.schedule != "auto" and training.schedule != plan.schedule:
        raise InputError(f"is {training.schedule} but the plan's schedule is {plan.schedule}: make both agree or "
                         "plan again", source=source, field="training.schedule")


def _check_idle(plan: Plan, document: dict, topology: Topology, source: str) -> None:
    """``idle`` lists exactly the topology's devices that the plan leaves unused; ``degrees.idle_devices``
    counts them."""
    used = set(plan.used_devices)
    expected = [d.name for d in topology.devices if d.name not in used]
    if sorted(map(str, plan.idle)) != sorted(expected):
        extra = sorted(set(map(str, plan.idle)) - set(expected))
        missing = sorted(set(expected) - set(map(str, plan.idle)))
        what = (f"lists {extra[0]}, which is not an unused device of topology {topology.name}" if extra
                else f"leaves out {missing[0]}, which the plan does not use")
        raise InputError(f"{what}: idle must list exactly the unused devices; make it agree or plan again",
                         source=source, field="idle")
    count = (document.get("degrees") or {}).get("idle_devices")
    if count is not None and count != len(expected):
        raise InputError(f"is {count!r} but the plan leaves {len(expected)} device(s) of topology {topology.name} "
                         "unused: make it agree or plan again", source=source, field="degrees.idle_devices")


def _calibrated(topology: Topology, record: dict, plan_path: Path) -> tuple:
    """(the topology, the calibration): apply the calibration the plan was made with, the same file
    (by hash), or a refusal; the tensor-group block floors the plan recorded must be the file's."""
    from planner.inputs.calibration import apply_calibration, calibration_record, recorded_calibration

    calibration = recorded_calibration(record, plan_path)
    measured = calibration_record(calibration).get("tensor_block_issue_s", {})
    recorded = record.get("tensor_block_issue_s", {})
    for type_name in sorted(set(measured) | set(recorded)):
        if measured.get(type_name) != recorded.get(type_name):
            raise InputError(f"is {recorded.get(type_name, 'missing')} but {calibration.path} measured "
                             f"{measured.get(type_name, 'none')} s for {type_name}: plan again with the calibration",
                             source=str(plan_path), field=f"calibration.tensor_block_issue_s.{type_name}")
    return apply_calibration(topology, calibration), calibration


def emulated_model(model: ModelSpec, tensor: int = 1) -> ModelSpec:
    """The reduced model an emulated run really computes: the plan's layers, tiny widths (and as
    many heads as the largest tensor group ``tensor`` splits, at least 2).

    Its compute is a stand-in (the plan's model is timed by sleeping); it keeps data and gradients
    really flowing through every stage and replica.
    """
    return replace(model, name=f"{model.name}-emulated", hidden=32, heads=max(2, tensor), sequence=16, vocabulary=64,
                   ffn_hidden=0)
