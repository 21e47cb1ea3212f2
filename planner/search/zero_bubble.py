"""ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1) under ``schedule: auto``:
each 1F1B finalist scored again with its backward split into input and weight passes.

ZB-H1 is not a third schedule of the placement search: a third schedule splits the search's budget
three ways (``cost_models.schedule.AUTO_SCHEDULES``). It runs 1F1B's order with the weight passes
moved into the bubble, on the same placement and splits, so like interleaving
(``planner.search.interleave``) it is a variant of a finalist: ``score_split`` charges the split
block's time (``SearchContext.block_slowdown``) and the weight-gradient inputs each stage keeps
(``fits``), and the variant is simulated beside the plain plan where its estimate is the lower.
"""

from dataclasses import replace

from cost_models.schedule import Schedule
from planner.plan.plan import Plan
from planner.search.evaluate import Candidate, score_split

__all__ = ["zero_bubble_variants"]


def zero_bubble_variants(ctx, candidate: Candidate, plan: Plan, choices: tuple) -> list:
    """[(estimate, ZB-H1 plan)] of ``candidate`` (whose plan is ``plan``) where ``schedule: auto``
    may run it and its estimate is below the candidate's: a 1F1B candidate of two stages or more
    with one chunk per device among ``choices`` (the virtual-stage counts), that still fits; else []."""
    R, S = candidate.assign.shape
    if (ctx.training.schedule != "auto" or candidate.schedule != Schedule.ONE_F_ONE_B or S < 2
            or 1 not in choices):
        return []
    estimate = score_split(ctx, candidate.assign, candidate.layer_counts, candidate.micro_batches,
                           candidate.micro_batch_size, Schedule.ZERO_BUBBLE)
    if estimate is None or estimate >= candidate.score_s:
        return []
    return [(estimate, replace(plan, schedule=Schedule.ZERO_BUBBLE, prediction=None))]
