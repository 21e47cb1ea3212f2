"""Refine a candidate's layer and batch splits against the whole estimate.

``evaluate_placement`` splits layers to minimise the slowest stage and batches to minimise the
slowest replica's makespan, alternately: fast, and right when one bottleneck dominates. The
estimate also counts the pipeline fill, the 1F1B round-trip limit, the staggered backward ends and
each stage's gradient all-reduce, so a neighbouring split can be better (a replica given one
micro-batch need not be balanced like the others). A best-improvement descent over single moves
(one layer from one stage to another, one micro-batch from one replica to another), each scored by
``score_split``, closes that difference on the final candidates.
"""

import math
import time
from dataclasses import replace

from planner.search.evaluate import Candidate, score_split

__all__ = ["refine_split", "REFINE_EVALUATIONS"]

REFINE_EVALUATIONS = 2000  # most estimates one refinement may spend


def _neighbours(counts: tuple, micro: tuple):
    for i, j in ((i, j) for i in range(len(counts)) for j in range(len(counts)) if i != j and counts[i] > 1):
        moved = list(counts)
        moved[i] -= 1
        moved[j] += 1
        yield tuple(moved), micro
    for a, b in ((a, b) for a in range(len(micro)) for b in range(len(micro)) if a != b and micro[a] > 1):
        moved = list(micro)
        moved[a] -= 1
        moved[b] += 1
        yield counts, tuple(moved)


def refine_split(ctx, candidate: Candidate, budget: int = REFINE_EVALUATIONS, deadline: float = math.inf) -> tuple:
    """(refined candidate, estimates spent): never worse than ``candidate``, same placement; stops
    at ``budget`` estimates or at the first estimate after ``time.perf_counter()`` passes ``deadline``
    (a round of a thousand replicas has a million neighbours: the clock is read at each)."""
    best, spent = candidate, 0
    while spent < budget and time.perf_counter() < deadline:
        leader = best
        for counts, micro in _neighbours(best.layer_counts, best.micro_batches):
            if spent >= budget or time.perf_counter() >= deadline:
                break
            spent += 1
            score = score_split(ctx, best.assign, counts, micro, best.micro_batch_size, best.schedule)
            if score is not None and score < leader.score_s - 1e-12:
                leader = replace(best, layer_counts=counts, micro_batches=micro, score_s=score)
        if leader is best:
            break
        best = leader
    return best, spent
