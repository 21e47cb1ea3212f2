"""The plan file: a plan as a name-keyed document (never positions), read back and written atomically."""

import json
import re
from dataclasses import asdict

from cost_models.compression import MAX_POWERSGD_RANK
from planner.errors import InputError
from planner.fields import Fields
from planner.inputs.model import SCHEDULES
from planner.io import read_yaml, write_document
from planner.plan.dims import Compression, GradientCompression, MessageCompression, Schedule, Sync
from planner.plan.plan import Plan

__all__ = ["PLAN_FORMAT_VERSION", "plan_to_document", "plan_from_document", "write_plan", "read_plan"]

PLAN_FORMAT_VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# degrees: the names written now, and those of earlier files (stages, replicas) with what each must equal.
# (``idle_devices`` is checked against the topology with ``idle`` itself, by the launch.)
_DEGREES = {"pipeline": "stages", "data": "replicas", "tensor": "tensor", "stages": "stages", "replicas": "replicas"}


def plan_to_document(plan: Plan, *, model=None, training=None, topology_source: str = "") -> dict:
    """A plain, name-keyed mapping of ``plan`` (what ``-o`` writes and ``--format json`` prints)."""
    S = plan.stages
    doc = {
        "format_version": PLAN_FORMAT_VERSION,
        "topology": {"name": plan.topology_name, "sha256": plan.topology_sha256, "path": topology_source},
        "degrees": {"pipeline": plan.degrees.pipeline, "data": plan.degrees.data, "tensor": plan.degrees.tensor,
                    "idle_devices": len(plan.idle)},
        "schedule": plan.schedule,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch": plan.global_batch,
        "sync": plan.sync,
        "stages": [{"index": s, **_stage_layers(plan, s), "devices": plan.stage_devices(s), "ring": plan.ring(s),
                    **({"server": plan.server(s)} if plan.sync_servers else {})} for s in range(S)],
        "replicas": [{"index": r, "micro_batches": plan.micro_batches[r], "devices": list(plan.assignment[r]),
                      **({"recompute": list(plan.recompute[r])} if plan.recompute else {})}
                     for r in range(plan.replicas)],
        "idle": list(plan.idle),
    }
    if plan.virtual_stages != 1:  # interleaved 1F1B: each stage's chunks in ``stages[].chunks``
        doc["virtual_stages"] = plan.virtual_stages
    if plan.warmup_depth != 1:  # 1F1B with more warm-up forwards: min(k (S - s - 1), M) on stage s
        doc["warmup_depth"] = plan.warmup_depth
    if plan.sync_every != 1:  # local steps: data-parallel sync once every this many iterations
        doc["sync_every"] = plan.sync_every
    if plan.sync_groups:  # local steps: replicas that sync every iteration, as groups of replica indices
        doc["sync_groups"] = [list(g) for g in plan.sync_groups]
    if plan.micro_batches_per_round:  # accumulation rounds: each replica's micro-batches in rounds of this many
        doc["micro_batches_per_round"] = plan.micro_batches_per_round
    if plan.compression.active:  # lossy: messages between stages in int8, gradients by PowerSGD
        doc["compression"] = {"messages": str(plan.compression.messages),
                              "gradients": str(plan.compression.gradients), "rank": plan.compression.rank}
        if plan.compression.boundaries is not None:  # only these stage boundaries' messages in int8
            doc["compression"]["boundaries"] = list(plan.compression.boundaries)
    if plan.tensor_groups:  # each a stage's devices in one host, lead first (the lead names it in the lists above)
        doc["tensor_groups"] = [list(group) for group in plan.tensor_groups]
    if model is not None:
        doc["model"] = asdict(model)
    if training is not None:
        doc["training"] = {k: v for k, v in asdict(training).items() if k != "split_backward_measured"}
    if plan.prediction is not None:
        p = plan.prediction
        doc["prediction"] = {
            "iteration_s": p.iteration_s, "breakdown_s": dict(p.breakdown_s), "tokens_per_s": p.tokens_per_s,
            "achieved_flops": p.achieved_flops, "mfu": p.mfu, "cost_model": str(p.cost_model),
            "memory": {d: {"used_bytes": p.memory_bytes[d], "capacity_bytes": p.capacity_bytes[d]}
                       for d in p.memory_bytes},
        }
    if plan.search:
        doc["search"] = dict(plan.search)
    if plan.calibration:
        doc["calibration"] = dict(plan.calibration)
    return json.loads(json.dumps(doc, default=float))


