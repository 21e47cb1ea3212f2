"""ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1) under ``schedule: auto``.

Which topologies: ZB-H1's blocks run the runtime's split backward (eager linear layers, the weight
gradients deferred), whose cost only a calibration knows (``Device.split_backward_efficiency``).
Uncalibrated, the model prices a split block as a plain one, and the runtime ran it slower than
that: on this project's 2-core CPU a block's forward, input and weight passes took 1398 us against
1F1B's forward and backward 1026 us (``python benchmarks/split_host.py``,
``benchmarks/results/split_host.json``); on 4x H200, calibrated, 15% slower than predicted (0.375 s) before its
forward was traced into the block's graph.
So ``auto`` runs ZB-H1 only where a calibration measured every device's split-backward block
(``measured_schedules``); there it was predicted within 2.6% on 2x and 4x H200 and measured the
fastest one-chunk schedule (``benchmarks/results/accuracy_gpu4_h200_traced*.json``).

How: ZB-H1 is not a third schedule of the placement search, which would split the search's budget
three ways (``cost_models.schedule.AUTO_SCHEDULES``). It runs 1F1B's order with the weight passes
moved into the bubble, on the same placement and splits, so like interleaving
(``planner.search.interleave``) it is a variant of a 1F1B finalist: ``score_split`` charges the split
block's time and the inputs each stage keeps for its weight passes, and the variant is simulated
beside the plain plan where its estimate is the lower (``zero_bubble_variants``). The bound covers
it wherever it is searched (``TrainingSpec.schedules``).
"""

from dataclasses import replace

from cost_models.schedule import Schedule
from planner.plan.plan import Plan
from planner.search.evaluate import Candidate, score_split
from planner.search.warmup import deeper_variants

__all__ = ["measured_schedules", "placement_schedules", "runnable_start", "zero_bubble_variants"]


def measured_schedules(training, topology):
    """``training`` with ``split_backward_measured`` set from ``topology``: under ``schedule: auto``,
    whether a calibration measured every device's split-backward block (then auto runs ZB-H1 too)."""
    measured = training.schedule == "auto" and all(d.split_backward_efficiency > 0 for d in topology.devices)
    return training if measured == training.split_backward_measured else replace(
        training, split_backward_measured=measured)


def runnable_start(plan: Plan | None, training) -> Plan | None:
    """A plan to start from (a re-plan's old plan, ``search``'s ``x0``) as ``training`` (resolved by
    ``measured_schedules``) may run it: a ZB-H1 plan chosen under ``auto`` where every device's split
    backward was measured, started on a cluster where one is not, runs 1F1B on the same placement at
    the same warm-up depth (the bound there does not cover ZB-H1, and its split blocks would be priced
    as plain ones)."""
    if (plan is None or training.schedule != "auto" or plan.schedule != Schedule.ZERO_BUBBLE
            or Schedule.ZERO_BUBBLE in training.schedules):
        return plan
    return replace(plan, schedule=Schedule.ONE_F_ONE_B, prediction=None)  # 1F1B runs the plan's depth too


def placement_schedules(training) -> list:
    """The schedules a placement search ranks placements under: ``training.schedules``, but under
    ``auto`` not ZB-H1, which is a variant of 1F1B's finalists (``zero_bubble_variants``)."""
    if training.schedule == "auto":
        return [s for s in training.schedules if s != Schedule.ZERO_BUBBLE]
    return list(training.schedules)


def zero_bubble_variants(ctx, candidate: Candidate, plan: Plan, choices: tuple, depths: tuple = (1,)) -> list:
    """[(estimate, ZB-H1 plan)] of ``candidate`` (whose plan is ``plan``) where ``schedule: auto``
    runs ZB-H1 and its estimate is below the candidate's: a 1F1B candidate of two stages or more with
    one chunk per device among ``choices`` (the virtual-stage counts), that still fits; else [].

    ``depths``: the warm-up depths the training allows (``warmup.warmup_depth_choices``). The variant
    runs the shallowest of them; where the search picks the depth, its deeper variant with the best
    estimate follows it, as for a ZB-H1 finalist asked for by name (``warmup.deeper_variants``: both
    simulated, the estimate missing the bubble a deeper warm-up fills; on 2x H200 depth 2 measured
    0.2846 s against depth 1's 0.2939 s, ``benchmarks/results/runtime_gpu_x2_h200_zb_depth.json``)."""
    R, S = candidate.assign.shape
    if (ctx.training.schedule != "auto" or Schedule.ZERO_BUBBLE not in ctx.training.schedules
            or candidate.schedule != Schedule.ONE_F_ONE_B or S < 2 or 1 not in choices):
        return []
    estimate = score_split(ctx, candidate.assign, candidate.layer_counts, candidate.micro_batches,
                           candidate.micro_batch_size, Schedule.ZERO_BUBBLE, warmup_depth=depths[0])
    if estimate is None or estimate >= candidate.score_s:
        return []
    variant = replace(plan, schedule=Schedule.ZERO_BUBBLE, warmup_depth=depths[0], prediction=None)
    deeper = deeper_variants(ctx, replace(candidate, schedule=Schedule.ZERO_BUBBLE, score_s=estimate), variant, depths)
    return deeper or [(estimate, variant)]
