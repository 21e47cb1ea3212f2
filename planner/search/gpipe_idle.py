"""The lower bound's term for GPipe plans whose every replica crosses slow boundaries (``planner.search.bounds``).

Under GPipe (Huang et al. 2019; ``cost_models.schedule.stage_ops``: a round's forwards, then its
backwards, on every stage) every cell of a plan of ``S >= 2`` stages sits idle, in each round, for
every boundary of its replica crossed once each way:

- before its first forward, the round's first activation crosses each boundary upstream of it;
- between its last forward and its first backward: that backward's gradient leaves the last stage,
  whose op list runs the round's last forward first, so the last activation crosses each boundary
  downstream of the cell, and then the first gradient crosses each of them back;
- after its last backward, that gradient crosses each boundary upstream before the first stage's
  last backward, which ends the iteration's compute (its sync and step follow).

A cell computes nothing in these three windows: the simulator (``cost_models.simulator.simulate``)
runs a cell's op list in order, a receive blocks until the message arrives and a backward
(recomputation included) is one op after its receive; a message arrives at least its bytes over
its link and the link's latency after it was sent. So with ``X`` one micro-batch's messages over
every boundary, one way each, a cell of speed ``v`` with ``F`` FLOPs of work finishes no earlier
than ``F / v + 2 X`` and ``T >= F / v + 2 X`` for each, whence ``sum_cells v (T - 2 X) >= W``:

    T >= W / V + 2 X

with ``W`` the iteration's FLOPs and ``V`` the most FLOP/s the plan's cells reach together (the
bound's work term, ``bounds.work_bound_s``'s reasoning over the pair's cells). ``X`` is what every
replica pays, so only boundary prices that hold for every replica may be given: the fastest link
and the least latency, or the crossings that pure stage groups or cluster sizes force on every
replica (``planner.search.slow_crossings``, ``nested_crossings``, ``round_trip.crossing_extra_s``).
Interleaved GPipe runs other op lists: the term is for one chunk per device only.
"""

import math

import numpy as np

__all__ = ["gpipe_idle_s"]


def gpipe_idle_s(*, stages: int, cells_work_s: np.ndarray, boundary_s, latency_s, micro_batch: float = math.inf,
                 crossings: tuple = ()) -> np.ndarray:
    """(D,) seconds at least of any GPipe plan of ``stages`` (S >= 2) stages (module description):
    ``cells_work_s`` (W / V, (D,)) plus two crossings of each of the ``S - 1`` boundaries by one
    micro-batch: ``2 (S - 1) (m b + lambda)`` with ``b`` (``boundary_s``) one sequence's message
    over a boundary and ``lambda`` (``latency_s``) its latency (both may be (D,) averages over the
    boundaries, as ``round_trip.round_trip_s`` takes them), ``m`` the sequences of a micro-batch
    where the job fixes it (``micro_batch``; 1 otherwise: a micro-batch holds one at least), and
    each clustering's crossings (``crossings``: ``(k, per sequence, per trip)`` of
    ``round_trip.crossing_extra_s``, both ways already; the largest counts)."""
    hops = 2.0 * (stages - 1)
    m = micro_batch if math.isfinite(micro_batch) else 1.0
    extra = np.maximum.reduce([k * (m * per_sequence + per_trip) for k, per_sequence, per_trip in crossings],
                              initial=0.0) if crossings else 0.0
    return np.asarray(cells_work_s, dtype=float) + hops * (m * np.asarray(boundary_s) + np.asarray(latency_s)) + extra
