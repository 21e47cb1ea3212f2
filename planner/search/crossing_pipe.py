"""The lower bound's term for a replica whose every message crosses a slow link (``planner.search.bounds``).

At a threshold ``tau`` of ``planner.search.link_clusters`` any two devices of different clusters are
joined by links of at most ``tau`` bytes/s both ways and at least ``lambda_tau`` seconds of latency
(``cluster_bound.ClusterLevel``), and every cell of a plan sits inside one cluster. A replica of
``S`` cells holds ``S`` devices at least, so where ``S`` exceeds every cluster's size, every replica
has a stage boundary between two clusters, whose directed links carry each of its micro-batches
once each way (``cost_models.schedule.stage_ops``), each message holding its link for
``bytes / bandwidth`` and arriving ``latency`` later (``cost_models.simulator``).

Take the busiest replica (``n >= ceil(B / D)`` sequences of ``q`` bytes at a boundary at least)
and the micro-batch ``j`` whose activation crosses that boundary last: it arrives no earlier than
``n q / tau + lambda_tau``, the link held for all ``n`` sequences' activations before. Every stage
runs ``j``'s backward after that (downstream of the boundary after ``j``'s forward reached it,
upstream after ``j``'s gradient came back), so:

- ``j``'s backward runs through every block, the stages one after the other, and its gradient
  crosses back (``m q / tau + lambda_tau`` at least, ``m >= 1``) before the first stage's last
  backward, which its sync follows: ``T >= (n + 1) q / tau + 2 lambda_tau + L b + y_first``;
- the last stage runs ``j``'s backward (a block at least), then syncs: ``T >= n q / tau +
  lambda_tau + b + y_last``;
- the stage with the most blocks (``ceil(L / S)`` at least) runs ``j``'s backward through them,
  then syncs them: ``T >= n q / tau + lambda_tau + ceil(L / S) (b + y_block)``;
- every stage syncs after ``j``'s arrival, and the largest sync holds at least the average stage's
  parameters, the blocks' and both ends' extras over S: ``T >= n q / tau + lambda_tau +
  y(P / S)``;

whatever the schedule (every stage syncs after its last backward; interleaving only crosses the
boundary more often). ``b`` is one sequence's backward through a block on the fastest cell (ZB-H1's
input gradients only, where it may run). ``y`` is a stage group's sync: its blocks and extras (the
embeddings, or the head) over a group of D cells, which crosses between clusters where D exceeds
every cluster's size (``slow_crossings.crossing_sync_share``: its slowest hop at most ``tau``, its
latency steps at least ``lambda_tau``), and otherwise no faster than ``bounds``' ring at the D-th
best link.
"""

import numpy as np

from planner.search.slow_crossings import crossing_sync_share

__all__ = ["crossing_pipe_s"]


def crossing_pipe_s(level, *, stages: int, layers: int, replicas: np.ndarray, batch: int, sequence_bytes: float,
                    fastest_bytes_per_s: float, backward_block_s: float, block_sync_bytes: float,
                    first_sync_bytes: float, last_sync_bytes: float, ring_s_per_byte: np.ndarray,
                    ring_only: bool, sharded: bool, sync_every: int) -> np.ndarray:
    """(D,) seconds: the module's bound for plans of ``stages`` stages and ``replicas`` replicas at
    ``level``'s clusters; 0 where a replica fits in a cluster. ``ring_s_per_byte``: (D,) a stage
    group's sync seconds per byte of its gradients where it may sit in one cluster;
    ``backward_block_s``: ``b``; the sync bytes of a block, and of a first and a last stage
    (a block and the extras)."""
    replicas = np.asarray(replicas, dtype=float)
    largest = int(np.max(level.cluster_sizes))
    tau = min(level.tau_bytes_per_s, fastest_bytes_per_s)
    if stages < 2 or stages <= largest or tau <= 0:
        return np.zeros_like(replicas)
    lam = level.latency_s
    arrived = np.ceil(batch / replicas) * sequence_bytes / tau + lam  # the last activation over the boundary
    share, steps = crossing_sync_share(replicas, ring_only, sharded, sync_every)
    crossing = replicas > largest  # every stage group then crosses between clusters

    def sync_s(sync_bytes: float, blocks: int = 1) -> np.ndarray:
        per_byte = np.where(crossing, share / tau, ring_s_per_byte)
        return blocks * sync_bytes * per_byte + np.where(crossing, steps * lam, 0.0)

    deepest = -(-layers // stages)
    first = arrived + sequence_bytes / tau + lam + layers * backward_block_s + sync_s(first_sync_bytes)
    last = arrived + backward_block_s + sync_s(last_sync_bytes)
    deep = arrived + deepest * backward_block_s + sync_s(block_sync_bytes, deepest)
    every_sync_bytes = layers * block_sync_bytes + (first_sync_bytes - block_sync_bytes) + (last_sync_bytes - block_sync_bytes)
    average = arrived + sync_s(every_sync_bytes / stages)
    return np.maximum.reduce([first, last, deep, average])
