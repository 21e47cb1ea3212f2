"""Which device of a run is a straggler, found from what the ranks measured, and what it cost.

Every rank times its compute ops each iteration (``StageExecutor.iteration``'s trace); rank 0 sums
the forward and backward ops of each worker (a plan entry: a device, or a tensor group whose members
wait for each other inside every op, so the slow member cannot be told from the others) and divides
by the plan's prediction of the same ops (``op_compute_s`` times the run's time scale): the worker's
measured / predicted compute. The optimizer step is left out: a sharded optimizer's step all-gathers,
so its time is partly the slowest peer's.

A worker is slow in an iteration when its measured / predicted compute is at least
``STRAGGLER_RATIO`` times the median of the other workers' in that iteration: a prediction wrong for
every device alike, or a host slower than planned, moves every ratio together and names nobody. It
is the straggler when it is slow in ``MIN_SLOW_ITERATIONS`` or more measured iterations in a row
(warm-up iterations are not compared; one iteration alone can be a pause of the host); of several,
the longest run of slow iterations (then the largest factor) is named. Its factor is the median,
over those iterations, of its ratio to the others'; the simulator predicts the iteration with the
worker's compute slowed by the factor; what it cost is the median iteration of those iterations
against the median of the iterations measured before them, or, when it was slow from the first
measured iteration, against an estimate: the measured iteration times the simulator's ratio of the
plan's iteration to the slowed one (a slow device and a stage the plan mispredicts look alike then). To re-plan around it: the device's
efficiency divided by the factor in the topology, then ``plan TOPOLOGY --from PLAN``.

``plan launch --emulate --slow DEVICE:FACTOR[@ITERATION]`` makes one device a straggler
(``planner.runtime.emulation.Slowdown``); the detection is the same as for any run.
"""

import statistics
from dataclasses import dataclass

import numpy as np

from cost_models.schedule import COMPUTE_KINDS
from cost_models.simulator import op_compute_s, simulate
from planner.inputs.catalog import peak_for
from planner.inputs.units import format_flops
from planner.runtime.emulation import slowed_job

__all__ = ["STRAGGLER_RATIO", "MIN_SLOW_ITERATIONS", "Straggler", "device_index_in_job", "worker_compute_s",
           "relative_ratios", "find_straggler", "straggler_report"]

STRAGGLER_RATIO = 1.25  # measured / predicted compute of a worker against the median of the others' in an iteration
MIN_SLOW_ITERATIONS = 2  # consecutive measured iterations a worker must be slow in to be named


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """A worker slow in measured iterations ``first`` to ``last`` (0-based, inclusive), ``factor``
    times the others' measured / predicted compute there."""

    worker: int
    first: int
    last: int
    factor: float


def device_index_in_job(plan, job, device: str) -> int:
    """The simulator's index of the worker that ``device`` runs in (a tensor group's lead for its members)."""
    for r, row in enumerate(plan.assignment):
        for s, name in enumerate(row):
            if device in plan.members(name):
                return int(job.device[r, s])
    raise ValueError(f"{device} is not used by the plan")


def worker_compute_s(reports: list, job, time_scale: float) -> tuple:
    """(the workers as (replica, stage) in rank order, measured compute seconds per worker and
    measured iteration as a (workers, iterations) array, predicted compute seconds per worker).

    ``reports``: each rank's replica, stage and ``traces`` (per measured iteration, ops as
    (kind, micro-batch, start_s, end_s, chunk, host_s)). A tensor group's members run the same ops: the
    worker's measured compute is the longest member's."""
    workers, measured, predicted = [], {}, {}
    for report in sorted(reports, key=lambda r: r["rank"]):
        key = (report["replica"], report["stage"])
        seconds = [sum(b - a for (kind, _, a, b, *_) in trace if kind in COMPUTE_KINDS) for trace in report["traces"]]
        if key not in measured:
            workers.append(key)
            ops = report["traces"][0] if report["traces"] else []
            predicted[key] = sum(op_compute_s(job, kind, key[0], key[1], chunk)
                                 for (kind, _, _, _, chunk, _) in ops if kind in COMPUTE_KINDS) * time_scale
            measured[key] = seconds
        else:
            measured[key] = [max(x, y) for x, y in zip(measured[key], seconds)]
    return (workers, np.array([measured[w] for w in workers], dtype=float).reshape(len(workers), -1),
            np.array([predicted[w] for w in workers], dtype=float))


