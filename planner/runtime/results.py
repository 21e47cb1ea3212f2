"""The results file of a run: the measurement and the planner's prediction for the same plan, side
by side, plus a Chrome trace of the measured (and predicted) per-op timelines.

``results.json`` keys: ``plan`` (the plan document), ``run`` (how it ran), ``measured`` (seconds of
this host: per-iteration times as the max over ranks, median, spread, tokens/s, MFU, loss, peak
memory per device, the op trace of the median iteration: per op its start and end on the device's
clock and ``host_s``, the host's seconds issuing it), ``predicted`` (the simulator's iteration
time, memory and op trace, in the plan's seconds) and ``comparison`` (both in this host's seconds:
the prediction times ``run.time_scale``, and ``prediction_error`` = (predicted - measured) / measured).
``straggler`` (``planner.runtime.straggler``): each worker's measured forward and backward seconds
per iteration against the plan's, relative to the other workers', and the straggler found from them
(``device``: None when none; else its members, factor, ``from_iteration`` and ``to_iteration``, the
iterations before and during, ``cost_s`` per iteration and ``lost_s`` in all, the simulator's
iteration with it, the efficiency to re-plan with, and the line the launch printed). Emulated runs
add ``emulation`` (``compute_overrun``: how far this host ran past the plan's compute times, per
rank, and the warning the launch printed; ``slowdown``: the straggler ``--slow`` emulated and
whether the measurements found it). ``run`` says where the run started
(``first_iteration``, ``resumed_from``) and lists the ``checkpoints`` it wrote (iteration, path,
seconds). Elastic launches that lost a rank add ``elastic``: per event the rank and device, the
failure, the checkpoint resumed from, ``lost_s`` (from that checkpoint to the failure: work redone),
``replan_s``, ``restarted_after_s``, the files of the new topology and plan, the re-plan's choice,
reason and moves; the measurement is that of the last plan, from the checkpoint it resumed.
"""

import json
import statistics
from pathlib import Path

from planner.errors import InputError

__all__ = ["RESULTS_FILE", "TRACE_FILE", "RESULTS_FORMAT", "summarise_iterations", "comparison",
           "write_results", "update_results", "read_results", "chrome_trace"]

RESULTS_FILE = "results.json"
TRACE_FILE = "trace.json"
RESULTS_FORMAT = "hetplan-run/1"
_PREDICTED_PID_OFFSET = 10_000


def summarise_iterations(seconds: list) -> dict:
    """Median and spread of per-iteration times (seconds)."""
    ordered = sorted(seconds)
    n = len(ordered)
    return {"iteration_s": list(seconds), "median_s": statistics.median(ordered), "min_s": ordered[0],
            "max_s": ordered[-1], "p10_s": ordered[int(0.1 * (n - 1))], "p90_s": ordered[int(round(0.9 * (n - 1)))],
            "steady_mean_s": sum(ordered) / n}


def comparison(predicted_plan_s: float, time_scale: float, measured_s: float) -> dict:
    predicted = predicted_plan_s * time_scale
    return {"predicted_s": predicted, "measured_s": measured_s,
            "prediction_error": (predicted - measured_s) / measured_s}


def _write_atomically(path: Path, text: str) -> None:
    """Temp file in the same folder, then rename: a full disk leaves neither half a file nor the temp."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(text)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_results(folder, document: dict, trace_events: list) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESULTS_FILE
    _write_atomically(folder / TRACE_FILE, json.dumps({"traceEvents": trace_events, "displayTimeUnit": "ms"}) + "\n")
    _write_atomically(path, json.dumps(document, indent=1) + "\n")
    return path


def update_results(folder, key: str, value) -> Path:
    """Add (or replace) one top-level ``key`` of a run folder's ``results.json``, atomically."""
    path = Path(folder) / RESULTS_FILE
    document = json.loads(path.read_text())
    document[key] = value
    _write_atomically(path, json.dumps(document, indent=1) + "\n")
    return path


def read_results(path) -> dict:
    """A results document from a run folder or its ``results.json``; bad input is an ``InputError``."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"no {RESULTS_FILE} here: pass a folder written by 'plan launch --out'",
                         source=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"not a results file ({error.__class__.__name__}): pass the results.json, or its folder, that "
                         "'plan launch --out' writes", source=str(path)) from None
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise InputError(f"format is not {RESULTS_FORMAT}: rerun 'plan launch' with this version",
                         source=str(path), field="format")
    for key in ("plan", "run", "measured", "predicted", "comparison"):
        if key not in document:
            raise InputError("is missing: the file is incomplete; rerun the launch", source=str(path), field=key)
    return document


def chrome_trace(measured: list, predicted: list, names: dict, time_scale: float) -> list:
    """Chrome-trace events (``chrome://tracing``, Perfetto): one process per rank, measured and predicted.

    ``measured``: dicts with rank, iteration, kind, microbatch, start_s, end_s (iteration-relative);
    ``predicted``: the same without iteration, in the plan's seconds (scaled here by ``time_scale``).
    """
    events = []
    for rank, label in names.items():
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"{label} measured"}})
        events.append({"ph": "M", "name": "process_name", "pid": rank + _PREDICTED_PID_OFFSET,
                       "args": {"name": f"{label} predicted"}})
    offsets = {}
    for op in measured:
        offsets[op["iteration"]] = max(offsets.get(op["iteration"], 0.0), op["end_s"])
    start_of, clock = {}, 0.0
    for iteration in sorted(offsets):
        start_of[iteration] = clock
        clock += offsets[iteration]
    for op in measured:
        events.append(_event(op, op["rank"], start_of[op["iteration"]], 1.0, op["iteration"]))
    for op in predicted:
        events.append(_event(op, op["rank"] + _PREDICTED_PID_OFFSET, 0.0, time_scale, None))
    return events


def _event(op: dict, pid: int, offset_s: float, scale: float, iteration) -> dict:
    name = op["kind"] if op["microbatch"] < 0 else f"{op['kind']} {op['microbatch']}"
    args = {"microbatch": op["microbatch"]}
    if iteration is not None:
        args["iteration"] = iteration
    return {"ph": "X", "name": name, "cat": op["kind"], "pid": pid, "tid": 0,
            "ts": (offset_s + op["start_s"] * scale) * 1e6, "dur": max(op["end_s"] - op["start_s"], 0.0) * scale * 1e6,
            "args": args}
