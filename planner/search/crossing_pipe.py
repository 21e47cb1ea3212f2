"""The lower bound's term for a replica whose every message crosses a slow link (``planner.search.bounds``).

At a threshold ``tau`` of ``planner.search.link_clusters`` any two devices of different clusters are
joined by links of at most ``tau`` bytes/s both ways and at least ``lambda_tau`` seconds of latency
(``cluster_bound.ClusterLevel``), and every cell of a plan sits inside one cluster. A replica of
``S`` cells holds ``S`` devices at least, so where ``S`` exceeds every cluster's size, every replica
has a stage boundary between two clusters, whose directed links carry each of its micro-batches
once each way (``cost_models.schedule.stage_ops``), each message holding its link for
``bytes / bandwidth`` and arriving ``latency`` later (``cost_models.simulator``).

Take the busiest replica (``n >= ceil(B / D)`` sequences of ``q`` bytes at a boundary at least)
and the micro-batch ``j`` whose activation crosses that boundary last. The first activation leaves
after micro-batch 0's forward through every block upstream of the boundary; the link then carries
all ``n`` sequences' activations one after another, so ``j``'s arrives no earlier than
``n q / tau + lambda_tau`` after that. Every stage runs ``j``'s backward after that arrival
(downstream of the boundary after ``j``'s forward reached it, upstream after ``j``'s gradient came
back), so, with ``c`` one sequence's forward and backward through a block on the fastest cell:

- ``j``'s forward runs through every block downstream and its backward through every block, the
  stages one after the other, and its gradient crosses back (``m q / tau + lambda_tau`` at least,
  ``m >= 1``) before the first stage's last backward, which its sync follows; with micro-batch 0's
  forward upstream: ``T >= (n + 1) q / tau + 2 lambda_tau + L c + y_first``;
- the last stage runs ``j``'s forward and backward (a block at least), then syncs: ``T >= n q /
  tau + lambda_tau + c + y_last``;
- the stage with the most blocks (``ceil(L / S)`` at least) runs their forward before the first
  activation leaves (upstream: micro-batch 0's) or after ``j``'s arrives (downstream: ``j``'s), and
  ``j``'s backward after, then syncs them: ``T >= n q / tau + lambda_tau + ceil(L / S) (c + y_block)``;
- every stage syncs after ``j``'s arrival, and the largest sync holds at least the average stage's
  parameters, the blocks' and both ends' extras over S: ``T >= n q / tau + lambda_tau + y(P / S)``;

whatever the schedule (every stage syncs after its last compute, ZB-H1's held weight gradients
included; interleaving only crosses the boundary more often). ``c`` is ``bounds``' block time on
the fastest cell, forward and backward together (a tensor group's all-reduces counted in the sum,
however the simulator splits them between the two), ZB-H1's weight gradients left out where it may
run (they may leave the chain). ``y`` is a stage group's sync: its blocks and extras (the
embeddings, or the head) over a group of D cells, which crosses between clusters where D exceeds
every cluster's size (``slow_crossings.crossing_sync_share``: its slowest hop at most ``tau``, its
latency steps at least ``lambda_tau``), and otherwise no faster than ``bounds``' ring at the D-th
best link.
"""

import numpy as np

from planner.search.slow_crossings import crossing_sync_share

__all__ = ["crossing_pipe_s"]


def crossing_pipe_s(level, *, stages: int, layers: int, replicas: np.ndarray, batch: int, sequence_bytes: float,
                    fastest_bytes_per_s: float, block_s: float, block_sync_bytes: float,
                    first_sync_bytes: float, last_sync_bytes: float, ring_s_per_byte: np.ndarray,
                    ring_only: bool, sharded: bool, sync_every: int) -> np.ndarray:
    """(D,) seconds: the module's bound for plans of ``stages`` stages and ``replicas`` replicas at
    ``level``'s clusters; 0 where a replica fits in a cluster. ``ring_s_per_byte``: (D,) a stage
    group's sync seconds per byte of its gradients where it may sit in one cluster;
    ``block_s``: ``c``; the sync bytes of a block, and of a first and a last stage (a block and the
    extras)."""
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
    first = arrived + sequence_bytes / tau + lam + layers * block_s + sync_s(first_sync_bytes)
    last = arrived + block_s + sync_s(last_sync_bytes)
    deep = arrived + deepest * block_s + sync_s(block_sync_bytes, deepest)
    every_sync_bytes = layers * block_sync_bytes + (first_sync_bytes - block_sync_bytes) + (last_sync_bytes - block_sync_bytes)
    average = arrived + sync_s(every_sync_bytes / stages)
    return np.maximum.reduce([first, last, deep, average])