def _stage_layers(plan: Plan, stage: int) -> dict:
    """A stage's layers ``[first, end)``, or with virtual stages each chunk's, by name."""
    if plan.virtual_stages == 1:
        return {"layers": [plan.layer_bounds[stage], plan.layer_bounds[stage + 1]]}
    return {"chunks": [{"chunk": c, "layers": [first, end]} for c, (first, end) in enumerate(plan.chunk_layers(stage))]}


def _layer_range(e: Fields) -> list:
    layers = e.list("layers")
    if len(layers) != 2 or not all(isinstance(x, int) for x in layers):
        raise InputError("must be [first, end) as two whole numbers", field=e.path("layers"))
    return layers


def _piece_bounds(stage_ranges: list, virtual_stages: int) -> list:
    """The model's piece bounds from each stage's chunk ranges (chunk c of stage s is piece c S + s);
    the pieces must be contiguous in that order."""
    S = len(stage_ranges)
    bounds = []
    for piece in range(S * virtual_stages):
        c, s = divmod(piece, S)
        first, end = stage_ranges[s][c]
        if bounds and bounds[-1] != first:
            if virtual_stages == 1:
                raise InputError(f"starts at layer {first}, but the stage before it ends at {bounds[-1]}: stages "
                                 f"must be contiguous, so start it at {bounds[-1]} (or plan again)",
                                 field=f"stages[{s}].layers")
            before_c, before_s = divmod(piece - 1, S)
            raise InputError(f"starts at {first}, but the piece before it (chunk {before_c} of stage {before_s}) ends "
                             f"at {bounds[-1]}: chunk c of stage s follows chunk c of stage s - 1, and the first "
                             "stage's chunk c + 1 the last stage's chunk c", field=f"stages[{s}].chunks[{c}].layers")
        bounds = bounds or [first]
        bounds.append(end)
    return bounds


def plan_from_document(document, *, source: str = "plan") -> Plan:
    """Read a plan mapping back (names, not positions); structural errors are ``InputError``s."""
    try:
        if isinstance(document, dict) and "format_version" not in document and "devices" in document:
            raise InputError("is a topology file, not a plan: write a plan with 'plan TOPOLOGY -o plan.yaml' and "
                             "pass that", field="format_version")
        f = Fields(document, "")
        version = f.int("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise InputError(f"version {version} is not {PLAN_FORMAT_VERSION}: plan again with this version",
                             field="format_version")
        topo = Fields(f.raw("topology"), "topology")
        sha256 = topo.raw("sha256", "")
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            raise InputError(f"must be the 64-hex-digit hash of the topology the plan was made for, got {sha256!r}: "
                             "plan again (the launch checks the topology by it)", field="topology.sha256")
        stages = f.list("stages")
        replicas = f.list("replicas")
        virtual_stages = f.int("virtual_stages", 1)
        ranges, rings, stage_devices, servers = [], [], [], []
        for k, entry in enumerate(stages):
            e = Fields(entry, f"stages[{k}]")
            if virtual_stages == 1:
                ranges.append([_layer_range(e)])
            else:
                chunks = e.list("chunks")
                if len(chunks) != virtual_stages:
                    raise InputError(f"lists {len(chunks)} chunks, but virtual_stages is {virtual_stages}: list one "
                                     "per virtual stage", field=e.path("chunks"))
                stage_chunks = []
                for c, chunk in enumerate(chunks):
                    ce = Fields(chunk, e.path(f"chunks[{c}]"))
                    if ce.int("chunk", minimum=0) != c:
                        raise InputError(f"must be {c} (chunks in order)", field=ce.path("chunk"))
                    stage_chunks.append(_layer_range(ce))
                    ce.finish()
                ranges.append(stage_chunks)
            stage_devices.append(e.list("devices"))
            rings.append(e.list("ring", []))
            servers.append(e.raw("server", None))
            _check_index(e, k)
            e.finish()
        assignment, micro_batches, recompute = [], [], []
        for k, entry in enumerate(replicas):
            e = Fields(entry, f"replicas[{k}]")
            assignment.append(tuple(str(d) for d in e.list("devices")))
            micro_batches.append(e.int("micro_batches"))
            recompute.append(tuple(str(m) for m in e.list("recompute", [])))
            _check_index(e, k)
            e.finish()
        _check_stage_devices(stage_devices, assignment)
        bounds = _piece_bounds(ranges, virtual_stages)
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
        sync_servers = _servers(servers, position)
        plan = Plan(
            layer_bounds=tuple(bounds), assignment=tuple(assignment), micro_batches=tuple(micro_batches),
            micro_batch_size=f.int("micro_batch_size"), schedule=Schedule(f.str("schedule", choices=SCHEDULES)),
            ring_orders=tuple(ring_orders), sync=Sync(f.str("sync", "ring", choices=tuple(Sync))),
            sync_servers=sync_servers,
            topology_name=str(topo.raw("name", "")), topology_sha256=str(topo.raw("sha256", "")),
            idle=tuple(f.list("idle", [])), search=f.raw("search", {}), calibration=_calibration(f),
            tensor_groups=_tensor_groups(f, assignment), sync_every=f.int("sync_every", 1),
            sync_groups=_sync_groups(f),
            micro_batches_per_round=f.int("micro_batches_per_round", 0, minimum=0),
            compression=_compression(f), virtual_stages=virtual_stages,
            warmup_depth=f.int("warmup_depth", 1, minimum=1),
            recompute=tuple(recompute) if any(recompute) else (),
        )
        topo.raw("path", "")
        topo.finish()
        _check_derived(f, plan)
        for key in ("model", "training", "prediction"):
            f.raw(key, None)
        f.finish()
        return plan
    except InputError as error:
        raise error.located(source=source) from None

