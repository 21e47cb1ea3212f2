"""Calibration files: what ``plan calibrate`` measured on real devices and links, and how the
planner uses it.

A calibration replaces, for each device type it measured, the catalog's default ``efficiency``
(achieved / peak FLOP/s of a transformer block's forward and backward at the plan's shapes),
and, where it was measured (a host with two or more devices of the type), the catalog's
``tensor_block_issue`` (``tensor_block_issue_s``: the least time a tensor group's block takes per
micro-batch, ``cost_models.comm.tensor_block_issue_s``) and adds the group's block timed at a few
micro-batches per degree (``tensor_block_s``, degree -> micro-batch -> seconds, which the cost model
interpolates for groups of a timed degree, ``cost_models.comm.measured_tensor_block_s``), and both
again for a group that receives its input (``tensor_block_received_issue_s``,
``tensor_block_received_s``: a later stage's group, which ``plan launch --compile auto`` runs
compiled but not as CUDA graphs, ``planner.runtime.graphs``) where they were timed apart; adds ``head_efficiency`` (the same for the
LM head and loss, often far lower: a large, odd-sized vocabulary and a memory-bound softmax) and,
where they were measured, ``recompute_efficiency`` (the same for a block that recomputes its
forward in backward, counted at 4 forwards' FLOPs; a compiled block's recomputation costs less than
the 4/3 of a plain block the FLOPs say) and ``split_backward_efficiency`` (the same for a block run
as ZB-H1 runs it: eager linear layers whose weight gradients wait,
``planner.runtime.split_backward``); and replaces ``memory_bandwidth`` (the optimizer step's
effective bytes/s; the compression codecs keep the type's own, ``Device.codec_bandwidth``). Its
``network`` section holds measured latency and bandwidth matrices between named devices, which a
topology can use instead of typed numbers (``network: {calibration: FILE}``). A plan made with a
calibration records its path and hash, and ``plan launch`` predicts with the same one or refuses.
"""

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cost_models.flops import training_flops_multiplier
from planner.errors import InputError
from planner.fields import Fields
from planner.io import read_yaml, write_document

__all__ = ["CALIBRATION_FORMAT", "Calibration", "read_calibration", "write_calibration", "apply_calibration",
           "calibration_record", "recorded_calibration", "measured_links", "replan_calibration"]

CALIBRATION_FORMAT = "hetplan-calibration/1"
GRAPHED_VALUES = ("none", "tensor", "all")  # measured.graphs: ``planner.runtime.graphs.Graphed``'s values
# A recomputed block does a plain block's work and one forward more (4/3 of its FLOPs) and takes no less
# time, so its efficiency is at most 4/3 of the plain block's.
_MOST_RECOMPUTE_EFFICIENCY_SHARE = training_flops_multiplier(True) / training_flops_multiplier(False)


@dataclass(frozen=True, kw_only=True, eq=False)
class Calibration:
    path: str
    sha256: str
    measured_at_utc: str
    device_types: dict  # type name -> {"efficiency", "head_efficiency", "memory_bandwidth_bytes_per_s",
    #                                    "recompute_efficiency", "split_backward_efficiency"[, "tensor_block_issue_s",
    #                                    "tensor_block_s": ((degree, ((micro-batch, seconds), ...)), ...),
    #                                    "tensor_block_received_issue_s", "tensor_block_received_s" (the
    #                                    same for a group that receives its input, where timed apart),
    #                                    "compiled": bool, "graphs": "none" | "tensor" | "all" (how the
    #                                    blocks were run, where the file says)]}
    network: dict | None  # {"devices": [...], "latency_s": NxN, "bandwidth_bytes_per_s": NxN} or None
    document: dict


def _how_timed(measured, field: str) -> dict:
    """How ``plan calibrate`` ran the blocks it timed (``measured.compiled``, ``measured.graphs``: the
    ``--compile`` of a launch the timings describe), as far as the file says; the rest of
    ``measured`` is a record for people."""
    if measured is None:
        return {}
    if not isinstance(measured, dict):
        raise InputError(f"must be the mapping 'plan calibrate' writes, got {measured!r}: measure again with "
                         "'plan calibrate'", field=field)
    how = {}
    if "compiled" in measured:
        if not isinstance(measured["compiled"], bool):
            raise InputError(f"must be true or false, got {measured['compiled']!r}: measure again with 'plan calibrate'",
                             field=f"{field}.compiled")
        how["compiled"] = measured["compiled"]
    if "graphs" in measured:
        if measured["graphs"] not in GRAPHED_VALUES:
            raise InputError(f"must be one of {', '.join(GRAPHED_VALUES)}, got {measured['graphs']!r}: measure again "
                             "with 'plan calibrate'", field=f"{field}.graphs")
        how["graphs"] = measured["graphs"]
    return how


def _matrix(value, n: int, field: str, *, positive: bool) -> np.ndarray:
    try:
        array = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"must be a {n} x {n} list of numbers", field=field) from None
    if array.shape != (n, n):
        raise InputError(f"must be {n} x {n} (one row per device), got shape {array.shape}", field=field)
    off = ~np.eye(n, dtype=bool)
    if (positive and np.any(array[off] <= 0)) or np.any(array[off] < 0) or not np.all(np.isfinite(array[off])):
        raise InputError("off-diagonal entries must be finite and " + ("positive" if positive else "non-negative"),
                         field=field)
    return array


