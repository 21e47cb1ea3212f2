"""1F1B's warm-up depth in the search (``cost_models.schedule.one_f_one_b_warmup``): which depths a
plan may run, and each 1F1B finalist's deeper variant ranked by the estimate.

Stage s of a 1F1B pipeline keeps ``k (S - s - 1) + 1`` micro-batches in flight at warm-up depth k.
At k = 1 (PipeDream-Flush) a message that takes longer than a stage's compute stalls the stages
upstream of it every step; each unit of depth lets a stage wait one more steady step per hop for
its round trip, for one more micro-batch's activations per stage downstream. Under ``auto`` the
placement search scores each 1F1B placement at the deepest depth of ``AUTO_WARMUP_DEPTHS`` its
memory holds (``evaluate.fitting_depth``), so a placement behind slow links ranks as a deeper
warm-up would run it; each 1F1B finalist is then scored at every depth above 1
(``evaluate.score_split``: the in-flight count in the round-trip period and in the memory check),
and the deeper variant with the best estimate, where it is not above depth 1's, is simulated in
the candidate's place (depth 1 of that candidate is not simulated). A ZB-H1 finalist (asked for by
name, or ``zero_bubble.zero_bubble_variants``' of a 1F1B finalist under ``schedule: auto``) gets its
deeper variant the same way, but its own depth is simulated too: the estimate times the deeper
window, not the bubble the extra forwards fill.
"""

from dataclasses import replace

from cost_models.schedule import AUTO_WARMUP_DEPTHS, DEEPENED_SCHEDULES, Schedule
from planner.plan.plan import Plan
from planner.search.evaluate import Candidate, score_split

__all__ = ["warmup_depth_choices", "deeper_variants"]


def warmup_depth_choices(training) -> tuple:
    """The depths the search may plan: ``AUTO_WARMUP_DEPTHS`` under ``auto``, else the one asked for."""
    return AUTO_WARMUP_DEPTHS if training.warmup_depth == "auto" else (training.warmup_depth,)


def deeper_variants(ctx, candidate: Candidate, plan: Plan, choices: tuple) -> list:
    """[(estimate, plan)]: ``candidate`` (whose plan is ``plan``) at the depth of ``choices`` above 1
    with the best estimate (the shallowest among equals), where that estimate is not above the plan's
    own depth's (on a tie the deeper one: the estimate's period misses the stalls a round trip longer
    than the steady step causes, which only a deeper warm-up removes); empty for another schedule than 1F1B or
    ZB-H1, interleaved chunks, a single stage, or where no deeper variant fits in memory. Under ZB-H1 the
    estimate times the deeper window but not the bubble the extra forwards fill
    (``evaluate._pipeline_shape``), so ``plan`` at its own depth follows as a second variant, for the
    simulator to judge both."""
    R, S = candidate.assign.shape
    if candidate.schedule not in DEEPENED_SCHEDULES or plan.virtual_stages != 1 or S < 2:
        return []
    scored = []
    for k in choices:
        if k > max(1, plan.warmup_depth):
            estimate = score_split(ctx, candidate.assign, candidate.layer_counts, candidate.micro_batches,
                                   candidate.micro_batch_size, candidate.schedule, warmup_depth=k)
            if estimate is not None:
                scored.append((estimate, k))
    if not scored:
        return []
    estimate, k = min(scored)
    own = score_split(ctx, candidate.assign, candidate.layer_counts, candidate.micro_batches,
                      candidate.micro_batch_size, candidate.schedule, warmup_depth=max(1, plan.warmup_depth))
    if own is not None and estimate > own * (1 + 1e-9):
        return []
    beside = [(own, plan)] if candidate.schedule == Schedule.ZERO_BUBBLE and own is not None else []
    return [(estimate, replace(plan, warmup_depth=k, prediction=None))] + beside
