"""Local moves on a placement, first-improvement descent and iterated local search.

The moves: single swaps (two cells, or an idle device into a cell) and, given a ``Neighbourhood``,
structural moves (``planner.search.moves``: stage groups and clusters moved or swapped, replicas
merged or split, the pipeline depth changed in place), drawn with probability ``STRUCTURAL``. A
move that ties the current estimate is accepted, up to ``PLATEAU_STEPS`` in a row, after which the
walk returns to the best placement: estimates made of maxima tie on most moves, and a walk over
ties reaches placements one strict improvement away. Random choices come from ``rng`` only.
"""

import time

import numpy as np

from planner.search.evaluate import Candidate, evaluate_placement
from planner.search.moves import structural_move
from planner.search.refine import refine_split

__all__ = ["random_move", "neighbour", "descend", "iterated_local_search", "MAX_FAILED_KICKS", "RESTARTS",
           "STRUCTURAL", "PLATEAU_STEPS", "TIE"]

MAX_FAILED_KICKS = 20  # the iterated local search stops after this many kicks in a row bring nothing
PROMISING = 1.02  # a move within this factor of the best has its splits refined before it is judged
REFINE_BUDGET = 40  # estimates per such refinement
RESTARTS = 3  # random restarts once the kicks stop helping
STRUCTURAL = 0.5  # share of the moves that are structural, given a neighbourhood
PLATEAU_STEPS = 20  # equal-cost moves accepted in a row, at most, before the walk returns to the best
TIE = 1e-9  # relative difference below which two estimates are equal


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


def neighbour(assign: np.ndarray, n: int, rng, hood=None) -> np.ndarray:
    """One move from ``assign``: structural (with probability ``STRUCTURAL``, given the
    neighbourhood ``hood`` and a move that applies), else ``random_move``."""
    if hood is not None and rng.random() < STRUCTURAL:
        _, moved = structural_move(assign, n, hood, rng)
        if moved is not None:
            return moved
    return random_move(assign, n, rng)


def descend(ctx, start: Candidate, rng, budget: int, deadline: float, hood=None) -> tuple:
    """First-improvement descent over random moves (``neighbour``) until ``max(60, 4 R S)`` moves in
    a row fail to improve the best; a move that comes within ``PROMISING`` of the best has its splits
    refined first. With a neighbourhood ``hood`` (structural moves), equal-cost moves are accepted up
    to ``PLATEAU_STEPS`` in a row."""
    best = current = start
    evaluations, stale, plateau = 0, 0, 0
    R, S = start.assign.shape
    while evaluations < budget and time.perf_counter() < deadline and stale < max(60, 4 * R * S):
        assign = neighbour(current.assign, ctx.topology.size, rng, hood)
        if assign.shape == current.assign.shape and np.array_equal(assign, current.assign):
            stale += 1
            continue
        evaluations += 1
        same_shape = assign.shape == current.assign.shape
        candidate = evaluate_placement(ctx, assign, current.micro_batch_size, current.schedule,
                                       current.micro_batches if same_shape else None)
        if candidate is not None and candidate.score_s < best.score_s * PROMISING:
            # The fast splits can misjudge a placement whose best split is sync- or fill-bound.
            candidate, used = refine_split(ctx, candidate, REFINE_BUDGET)
            evaluations += used
        stale += 1
        if candidate is not None and candidate.score_s < current.score_s - 1e-12:
            current, plateau = candidate, 0
            if candidate.score_s < best.score_s - 1e-12:
                best, stale = candidate, 0
        elif (hood is not None and candidate is not None and plateau < PLATEAU_STEPS
              and candidate.score_s <= current.score_s * (1 + TIE)):
            current, plateau = candidate, plateau + 1
        elif plateau >= PLATEAU_STEPS:
            current, plateau = best, 0
    return best, evaluations


def iterated_local_search(ctx, start: Candidate, rng, budget: int, deadline: float, hood=None) -> tuple:
    """Iterated local search (Lourenco et al. 2003): descend, then kick the best placement with a few
    random moves (its micro-batch split re-balanced) and descend again, until ``MAX_FAILED_KICKS``
    fruitless kicks in a row; then restart from a random placement of the best's shape, up to
    ``RESTARTS`` times, within the budget and the deadline. The best placement found is kept.
    ``hood``: the structural moves' neighbourhood (``descend``); None: single swaps only."""
    best, evaluations = descend(ctx, start, rng, budget, deadline, hood)
    current = best
    n = ctx.topology.size
    failed_kicks, restarts = 0, 0
    while evaluations < budget and time.perf_counter() < deadline:
        if failed_kicks >= MAX_FAILED_KICKS:
            if restarts == RESTARTS:
                break
            restarts += 1
            failed_kicks = 0
            evaluations += 1
            R, S = best.assign.shape
            fresh = evaluate_placement(ctx, rng.permutation(n)[:R * S].reshape(R, S), best.micro_batch_size, best.schedule)
            if fresh is None:
                continue
            current, used = descend(ctx, fresh, rng, budget - evaluations, deadline, hood)
            evaluations += used
            if current.score_s < best.score_s - 1e-12:
                best = current
            continue
        assign = current.assign
        R, S = assign.shape
        for _ in range(int(rng.integers(2, max(3, min(R * S, 6)) + 1))):
            assign = random_move(assign, n, rng)
        evaluations += 1
        kicked = evaluate_placement(ctx, assign, current.micro_batch_size, current.schedule)
        failed_kicks += 1
        if kicked is None:
            continue
        found, used = descend(ctx, kicked, rng, budget - evaluations, deadline, hood)
        evaluations += used
        if found.score_s < current.score_s - 1e-12:
            current, failed_kicks = found, 0
            if current.score_s < best.score_s - 1e-12:
                best = current
    return best, evaluations