def read_calibration(path) -> Calibration:
    """Read and check a calibration file; every problem is an ``InputError`` naming the file and field."""
    source = str(path)
    text = Path(path).read_bytes() if Path(path).is_file() else None
    document = read_yaml(path)
    try:
        if isinstance(document, dict) and "format" not in document and "devices" in document:
            raise InputError("is a topology file, not a calibration: measure one with 'plan calibrate TOPOLOGY -o "
                             "calibration.yaml' and pass that", field="format")
        f = Fields(document, "")
        fmt = f.str("format")
        if fmt != CALIBRATION_FORMAT:
            raise InputError(f"is {fmt!r}, not {CALIBRATION_FORMAT}: measure again with 'plan calibrate'",
                             field="format")
        measured_at = f.str("measured_at_utc")
        types = {}
        for name, entry in (f.raw("device_types", {}) or {}).items():
            e = Fields(entry, f"device_types.{name}")
            types[str(name)] = {"efficiency": e.float("efficiency", high=1.0),
                                "head_efficiency": e.float("head_efficiency", 0.0, high=1.0),
                                "memory_bandwidth_bytes_per_s": e.float("memory_bandwidth_bytes_per_s"),
                                "recompute_efficiency": e.float("recompute_efficiency", 0.0, high=1.0),
                                "split_backward_efficiency": e.float("split_backward_efficiency", 0.0, high=1.0)}
            recompute, plain = types[str(name)]["recompute_efficiency"], types[str(name)]["efficiency"]
            split = types[str(name)]["split_backward_efficiency"]
            if split > plain:
                raise InputError(f"{split!r} would make a block with a split backward faster than a plain one "
                                 f"(efficiency {plain!r}): it may be at most the efficiency; measure again with "
                                 "'plan calibrate'", field=e.path("split_backward_efficiency"))
            if recompute > _MOST_RECOMPUTE_EFFICIENCY_SHARE * plain:
                raise InputError(f"{recompute!r} would make a recomputed block (4 forwards' FLOPs) faster than a plain "
                                 f"one (3 forwards' FLOPs at efficiency {plain!r}): it may be at most 4/3 of the "
                                 "efficiency; measure again with 'plan calibrate'", field=e.path("recompute_efficiency"))
            for prefix in ("tensor_block", "tensor_block_received"):  # received: a later stage's group
                if e.has(f"{prefix}_issue_s"):
                    issue = e.raw(f"{prefix}_issue_s")
                    if isinstance(issue, bool) or not isinstance(issue, (int, float)) or not 0 <= issue < 1:
                        raise InputError(f"must be seconds in [0, 1), got {issue!r}: measure again with "
                                         "'plan calibrate'", field=e.path(f"{prefix}_issue_s"))
                    types[str(name)][f"{prefix}_issue_s"] = float(issue)
                if e.has(f"{prefix}_s"):
                    types[str(name)][f"{prefix}_s"] = _tensor_blocks(e.raw(f"{prefix}_s"), e.path(f"{prefix}_s"))
            types[str(name)].update(_how_timed(e.raw("measured", {}), e.path("measured")))
            e.finish()
        network = None
        if f.has("network"):
            e = Fields(f.raw("network"), "network")
            names = [str(x) for x in e.list("devices")]
            if len(set(names)) != len(names) or len(names) < 2:
                raise InputError("must list at least two distinct device names", field="network.devices")
            n = len(names)
            network = {"devices": names,
                       "latency_s": _matrix(e.raw("latency_s"), n, "network.latency_s", positive=False),
                       "bandwidth_bytes_per_s": _matrix(e.raw("bandwidth_bytes_per_s"), n,
                                                        "network.bandwidth_bytes_per_s", positive=True)}
            overhead = e.raw("message_overhead_s", 0.0)  # 0 where the fitted latency is (a loaded host)
            if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead < 1:
                raise InputError(f"must be seconds in [0, 1), got {overhead!r}", field=e.path("message_overhead_s"))
            network["message_overhead_s"] = float(overhead)
            e.raw("probe", {})
            e.finish()
        for key in ("host", "how", "torch", "backend"):
            f.raw(key, "")
        f.finish()
    except InputError as error:
        raise error.located(source=source) from None
    return Calibration(path=source, sha256=hashlib.sha256(text).hexdigest(), measured_at_utc=measured_at,
                       device_types=types, network=network, document=document)


