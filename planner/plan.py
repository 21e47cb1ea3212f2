"""The plan: which device runs which (replica, stage), the layer split, the batch split, the
schedule, and the prediction. Serialised with names, never positions; one ``validate_plan``."""

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from planner.errors import InputError
from planner.fields import Fields
from planner.model import SCHEDULES

__all__ = ["Plan", "Prediction", "validate_plan", "plan_to_document", "plan_from_document", "write_plan",
           "read_plan", "PLAN_FORMAT_VERSION"]

PLAN_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the cost model predicts for a plan (seconds, bytes, FLOP/s)."""

    iteration_s: float
    breakdown_s: dict
    tokens_per_s: float
    achieved_flops: float
    mfu: float
    memory_bytes: dict  # device name -> predicted peak bytes
    capacity_bytes: dict  # device name -> device memory
    cost_model: str = "simulator"

    @property
    def fits(self) -> bool:
        return all(self.memory_bytes[d] <= self.capacity_bytes[d] for d in self.memory_bytes)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """``assignment[r][s]`` names the device of replica r, stage s; stage s holds layers
    ``[layer_bounds[s], layer_bounds[s+1])``; replica r runs ``microbatches[r]`` micro-batches of
    ``micro_batch_size`` sequences; ``ring_orders[s]`` orders stage s's replicas in its all-reduce ring."""

    layer_bounds: tuple
    assignment: tuple
    microbatches: tuple
    micro_batch_size: int
    schedule: str
    ring_orders: tuple = ()
    sync: str = "ring"
    topology_name: str = ""
    topology_sha256: str = ""
    idle: tuple = ()
    prediction: Prediction | None = None
    search: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)  # path, sha256, measured_at_utc of the calibration used

    @property
    def stages(self) -> int:
        return len(self.layer_bounds) - 1

    @property
    def replicas(self) -> int:
        return len(self.assignment)

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * sum(self.microbatches)

    def stage_devices(self, stage: int) -> list:
        return [self.assignment[r][stage] for r in range(self.replicas)]

    def ring(self, stage: int) -> list:
        order = self.ring_orders[stage] if self.ring_orders else range(self.replicas)
        return [self.assignment[r][stage] for r in order]

    def with_prediction(self, prediction: Prediction) -> "Plan":
        return replace(self, prediction=prediction)


def validate_plan(plan: Plan, topology, model, training) -> None:
    """Check every invariant of ``plan`` against its inputs; raise ``InputError`` naming the broken one.

    Each device at most once and known to the topology; stages contiguous and covering all layers;
    micro-batch counts positive and adding up to the global batch; ring orders permutations; the
    topology hash matching; and, where the plan carries a prediction, memory fitting on every device.
    """
    S, R = plan.stages, plan.replicas
    bounds = list(plan.layer_bounds)
    if S < 1 or bounds[0] != 0 or bounds[-1] != model.layers:
        raise InputError(f"stages must cover layers 0..{model.layers}, got bounds {bounds}", field="stages")
    if any(b >= c for b, c in zip(bounds, bounds[1:])):
        raise InputError(f"every stage needs at least one layer, in order; got bounds {bounds}", field="stages")
    if R < 1 or any(len(row) != S for row in plan.assignment):
        raise InputError(f"every replica needs exactly {S} devices, one per stage", field="replicas")
    used = [d for row in plan.assignment for d in row]
    for name in used:
        if not topology.has_device(name):
            raise InputError(f"device {name!r} is not in topology {topology.name}", field="replicas")
    if len(set(used)) != len(used):
        twice = sorted({d for d in used if used.count(d) > 1})
        raise InputError(f"device {twice[0]} is used more than once", field="replicas")
    if len(plan.microbatches) != R or any(m < 1 for m in plan.microbatches):
        raise InputError("every replica needs a positive micro-batch count", field="replicas.micro_batches")
    if plan.micro_batch_size < 1 or plan.global_batch != training.global_batch:
        raise InputError(f"micro-batches x size = {plan.global_batch} sequences, but the global batch is "
                         f"{training.global_batch}", field="micro_batch_size")
    if plan.schedule not in SCHEDULES:
        raise InputError(f"schedule {plan.schedule!r} is not one of {', '.join(SCHEDULES)}", field="schedule")
    if plan.ring_orders and (len(plan.ring_orders) != S or
                             any(sorted(order) != list(range(R)) for order in plan.ring_orders)):
        raise InputError("each stage's ring must list each of its replicas once", field="stages.ring")
    if plan.topology_sha256 and plan.topology_sha256 != topology.sha256:
        raise InputError("the plan was made for another topology (hash differs): plan again", field="topology.sha256")
    if plan.prediction is not None and not plan.prediction.fits:
        worst = max(plan.prediction.memory_bytes,
                    key=lambda d: plan.prediction.memory_bytes[d] / plan.prediction.capacity_bytes[d])
        raise InputError(f"device {worst} needs {plan.prediction.memory_bytes[worst] / 1e9:.2f} GB of "
                         f"{plan.prediction.capacity_bytes[worst] / 1e9:.2f} GB", field="memory")


