"""``recompute: auto`` per worker: each (replica, stage) runs the lightest recomputation under which
it fits (``planner.plan.recompute``).

A worker's mode changes only its own blocks' backward time and its own memory, so for a fixed
placement, split and schedule the lightest mode that fits each worker is the fastest choice; a
worker that fits under no mode leaves the plan unfit. The search plans with recomputation off and
with full recomputation (``front._best_recompute``); the second plan's workers are then given the
lightest modes that fit, and that plan is predicted again and kept where it scores no worse.
Its layers were balanced for full recomputation everywhere, so ``resplit`` then moves single
layers across stage boundaries, each split's workers at their lightest modes, while the
simulation improves.
"""

import math
import time
from dataclasses import replace

from planner.plan.recompute import RELAXED_ORDER, RecomputeMode, training_value, uniform_modes, with_modes
from planner.prediction.predict import worker_memory_bytes
from planner.prediction.stage_model import layer_costs

__all__ = ["lightest_modes", "relaxed_plan", "resplit", "RESPLIT_PASSES"]

# At most this many passes of ``resplit``, each trying every single-layer move and taking the best.
RESPLIT_PASSES = 16


def lightest_modes(plan, topology, model, training) -> tuple | None:
    """Per replica, per stage, the lightest mode (``RELAXED_ORDER``) under which every member of the
    worker fits on its device; None where some worker fits under none. Selective recomputation is
    left out with flash attention, under which it keeps what no recomputation keeps."""
    modes = [m for m in RELAXED_ORDER if m != RecomputeMode.SELECTIVE or not training.flash_attention]
    R, S = plan.replicas, plan.stages
    costs = {str(m): layer_costs(model, replace(training, recompute=training_value(m)), plan.micro_batch_size, S, R)
             for m in modes}
    memory = {m: worker_memory_bytes(plan, topology, costs, uniform_modes(m, R, S)) for m in modes}
    table = []
    for row in plan.assignment:
        cells = []
        for name in row:
            fitting = [m for m in modes
                       if all(memory[m][0][d] <= memory[m][1][d] for d in plan.members(name))]
            if not fitting:
                return None
            cells.append(str(fitting[0]))
        table.append(tuple(cells))
    return tuple(table)


def relaxed_plan(plan, topology, model, training) -> tuple | None:
    """(plan, training) with each worker at its ``lightest_modes`` (the prediction dropped: predict
    again), or None where nothing changes or some worker fits under no mode."""
    table = lightest_modes(plan, topology, model, training)
    if table is None or table == (plan.recompute or uniform_modes(training.recompute, plan.replicas, plan.stages)):
        return None
    relaxed, trained = with_modes(plan, training, table)
    return replace(relaxed, prediction=None), trained


def resplit(plan, training, topology, model, score, *, deadline: float = math.inf,
            score_s: float | None = None) -> tuple:
    """(plan, training, score, cut) after moving one layer at a time across a stage boundary while
    the best such move scores lower (``score(plan, training)``: the prediction's objective, ``inf``
    where the plan does not fit), each split's workers at their ``lightest_modes`` under full
    recomputation; at most ``RESPLIT_PASSES`` passes (the work is the plan's alone, so the same
    plan gives the same split), and no move scored after ``deadline`` (``time.perf_counter()``;
    ``cut``: whether it stopped the passes). One chunk per device (interleaved plans are returned
    as they are). ``score_s``: the starting plan's score, where the caller has it."""
    best = (plan, training, score(plan, training) if score_s is None else score_s)
    if plan.virtual_stages != 1 or plan.stages < 2:
        return (*best, False)
    full = replace(training, recompute=True)
    for _ in range(RESPLIT_PASSES):
        current = best
        for boundary in range(1, plan.stages):
            for delta in (-1, 1):
                if time.perf_counter() > deadline:
                    return (*best, True)
                bounds = list(current[0].layer_bounds)
                bounds[boundary] += delta
                if bounds[boundary] <= bounds[boundary - 1] or bounds[boundary] >= bounds[boundary + 1]:
                    continue
                moved = replace(current[0], layer_bounds=tuple(bounds), recompute=(), prediction=None)
                table = lightest_modes(moved, topology, model, full)
                if table is None:
                    continue
                moved, trained = with_modes(moved, full, table)
                value = score(moved, trained)
                if value < best[2]:
                    best = (moved, trained, value)
        if best is current:
            return (*best, False)
    return (*best, False)