def relative_ratios(measured: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Each worker's measured / predicted compute divided by the median of the other workers' in the
    same iteration ((workers, iterations); NaN where no other worker or no prediction to compare)."""
    ratio = measured / np.where(predicted > 0, predicted, np.nan)[:, None]
    relative = np.full(ratio.shape, np.nan)
    for w in range(ratio.shape[0]):
        others = np.delete(ratio, w, axis=0)
        if others.shape[0]:
            with np.errstate(all="ignore"):
                relative[w] = ratio[w] / np.median(others, axis=0)
    return relative


def find_straggler(measured: np.ndarray, predicted: np.ndarray, *, ratio: float = STRAGGLER_RATIO,
                   least_iterations: int = MIN_SLOW_ITERATIONS) -> Straggler | None:
    """The worker slow (at least ``ratio`` times the others' measured / predicted compute) in
    ``least_iterations`` or more consecutive iterations, the longest such run first, then the
    largest factor; None when no worker is. ``measured``: (workers, iterations) seconds;
    ``predicted``: seconds per worker (the same ops)."""
    return _longest_slow_run(relative_ratios(measured, predicted), ratio, least_iterations)


def _longest_slow_run(relative: np.ndarray, ratio: float, least_iterations: int) -> Straggler | None:
    """``find_straggler`` on the workers' ratios to the others (``relative_ratios``)."""
    best = None
    for w, row in enumerate(relative):
        slow = np.r_[False, row >= ratio, False].astype(np.int8)  # NaN compares False
        edges = np.flatnonzero(np.diff(slow))  # each run's first iteration, then one past its last
        for first, stop in zip(edges[::2], edges[1::2]):
            if stop - first >= least_iterations:
                found = Straggler(worker=w, first=int(first), last=int(stop - 1),
                                  factor=float(np.median(row[first:stop])))
                if best is None or (found.last - found.first, found.factor) > (best.last - best.first, best.factor):
                    best = found
    return best


def straggler_report(inputs, job, reports: list, times: list, time_scale: float, warmup: int,
                     predicted_s: float) -> dict:
    """The ``straggler`` record of ``results.json``: the workers' measured and predicted compute,
    the straggler found from them (``device`` None when none is) and what it cost.

    ``times``: the measured iterations (seconds of this host, the max over ranks); ``predicted_s``:
    the plan's iteration in the same seconds; measured iteration k is iteration ``warmup + k + 1``
    of the progress lines."""
    plan = inputs.plan
    workers, measured, predicted = worker_compute_s(reports, job, time_scale)
    relative = relative_ratios(measured, predicted)
    names = [plan.assignment[r][s] for r, s in workers]
    table = [{"worker": name, "replica": r, "stage": s, "predicted_compute_s": float(p),
              "measured_compute_s": [float(x) for x in row],
              "ratio_to_others": [None if np.isnan(x) else float(x) for x in rel]}
             for name, (r, s), p, row, rel in zip(names, workers, predicted, measured, relative)]
    record = {"threshold": STRAGGLER_RATIO, "least_iterations": MIN_SLOW_ITERATIONS, "workers": table,
              "device": None}
    found = _longest_slow_run(relative, STRAGGLER_RATIO, MIN_SLOW_ITERATIONS)
    if found is None:
        record["summary"] = _nothing_found(names, relative)
        return record
    r, s = workers[found.worker]
    name = names[found.worker]
    slowed = slowed_job(job, int(job.device[r, s]), found.factor)
    predicted_slowed = simulate(slowed, keep_records=False).iteration_s * time_scale
    before, after = times[:found.first], times[found.first:found.last + 1]
    after_s = statistics.median(after)
    # Without measured iterations before it, the iteration without the straggler is estimated: the
    # measured one times the simulator's ratio of the plan's iteration to the slowed one.
    reference = statistics.median(before) if before else after_s * predicted_s / predicted_slowed
    members = list(plan.members(name))
    devices = [inputs.topology.devices[inputs.topology.index(d)] for d in members]
    record.update({
        "device": name, "members": members, "factor": found.factor, "from_iteration": warmup + found.first + 1,
        "to_iteration": warmup + found.last + 1, "first_measured": found.first == 0,
        "measured_before_s": statistics.median(before) if before else None, "measured_after_s": after_s,
        "predicted_s": predicted_s, "predicted_with_straggler_s": predicted_slowed,
        "without_straggler_s": reference, "cost_s": after_s - reference, "lost_s": sum(t - reference for t in after),
        "replan_efficiency": {d.name: d.efficiency / found.factor for d in devices}})
    if plan.calibration:  # a calibration replaces efficiency by device type, not a device's peak
        record["replan_peak_flops"] = {d.name: peak_for(d.peak_flops, inputs.training.precision) / found.factor
                                       for d in devices}
    record["summary"] = _found(record, inputs.plan_path, len(after))
    return record


def _found(record: dict, plan_path: str, count: int) -> str:
    name, first, last = record["device"], record["from_iteration"], record["to_iteration"]
    reference, after = record["without_straggler_s"], record["measured_after_s"]
    members = (f" (the tensor group {', '.join(record['members'])}: which member is slow cannot be told)"
               if len(record["members"]) > 1 else "")
    span = (f"from iteration {first}, the first measured, to {last} (slow from the start: the device, or the plan's "
            "prediction of its stage)" if record["first_measured"] else f"from iteration {first} to {last}")
    against = ("before it" if record["measured_before_s"] is not None else
               f"estimated without it, as the simulator's {record['predicted_s']:.3f} s without it is to its "
               f"{record['predicted_with_straggler_s']:.3f} s with it")
    if "replan_peak_flops" in record:
        settings = ", ".join(f"peak_flops: {format_flops(f).replace(' ', '')} on {d}"
                             for d, f in record["replan_peak_flops"].items())
        settings += " (the plan's calibration sets efficiency by device type)"
    else:
        settings = ", ".join(f"efficiency: {e:.3g} on {d}" for d, e in record["replan_efficiency"].items())
    return (f"straggler: {name}{members} computed {record['factor']:.2f}x slower than the other workers against the "
            f"plan's compute times {span}, named at >= {STRAGGLER_RATIO:g}x in {MIN_SLOW_ITERATIONS} or more "
            f"measured iterations in a row: iterations took {after:.3f} s instead of {reference:.3f} s {against} "
            f"({100 * (after / reference - 1):+.0f}%, {record['lost_s']:.3f} s lost over {count} iteration(s)"
            + ("" if record["measured_before_s"] is None else
               f"; the simulator with the straggler predicts {record['predicted_with_straggler_s']:.3f} s")
            + f"); to re-plan around it, set {settings} in the topology and run 'plan TOPOLOGY --from {plan_path}'")


def _nothing_found(names: list, relative: np.ndarray) -> str:
    if len(names) < 2:
        return "no straggler: one worker, no other to compare its compute with"
    medians = [float(np.median(row[~np.isnan(row)])) if np.any(~np.isnan(row)) else 0.0 for row in relative]
    top = int(np.argmax(medians)) if medians else 0
    return (f"no straggler: no worker's compute, measured against the plan's, was {STRAGGLER_RATIO:g}x the others' "
            f"in {MIN_SLOW_ITERATIONS} measured iterations in a row (the highest, {names[top]}, at a median "
            f"{medians[top] if medians else 0.0:.2f}x)")
