"""Genetic search over placements of one shape (stages x replicas, micro-batch size, schedule),
in the spirit of DTFM's GCMA (Yuan et al. 2022, sec. 3.3), fixed and improved:

- replicas are interchangeable, so before crossover the second parent's replicas are aligned to the
  first's by an assignment that maximises shared devices (Hungarian method; GCMA crossed unaligned
  labels, so children of two equivalent parents were mostly new random placements);
- uniform crossover per (replica, stage) cell, then a repair that keeps every device at most once,
  preferring the other parent's device, then an idle one;
- each child gets a short first-improvement descent (memetic, as GCMA's local search);
- (mu + lambda) survival with the best always kept (elitism), a seeded ``rng``, an evaluation
  budget, a deadline, and a stopping rule: ``STALL_GENERATIONS`` generations without improvement.
The population is seeded with the constructive layouts and the local search's results.
"""

import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from planner.search.evaluate import Candidate, evaluate_placement
from planner.search.local import descend, random_move

__all__ = ["aligned_crossover", "alignment_s", "genetic_search", "POPULATION", "STALL_GENERATIONS",
           "ALIGN_CELLS_PER_S"]

POPULATION = 16
STALL_GENERATIONS = 6
_CHILD_DESCENT = 8  # evaluations of each child's descent


ALIGN_CELLS_PER_S = 20e6  # replica pairs scored and assigned per second by ``_align`` (measured 44-47e6 on 2 cores)


def alignment_s(replicas: int) -> float:
    """A crossover's alignment of ``replicas`` rows, in seconds as its size predicts (``R^2`` pairs)."""
    return replicas * replicas / ALIGN_CELLS_PER_S


def _align(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b``'s rows reordered to share the most devices with ``a``'s rows (same positions count double)."""
    _, columns = linear_sum_assignment(-_alignment_score(a, b))
    return b[columns]


def _alignment_score(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``score[i, j]``: devices rows ``a[i]`` and ``b[j]`` share, plus those in the same position.
    Each device sits in one cell of a placement, so each of ``a``'s cells adds to one pair of rows."""
    R, S = a.shape
    row_b = np.full(int(max(a.max(), b.max())) + 1, -1)
    stage_b = row_b.copy()
    row_b[b.ravel()] = np.repeat(np.arange(R), S)
    stage_b[b.ravel()] = np.tile(np.arange(S), R)
    rows, stages, devices = np.repeat(np.arange(R), S), np.tile(np.arange(S), R), a.ravel()
    shared = row_b[devices] >= 0
    score = np.zeros((R, R))
    np.add.at(score, (rows[shared], row_b[devices][shared]), 1.0 + (stage_b[devices][shared] == stages[shared]))
    return score


def aligned_crossover(a: np.ndarray, b: np.ndarray, devices: int, rng) -> np.ndarray:
    """A child of placements ``a`` and ``b`` (same shape): aligned, uniform per cell, repaired."""
    b = _align(a, b)
    take_a = rng.random(a.shape) < 0.5
    child = np.where(take_a, a, b)
    other = np.where(take_a, b, a)
    used, duplicates = set(), []
    cells = [(int(r), int(s)) for r, s in zip(*np.unravel_index(rng.permutation(child.size), child.shape))]
    for cell in cells:
        if int(child[cell]) in used:
            duplicates.append(cell)
        else:
            used.add(int(child[cell]))
    for cell in duplicates:
        if int(other[cell]) not in used:
            child[cell] = other[cell]
        else:
            free = [d for d in range(devices) if d not in used]
            child[cell] = free[int(rng.integers(len(free)))]
        used.add(int(child[cell]))
    return child


def genetic_search(ctx, seeds: list, rng, budget: int, deadline: float) -> tuple:
    """(best candidate, evaluations used) from ``seeds`` (candidates of one shape); no child is
    started whose alignment (``alignment_s``) would end past ``deadline``."""
    first = min(seeds, key=lambda c: c.score_s)
    n = ctx.topology.size
    population, keys, evaluations = [], set(), 0

    def admit(candidate):
        key = candidate.assign.tobytes()
        if key not in keys:
            keys.add(key)
            population.append(candidate)

    for c in sorted(seeds, key=lambda c: c.score_s):
        admit(c)
    tries = 0
    while len(population) < POPULATION and tries < 4 * POPULATION and evaluations < budget \
            and time.perf_counter() < deadline:
        tries += 1
        assign = first.assign
        for _ in range(int(rng.integers(1, 5))):
            assign = random_move(assign, n, rng)
        evaluations += 1
        candidate = _evaluate(ctx, assign, first)
        if candidate is not None:
            admit(candidate)
    best, stall = min(population, key=lambda c: c.score_s), 0
    child_end = deadline - alignment_s(first.assign.shape[0])  # a child starts only while its alignment fits
    while evaluations < budget and time.perf_counter() < child_end and stall < STALL_GENERATIONS \
            and len(population) > 1:
        children = []
        for _ in range(POPULATION):
            if evaluations >= budget or time.perf_counter() >= child_end:
                break
            a, b = _tournament(population, rng), _tournament(population, rng)
            assign = aligned_crossover(a.assign, b.assign, n, rng)
            if rng.random() < 0.3:
                assign = random_move(assign, n, rng)
            evaluations += 1
            child = _evaluate(ctx, assign, first)
            if child is None:
                continue
            child, used = descend(ctx, child, rng, min(_CHILD_DESCENT, budget - evaluations), deadline)
            evaluations += used
            children.append(child)
        for child in children:
            admit(child)
        population = sorted(population, key=lambda c: c.score_s)[:POPULATION]
        keys = {c.assign.tobytes() for c in population}
        if population[0].score_s < best.score_s - 1e-12:
            best, stall = population[0], 0
        else:
            stall += 1
    return best, evaluations


def _evaluate(ctx, assign: np.ndarray, like: Candidate):
    return evaluate_placement(ctx, assign, like.micro_batch_size, like.schedule)


def _tournament(population: list, rng) -> Candidate:
    i, j = rng.integers(len(population), size=2)
    return min(population[int(i)], population[int(j)], key=lambda c: c.score_s)