def _servers(servers: list, position: dict) -> tuple:
    """Each stage's parameter server (a device name in the file) as its replica index; () if none names one."""
    if all(name is None for name in servers):
        return ()
    result = []
    for s, name in enumerate(servers):
        if name is None or (s, name) not in position:
            raise InputError(f"{'is missing' if name is None else f'names {name!r}, not a device of this stage'}: "
                             "a parameter-server sync needs one of each stage's devices as its server",
                             field=f"stages[{s}].server")
        result.append(position[(s, name)])
    return tuple(result)


def _compression(f: Fields) -> Compression:
    """The plan's ``compression`` mapping (absent: nothing compressed)."""
    if not f.has("compression"):
        return Compression()
    c = Fields(f.raw("compression"), "compression")
    switches = {}
    for key, kind in (("messages", MessageCompression), ("gradients", GradientCompression)):
        value = c.raw(key, "off")  # YAML reads a bare off as false
        switches[key] = "off" if value is False else c.str(key, "off", choices=tuple(kind))
    rank = c.int("rank", 4)
    if rank > MAX_POWERSGD_RANK:
        raise InputError(f"must be at most {MAX_POWERSGD_RANK}, got {rank}", field="compression.rank")
    boundaries = c.raw("boundaries", None)
    if boundaries is not None and (not isinstance(boundaries, list) or
                                   any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in boundaries)):
        raise InputError(f"must list stage boundaries as whole numbers from 0, got {boundaries!r}",
                         field="compression.boundaries")
    c.finish()
    return Compression(**switches, rank=rank, boundaries=None if boundaries is None else tuple(boundaries))


def _check_index(e: Fields, k: int) -> None:
    index = e.raw("index", None)
    if index is not None and index != k:
        raise InputError(f"is {index!r} but this is entry {k} of the list: the list order is the index; "
                         "plan again rather than editing", field=e.path("index"))


def _check_stage_devices(stage_devices: list, assignment: list) -> None:
    """``stages[s].devices`` restates column s of the replicas' devices; an edit of one alone is refused."""
    for s, listed in enumerate(stage_devices):
        expected = [row[s] if s < len(row) else None for row in assignment]
        if [str(d) for d in listed] != expected:
            raise InputError(f"lists {listed} but the replicas' devices put {expected} in this stage: the replicas "
                             "decide; make both agree or plan again", field=f"stages[{s}].devices")