def _tensor_blocks(value, field: str) -> tuple:
    """``tensor_block_s`` (degree -> micro-batch -> seconds per block) as ((degree, ((micro-batch,
    seconds), ...)), ...), both ascending, or a refusal naming the entry."""
    from planner.plan.tensor import TENSOR_DEGREES

    again = "measure again with 'plan calibrate'"
    if not isinstance(value, dict) or not value:
        raise InputError(f"must map tensor degrees to micro-batch sizes to seconds, e.g. {{2: {{1: 0.003}}}}: {again}",
                         field=field)
    table = []
    for degree, row in value.items():
        t = int(degree) if str(degree).isdigit() else None
        if t not in TENSOR_DEGREES or t < 2:
            raise InputError(f"has degree {degree!r}; a tensor group's degree is 2, 4 or 8: {again}", field=field)
        if not isinstance(row, dict) or not row:
            raise InputError(f"must map micro-batch sizes to seconds, e.g. {{1: 0.003}}: {again}",
                             field=f"{field}.{degree}")
        points = []
        for b, seconds in row.items():
            if not str(b).isdigit() or int(b) < 1:
                raise InputError(f"has micro-batch size {b!r}; sizes are whole numbers from 1: {again}",
                                 field=f"{field}.{degree}")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1:
                raise InputError(f"must be seconds in (0, 1), got {seconds!r}: {again}", field=f"{field}.{degree}.{b}")
            points.append((int(b), float(seconds)))
        table.append((t, tuple(sorted(points))))
    return tuple(sorted(table))


def write_calibration(document: dict, path) -> None:
    write_document(json.loads(json.dumps(document, default=float)), path)


def apply_calibration(topology, calibration: Calibration):
    """``topology`` with the measured efficiencies (blocks, head, recomputed and split-backward blocks) and memory
    bandwidth of every calibrated device type, and its tensor groups' block floor and timed blocks where the
    calibration measured them."""
    devices = []
    for d in topology.devices:
        measured = calibration.device_types.get(d.type_name)
        if measured:
            d = replace(d, efficiency=measured["efficiency"], head_efficiency=measured["head_efficiency"],
                        recompute_efficiency=measured["recompute_efficiency"],
                        split_backward_efficiency=measured["split_backward_efficiency"],
                        memory_bandwidth_bytes_per_s=measured["memory_bandwidth_bytes_per_s"],
                        codec_bandwidth_bytes_per_s=d.codec_bandwidth,
                        tensor_block_issue_s=measured.get("tensor_block_issue_s", d.tensor_block_issue_s),
                        tensor_block_s=measured.get("tensor_block_s", d.tensor_block_s),
                        tensor_block_received_issue_s=measured.get("tensor_block_received_issue_s"),
                        tensor_block_received_s=measured.get("tensor_block_received_s"))
        devices.append(d)
    return replace(topology, devices=tuple(devices))


def calibration_record(calibration: Calibration) -> dict:
    """What a plan keeps of the calibration it was made with (and the tensor-group block floor of each
    device type it measured one for, in seconds)."""
    record = {"path": calibration.path, "sha256": calibration.sha256, "measured_at_utc": calibration.measured_at_utc}
    floors = {name: entry["tensor_block_issue_s"] for name, entry in sorted(calibration.device_types.items())
              if "tensor_block_issue_s" in entry}
    if floors:
        record["tensor_block_issue_s"] = floors
    return record


def recorded_calibration(record: dict, plan_path) -> Calibration:
    """The calibration a plan was made with (its ``calibration`` record): the same file by hash, at
    the recorded path or beside the plan (a plan moved with its calibration), else a refusal in one
    line naming the plan's field."""
    plan_path = Path(plan_path)
    path = Path(record["path"])
    for beside in (plan_path.parent / path, plan_path.parent / path.name):
        if not path.exists() and beside.exists():
            path = beside
    if not path.exists():
        raise InputError(f"names calibration {record['path']}, which is not here: copy it beside the plan or "
                         "plan again without it", source=str(plan_path), field="calibration.path")
    calibration = read_calibration(path)
    if calibration.sha256 != record["sha256"]:
        raise InputError(f"{path} changed since the plan was made (hash differs): plan again with it",
                         source=str(plan_path), field="calibration.sha256")
    return calibration


def replan_calibration(topology, old_record: dict | None, old_plan_path, path=None) -> tuple:
    """(topology, the new plan's calibration record) of a re-plan: the calibration at ``path``, else
    the one the old plan was made with (``old_record``: the same file by hash, ``recorded_calibration``),
    else none; the old plan and the new ones are scored on the same calibrated devices."""
    if path:
        calibration = read_calibration(path)
    elif old_record:
        calibration = recorded_calibration(old_record, old_plan_path)
    else:
        return topology, {}
    return apply_calibration(topology, calibration), calibration_record(calibration)


def measured_links(calibration: Calibration, names: list) -> tuple:
    """(latency_s, bandwidth_bytes_per_s, known) matrices over ``names`` from the calibration's network;
    ``known[i, j]`` is True where the pair was measured."""
    n = len(names)
    latency, bandwidth = np.full((n, n), np.nan), np.full((n, n), np.nan)
    known = np.zeros((n, n), dtype=bool)
    if calibration.network is None:
        return latency, bandwidth, known
    where = {name: k for k, name in enumerate(calibration.network["devices"])}
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j and a in where and b in where:
                latency[i, j] = calibration.network["latency_s"][where[a], where[b]]
                bandwidth[i, j] = calibration.network["bandwidth_bytes_per_s"][where[a], where[b]]
                known[i, j] = True
    return latency, bandwidth, known