def plan_to_document(plan: Plan, *, model=None, training=None, topology_source: str = "") -> dict:
    """A plain, name-keyed mapping of ``plan`` (what ``-o`` writes and ``--format json`` prints)."""
    S = plan.stages
    doc = {
        "format_version": PLAN_FORMAT_VERSION,
        "topology": {"name": plan.topology_name, "sha256": plan.topology_sha256, "path": topology_source},
        "degrees": {"stages": S, "replicas": plan.replicas, "idle_devices": len(plan.idle)},
        "schedule": plan.schedule,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch": plan.global_batch,
        "sync": plan.sync,
        "stages": [{"index": s, "layers": [plan.layer_bounds[s], plan.layer_bounds[s + 1]],
                    "devices": plan.stage_devices(s), "ring": plan.ring(s)} for s in range(S)],
        "replicas": [{"index": r, "micro_batches": plan.microbatches[r], "devices": list(plan.assignment[r])}
                     for r in range(plan.replicas)],
        "idle": list(plan.idle),
    }
    if model is not None:
        doc["model"] = asdict(model)
    if training is not None:
        doc["training"] = asdict(training)
    if plan.prediction is not None:
        p = plan.prediction
        doc["prediction"] = {
            "iteration_s": p.iteration_s, "breakdown_s": dict(p.breakdown_s), "tokens_per_s": p.tokens_per_s,
            "achieved_flops": p.achieved_flops, "mfu": p.mfu, "cost_model": p.cost_model,
            "memory": {d: {"used_bytes": p.memory_bytes[d], "capacity_bytes": p.capacity_bytes[d]}
                       for d in p.memory_bytes},
        }
    if plan.search:
        doc["search"] = dict(plan.search)
    if plan.calibration:
        doc["calibration"] = dict(plan.calibration)
    return json.loads(json.dumps(doc, default=float))


def plan_from_document(document, *, source: str = "plan") -> Plan:
    """Read a plan mapping back (names, not positions); structural errors are ``InputError``s."""
    try:
        f = Fields(document, "")
        version = f.int("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise InputError(f"version {version} is not {PLAN_FORMAT_VERSION}: plan again with this version",
                             field="format_version")
        topo = Fields(f.raw("topology"), "topology")
        stages = f.list("stages")
        replicas = f.list("replicas")
        bounds, rings = [], []
        for k, entry in enumerate(stages):
            e = Fields(entry, f"stages[{k}]")
            layers = e.list("layers")
            if len(layers) != 2 or not all(isinstance(x, int) for x in layers):
                raise InputError("must be [first, end) as two whole numbers", field=e.path("layers"))
            if bounds and bounds[-1] != layers[0]:
                raise InputError("stages must be contiguous", field=e.path("layers"))
            bounds = bounds or [layers[0]]
            bounds.append(layers[1])
            e.list("devices")
            rings.append(e.list("ring", []))
            e.raw("index", None)
            e.finish()
        assignment, microbatches = [], []
        for k, entry in enumerate(replicas):
            e = Fields(entry, f"replicas[{k}]")
            assignment.append(tuple(str(d) for d in e.list("devices")))
            microbatches.append(e.int("micro_batches"))
            e.raw("index", None)
            e.finish()
        position = {}
        for r, row in enumerate(assignment):
            for s, name in enumerate(row):
                position[(s, name)] = r
        ring_orders = []
        for s, ring in enumerate(rings):
            if not ring:
                ring_orders = []
                break
            if any((s, name) not in position for name in ring):
                raise InputError("names a device that is not in this stage", field=f"stages[{s}].ring")
            ring_orders.append(tuple(position[(s, name)] for name in ring))
        plan = Plan(
            layer_bounds=tuple(bounds), assignment=tuple(assignment), microbatches=tuple(microbatches),
            micro_batch_size=f.int("micro_batch_size"), schedule=f.str("schedule", choices=SCHEDULES),
            ring_orders=tuple(ring_orders), sync=f.str("sync", "ring", choices=("ring", "sharded")),
            topology_name=str(topo.raw("name", "")), topology_sha256=str(topo.raw("sha256", "")),
            idle=tuple(f.list("idle", [])), search=f.raw("search", {}), calibration=_calibration(f),
        )
        topo.raw("path", "")
        topo.finish()
        for key in ("degrees", "global_batch", "model", "training", "prediction"):
            f.raw(key, None)
        f.finish()
        return plan
    except InputError as error:
        raise error.located(source=source) from None


def _calibration(f: Fields) -> dict:
    if not f.has("calibration"):
        return {}
    c = Fields(f.raw("calibration"), "calibration")
    record = {"path": c.str("path"), "sha256": c.str("sha256"), "measured_at_utc": c.str("measured_at_utc", "")}
    c.finish()
    return record


def write_plan(document: dict, path) -> None:
    """Write atomically (temp file in the same folder + rename): never a half-written plan.

    ``.json`` gives JSON; ``.yaml``/``.yml`` YAML; anything else is refused.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = json.dumps(document, indent=2) + "\n"
    elif suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(document, sort_keys=False, width=120)
    else:
        raise InputError(f"unknown extension {suffix or '(none)'}: name the file .yaml or .json", source=str(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError("its folder does not exist: create it first", source=str(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_plan(path) -> tuple:
    """(Plan, raw document) from a ``.yaml`` or ``.json`` plan file."""
    from planner.job import read_yaml  # JSON is YAML

    document = read_yaml(path)
    return plan_from_document(document, source=str(path)), document