def _check_derived(f: Fields, plan: Plan) -> None:
    """``degrees`` and ``global_batch`` follow from the rest of the plan: refuse one edited alone."""
    actual = {"stages": plan.stages, "replicas": plan.replicas, "tensor": plan.degrees.tensor}
    global_batch = f.raw("global_batch", None)
    if global_batch is not None and global_batch != plan.global_batch:
        raise InputError(f"is {global_batch!r} but micro_batch_size x the replicas' micro_batches = "
                         f"{plan.global_batch}: the replicas decide; make both agree or plan again",
                         field="global_batch")
    degrees = f.raw("degrees", None)
    if degrees is None:
        return
    d = Fields(degrees, "degrees")
    d.raw("idle_devices", None)
    for key, source in _DEGREES.items():
        value = d.raw(key, None)
        if value is not None and value != actual[source]:
            raise InputError(f"is {value!r} but the plan has {actual[source]} ({source}): the stages, replicas and "
                             "idle lists decide; make both agree or plan again", field=f"degrees.{key}")
    d.finish()


def _tensor_groups(f: Fields, assignment: list) -> tuple:
    """``tensor_groups``: lists of device names, each led by a device the replicas name; a device in
    one group only. Whether a group may be one (host, type, degree) is ``validate_plan``'s check."""
    groups, seen = [], set()
    leads = {name for row in assignment for name in row}
    for k, entry in enumerate(f.list("tensor_groups", [])):
        where = f"tensor_groups[{k}]"
        if not isinstance(entry, list) or len(entry) < 2 or not all(isinstance(n, str) for n in entry):
            raise InputError("must list two or more device names, the lead first", field=where)
        if entry[0] not in leads:
            raise InputError(f"its lead {entry[0]!r} is no replica's device: list the lead first", field=where)
        twice = [name for name in entry if name in seen or entry.count(name) > 1]
        if twice or any(name in leads for name in entry[1:]):
            name = (twice or [n for n in entry[1:] if n in leads])[0]
            raise InputError(f"device {name!r} is in two places: a device runs in one tensor group of one stage",
                             field=where)
        seen.update(entry)
        groups.append(tuple(entry))
    return tuple(groups)


def _sync_groups(f: Fields) -> tuple:
    """``sync_groups``: lists of replica indices; whether they partition the replicas is
    ``validate_plan``'s check (``planner.plan.sync_groups``)."""
    groups = []
    for k, entry in enumerate(f.list("sync_groups", [])):
        if not isinstance(entry, list) or not entry or \
                not all(isinstance(r, int) and not isinstance(r, bool) for r in entry):
            raise InputError("must list one or more replica indices (whole numbers), e.g. [0, 1]",
                             field=f"sync_groups[{k}]")
        groups.append(tuple(entry))
    return tuple(groups)


def _calibration(f: Fields) -> dict:
    if not f.has("calibration"):
        return {}
    c = Fields(f.raw("calibration"), "calibration")
    record = {"path": c.str("path"), "sha256": c.str("sha256"), "measured_at_utc": c.str("measured_at_utc", "")}
    if c.has("tensor_block_issue_s"):  # per device type, seconds (``planner.inputs.calibration``)
        floors = c.raw("tensor_block_issue_s")
        field = c.path("tensor_block_issue_s")
        if not isinstance(floors, dict) or not floors:
            raise InputError("must map device types to seconds, e.g. {H100-SXM: 0.00315}", field=field)
        for name, value in floors.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InputError(f"must be seconds in [0, 1), got {value!r}: plan again with the calibration",
                                 field=f"{field}.{name}")
        record["tensor_block_issue_s"] = {str(name): float(value) for name, value in floors.items()}
    c.finish()
    return record


def write_plan(document: dict, path) -> None:
    """Write a plan document to ``path`` (``.yaml`` or ``.json``), atomically."""
    write_document(document, path)


def read_plan(path) -> tuple:
    """(Plan, raw document) from a ``.yaml`` or ``.json`` plan file (JSON is YAML)."""
    document = read_yaml(path)
    return plan_from_document(document, source=str(path)), document
