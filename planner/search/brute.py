"""Brute force for tiny instances: the reference the search is checked against.

``brute_force_placement`` evaluates every placement of ``stages x replicas`` devices (replicas in
canonical order, since they are interchangeable) with the search's own estimate, exact layer and
batch splits included.
"""

import itertools

import numpy as np

from planner.search.evaluate import evaluate_placement

__all__ = ["brute_force_placement"]


def brute_force_placement(ctx, stages: int, replicas: int, micro_batch_size: int, schedule: str) -> float:
    """Minimum estimate over every placement (inf when none fits). ``n!/(n-SR)!/R!`` evaluations."""
    n = ctx.topology.size
    best = np.inf
    for chosen in itertools.permutations(range(n), stages * replicas):
        rows = [chosen[r * stages:(r + 1) * stages] for r in range(replicas)]
        if rows != sorted(rows):
            continue
        candidate = evaluate_placement(ctx, np.array(rows), micro_batch_size, schedule)
        if candidate is not None:
            best = min(best, candidate.score_s)
    return best
