"""Local moves on a placement, first-improvement descent and iterated local search."""

import time

import numpy as np

from planner.search.evaluate import Candidate, evaluate_placement
from planner.search.refine import refine_split

__all__ = ["random_move", "descend", "iterated_local_search", "MAX_FAILED_KICKS", "RESTARTS"]

MAX_FAILED_KICKS = 20  # the iterated local search stops after this many kicks in a row bring nothing
PROMISING = 1.02  # a move within this factor of the best has its splits refined before it is judged
REFINE_BUDGET = 40  # estimates per such refinement
RESTARTS = 3  # random restarts once the kicks stop helping


def random_move(assign: np.ndarray, n: int, rng) -> np.ndarray:
    """One random move: swap two cells, or (30% when devices are idle) put an idle device in a cell.
    With one stage, swapping replicas changes nothing, so every move brings an idle device in."""
    R, S = assign.shape
    assign = assign.copy()
    used = set(assign.ravel().tolist())
    idle = [d for d in range(n) if d not in used]
    cell = divmod(int(rng.integers(R * S)), S)
    if idle and (S == 1 or rng.random() < 0.3):
        assign[cell] = idle[int(rng.integers(len(idle)))]
    else:
        other = divmod(int(rng.integers(R * S)), S)
        assign[cell], assign[other] = assign[other], assign[cell]
    return assign


def descend(ctx, start: Candidate, rng, budget: int, deadline: float) -> tuple:
    """First-improvement descent over random moves until ``max(60, 4 R S)`` moves in a row fail; a
    move that comes within ``PROMISING`` of the best has its splits refined first."""
    best, evaluations, stale = start, 0, 0
    R, S = start.assign.shape
    while evaluations < budget and time.perf_counter() < deadline and stale < max(60, 4 * R * S):
        assign = random_move(best.assign, ctx.topology.size, rng)
        if np.array_equal(assign, best.assign):
            stale += 1
            continue
        evaluations += 1
        candidate = evaluate_placement(ctx, assign, best.micro_batch_size, best.schedule, best.micro_batches)
        if candidate is not None and candidate.score_s < best.score_s * PROMISING:
            # The fast splits can misjudge a placement whose best split is sync- or fill-bound.
            candidate, used = refine_split(ctx, candidate, REFINE_BUDGET)
            evaluations += used
        if candidate is not None and candidate.score_s < best.score_s - 1e-12:
            best, stale = candidate, 0
        else:
            stale += 1
    return best, evaluations


def iterated_local_search(ctx, start: Candidate, rng, budget: int, deadline: float) -> tuple:
    """Iterated local search (Lourenco et al. 2003): descend, then kick the best placement with a few
    random moves (its micro-batch split re-balanced) and descend again, until ``MAX_FAILED_KICKS``
    fruitless kicks in a row; then restart from a random placement, up to ``RESTARTS`` times, within
    the budget and the deadline. The best placement found is kept."""
    best, evaluations = descend(ctx, start, rng, budget, deadline)
    current = best
    R, S = start.assign.shape
    n = ctx.topology.size
    failed_kicks, restarts = 0, 0
    while evaluations < budget and time.perf_counter() < deadline:
        if failed_kicks >= MAX_FAILED_KICKS:
            if restarts == RESTARTS:
                break
            restarts += 1
            failed_kicks = 0
            evaluations += 1
            fresh = evaluate_placement(ctx, rng.permutation(n)[:R * S].reshape(R, S), best.micro_batch_size, best.schedule)
            if fresh is None:
                continue
            current, used = descend(ctx, fresh, rng, budget - evaluations, deadline)
            evaluations += used
            if current.score_s < best.score_s - 1e-12:
                best = current
            continue
        assign = current.assign
        for _ in range(int(rng.integers(2, max(3, min(R * S, 6)) + 1))):
            assign = random_move(assign, n, rng)
        evaluations += 1
        kicked = evaluate_placement(ctx, assign, current.micro_batch_size, current.schedule)
        failed_kicks += 1
        if kicked is None:
            continue
        found, used = descend(ctx, kicked, rng, budget - evaluations, deadline)
        evaluations += used
        if found.score_s < current.score_s - 1e-12:
            current, failed_kicks = found, 0
            if current.score_s < best.score_s - 1e-12:
                best = current
    return best, evaluations
