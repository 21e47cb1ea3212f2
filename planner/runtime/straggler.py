"""An emulated straggler and what it cost: ``plan launch --emulate --slow DEVICE:FACTOR[@ITERATION]``
makes one device compute ``FACTOR`` times slower from an iteration on; the run's results then name
it, compare the iterations before and after with the plan's prediction and with the simulator's
prediction for the slowed device, and say how to re-plan around it (the device's efficiency divided
by the factor, in the topology, then ``plan TOPOLOGY --from PLAN``)."""

import statistics

from cost_models.simulator import simulate
from planner.runtime.emulation import slowed_job

__all__ = ["device_index_in_job", "straggler_report"]


def device_index_in_job(plan, job, device: str) -> int:
    """The simulator's index of the worker that ``device`` runs in (a tensor group's lead for its members)."""
    for r, row in enumerate(plan.assignment):
        for s, name in enumerate(row):
            if device in plan.members(name):
                return int(job.device[r, s])
    raise ValueError(f"{device} is not used by the plan")


def straggler_report(inputs, job, slowdown, results: dict, time_scale: float, warmup: int) -> tuple:
    """(the record for results.json, the job the emulation ran in its last measured iteration)."""
    slowed = slowed_job(job, device_index_in_job(inputs.plan, job, slowdown.device), slowdown.factor)
    measured = results["measured"]["iteration_s"]
    # measured iteration k (0-based) is iteration warmup + k + 1 of the progress lines
    before = [t for k, t in enumerate(measured) if warmup + k + 1 < slowdown.first]
    after = [t for k, t in enumerate(measured) if warmup + k + 1 >= slowdown.first]
    predicted = results["comparison"]["predicted_s"]
    predicted_slowed = simulate(slowed, keep_records=False).iteration_s * time_scale
    reference = statistics.median(before) if before else predicted
    after_s = statistics.median(after) if after else None
    device = inputs.topology.devices[inputs.topology.index(slowdown.device)]
    efficiency = device.efficiency / slowdown.factor
    record = {"device": slowdown.device, "factor": slowdown.factor, "from_iteration": slowdown.first,
              "measured_before_s": statistics.median(before) if before else None, "measured_after_s": after_s,
              "predicted_s": predicted, "predicted_with_straggler_s": predicted_slowed,
              "cost_s": after_s - reference if after_s is not None else None,
              "replan_efficiency": efficiency}
    if after_s is None:
        record["summary"] = (f"straggler: {slowdown.device} was to slow down from iteration {slowdown.first}, after "
                             "the run's last iteration: nothing measured")
    else:
        record["summary"] = (
            f"straggler: {slowdown.device} computed {slowdown.factor:g}x slower from iteration {slowdown.first}: "
            f"iterations took {after_s:.3f} s instead of {reference:.3f} s ({100 * (after_s / reference - 1):+.0f}%; "
            f"the simulator with the straggler predicts {predicted_slowed:.3f} s); to re-plan around it, set "
            f"efficiency: {efficiency:.3g} on {slowdown.device} in the topology and run "
            f"'plan TOPOLOGY --from {inputs.plan_path}'")
    return record, slowed if after else job
