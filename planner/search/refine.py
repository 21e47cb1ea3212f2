"""Refine a candidate's layer and batch splits against the whole estimate.

``evaluate_placement`` splits layers to minimise the slowest stage and batches to minimise the
slowest replica's makespan, alternately: fast, and right when one bottleneck dominates. The
estimate also counts the pipeline fill, the 1F1B round-trip limit, the staggered backward ends and
each stage's gradient all-reduce, so a neighbouring split can be better (a replica given one
micro-batch need not be balanced like the others). A best-improvement descent over single moves
(one layer from one stage to another, one micro-batch from one replica to another), each scored by
``split_ends_s``, closes that difference on the final candidates.

The estimate is the largest of the stages' ends, so where several stages end together no single
move lowers it: a layer taken from one of them lands on another, or lengthens the drain after the
others (dtfm-case5-mini's Tokyo-Oregon-Virginia-Frankfurt pipeline: from 3, 7, 9, 5 layers every
single move keeps the estimate or raises it, and 2, 6, 8, 8 is three moves away). The descent
therefore orders splits by their ends sorted from the last (leximin, the usual refinement of a
min-max objective: lexicographic max-ordering, Ehrgott, "Multicriteria Optimization", 2nd ed.
2005, ch. 5): a move that keeps the latest end and moves another stage's earlier is taken, which
frees the room the next move needs. The latest end never grows. A walk along equal estimates costs
a round of neighbours a step (S (S - 1) + R (R - 1) estimates), so the search takes it
(``leximin``) only with what the finalists' share leaves after their plain descent
(``planner.search.front``): on h100-a100-two-regions, leximin in the first pass spent the estimates
that its best finalist, 3 x 16 at 13.10 s, needed, and the plan became 14 x 4 at 16.56 s.
"""

import math
import time
from dataclasses import replace

import numpy as np

from planner.search.evaluate import Candidate, split_ends_s

__all__ = ["refine_split", "leximin_better", "REFINE_EVALUATIONS", "TIE_S"]

REFINE_EVALUATIONS = 2000  # most estimates one refinement may spend
TIE_S = 1e-12  # ends closer than this, in seconds, are equal (the descent's improvement threshold)


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


def leximin_better(ends, than) -> bool:
    """Whether stage ends ``ends`` come before ``than`` (both (S,) seconds): the latest no later, and
    the ends sorted from the last, compared in turn, earlier at the first that differs by more than
    ``TIE_S`` (module description)."""
    a, b = np.sort(ends)[::-1], np.sort(than)[::-1]
    if a[0] > b[0]:
        return False
    for x, y in zip(a.tolist(), b.tolist()):
        if x < y - TIE_S:
            return True
        if x > y + TIE_S:
            return False
    return False


def refine_split(ctx, candidate: Candidate, budget: int = REFINE_EVALUATIONS, deadline: float = math.inf,
                 leximin: bool = False) -> tuple:
    """(refined candidate, estimates spent): never worse than ``candidate``, same placement; stops
    at ``budget`` estimates or at the first estimate after ``time.perf_counter()`` passes ``deadline``
    (a round of a thousand replicas has a million neighbours: the clock is read at each). With
    ``leximin``, moves are ordered by ``leximin_better`` (module description), and the candidate's
    own split costs one estimate (its stages' ends); without it, a move must lower the estimate."""
    if budget < 1:
        return candidate, 0
    best, spent = candidate, 0
    best_ends = None
    if leximin:
        spent = 1
        best_ends = split_ends_s(ctx, best.assign, best.layer_counts, best.micro_batches, best.micro_batch_size,
                                 best.schedule)
        if best_ends is None:
            return candidate, spent
    while spent < budget and time.perf_counter() < deadline:
        leader, leader_ends = best, best_ends
        for counts, micro in _neighbours(best.layer_counts, best.micro_batches):
            if spent >= budget or time.perf_counter() >= deadline:
                break
            spent += 1
            ends = split_ends_s(ctx, best.assign, counts, micro, best.micro_batch_size, best.schedule)
            if ends is None:
                continue
            if leximin_better(ends, leader_ends) if leximin else float(ends.max()) < leader.score_s - TIE_S:
                leader = replace(best, layer_counts=counts, micro_batches=micro, score_s=float(ends.max()))
                leader_ends = ends
        if leader is best:
            break
        best, best_ends = leader, leader_ends
    return best, spent
