"""Where a small plan's cells sit among clusters (``planner.search.cluster_patterns``): the patterns,
rings and crossings by hand, a chain over three clusters whose every order crosses a slow pair, the
term above the uniform crossings' price on the emulated world-wide case (4 regions x 2 V100s), and
below the simulated time of random and pinned plans."""

import math
from pathlib import Path

import numpy as np
import pytest

from cost_models.schedule import Schedule
from planner.search.cluster_patterns import _downstream, _patterns, _ring_rates, _undominated, pattern_chains_s

_CASE5_MINI = Path(__file__).resolve().parent.parent / "topologies" / "emulated" / "dtfm-case5-mini.yaml"


def test_patterns_by_hand():
    """Two clusters of two devices, 2 stages x 2 replicas: of the 10 multisets of two rows, the 4 whose
    cells fit (one cluster each replica; one cluster each stage; both replicas crossing one way; both
    crossing opposite ways), and 2 replicas of 3 stages: none past 4 cells, none when they cannot fit."""
    found = {tuple(map(tuple, p)) for p in _patterns(2, 2, np.array([2, 2]), 100)}
    assert found == {((0, 0), (1, 1)), ((0, 1), (0, 1)), ((0, 1), (1, 0)), ((1, 0), (1, 0))}
    assert _patterns(3, 2, np.array([2, 2]), 100).shape[0] == 0
    assert _patterns(2, 2, np.array([2, 2]), 3) is None  # past the most: none enumerated
    assert _patterns(1, 3, np.array([1, 1, 1]), 100).shape == (1, 3, 1)  # 3 cells in 3 clusters of one


def test_rings_and_crossings_by_hand():
    """Three clusters; links (bytes/s) 0 -> 1: 4, 1 -> 0: 2, 1 -> 2: 1, 2 -> 1: 3, 0 <-> 2: 8. A stage in
    one cluster syncs at the pure rate (10), in clusters 0 and 1 at the slower way (2), in all three at
    the fastest pair's (8), never above the pure rate. Row (0, 1, 2), one byte a sequence, fastest link 8 (1/8 s), least latency
    0.1 s, latencies 0.5 s: boundary 0 adds 1/4 + 1/2 - 2/8 = 0.5 s a sequence and 2 (0.5 - 0.1) = 0.8 s a
    trip, boundary 1 adds 1 + 1/3 - 1/4; stage 0's chain crosses both, stage 1's the second, stage 2's none."""
    fastest = np.array([[0.0, 4.0, 8.0], [2.0, 0.0, 1.0], [8.0, 3.0, 0.0]])
    least = np.full((3, 3), 0.5)
    patterns = np.array([[[0, 0], [0, 1], [0, 2]], [[0, 2], [1, 2], [0, 2]]])  # (P=2, D=3, S=2)
    assert _ring_rates(patterns, fastest, 10.0).tolist() == [[10.0, 8.0], [2.0, 10.0]]
    assert _ring_rates(patterns, fastest, 5.0).tolist() == [[5.0, 5.0], [2.0, 5.0]]  # never above the pure rate
    per_sequence, per_trip = _downstream(np.array([[0, 1, 2], [1, 1, 0]]), fastest, least, 1.0, 1 / 8, 0.1)
    second = 1.0 + 1 / 3 - 1 / 4
    assert per_sequence[0] == pytest.approx([0.5 + second, second, 0.0])
    assert per_trip[0] == pytest.approx([1.6, 0.8, 0.0])
    assert per_sequence[1] == pytest.approx([0.5 + 0.25 - 0.25, 0.5, 0.0])  # 1 -> 0: 1/2 + 1/4 - 2/8
    assert per_trip[1] == pytest.approx([0.8, 0.8, 0.0])


def test_undominated_keeps_the_least_of_any_growing_bound():
    """Against every row: the kept rows are a subset, and any positive weighting's least is on one."""
    rng = np.random.default_rng(3)
    costs = rng.integers(0, 4, size=(300, 4)).astype(float)
    kept = _undominated(costs)
    assert {tuple(r) for r in kept} <= {tuple(r) for r in costs}
    for _ in range(20):
        weights = rng.random(4)
        assert (kept @ weights).min() == pytest.approx((costs @ weights).min())
        assert np.max(kept, axis=1, initial=0).min() <= np.max(costs, axis=1).min()


def _three_clusters(**overrides) -> dict:
    """One device in each of three clusters A, B, C (bytes/s both ways: A-B 1, B-C 1/2, A-C 1/4, no
    latency), 3 stages of no compute, one replica of 3 sequences in micro-batches of 1, 1F1B."""
    fastest = np.array([[0.0, 1.0, 0.25], [1.0, 0.0, 0.5], [0.25, 0.5, 0.0]])
    args = dict(replicas=np.array([1]), busiest=np.array([3.0]), ring_bytes_per_s=np.array([np.inf]),
                share=np.array([0.0]), block_sync_bytes=1.0, first_sync_bytes=1.0, last_sync_bytes=1.0,
                sequence_bytes=1.0, stages=3, layers=3, schedules=(Schedule.ONE_F_ONE_B,), interleaved=False,
                per_round=math.inf, micro_batch=1.0, layer_s=0.0, head_s=0.0, boundary_s=1.0, latency_s=0.0)
    args.update(overrides)
    return dict(fastest=fastest, least=np.zeros((3, 3)), capacity=np.array([1, 1, 1]), **args)


def test_three_clusters_by_hand():
    """The replica visits A, B and C in some order; its boundaries' extras over two fastest links
    (2 s a sequence) are 0 (A-B), 2 (B-C) and 6 (A-C). Stage 0 chains one trip of 1 sequence over both
    boundaries, ``4 + e_0 + e_1``; stage 1 two trips of 1 over the second, after the first message
    (1 s): ``1 + 2 (2 + e_1)``. C-B-A: max(6, 5) = 6, the least (A-B-C: 9, B-A-C: 17, C-A-B: 10,
    A-C-B: 12, B-C-A: 17); every crossing at the fastest pair's price (extras 0) would give 5."""
    args = _three_clusters()
    assert pattern_chains_s(args.pop("fastest"), args.pop("least"), args.pop("capacity"), **args)[0] == \
        pytest.approx(6.0, rel=1e-5)
    uniform = _three_clusters()
    uniform["fastest"] = np.ones((3, 3))  # every pair as fast as A-B
    assert pattern_chains_s(uniform.pop("fastest"), uniform.pop("least"), uniform.pop("capacity"), **uniform)[0] == \
        pytest.approx(5.0, rel=1e-5)


def test_two_replicas_sync_over_the_pair_they_span():
    """2 stages x 2 replicas on two clusters of two devices (10 bytes/s inside, 1 between, both ways;
    the fastest link priced 0.1 s a sequence), 2 blocks of no compute, one sequence, a block's sync 4
    bytes at share 1. Pure stage groups make both replicas cross: stage 0's one trip takes 2 x 0.1 +
    (1 + 1 - 0.2) = 2 s, then its block's sync 0.4 s inside its cluster: 2.4 s. Groups spanning both
    clusters sync at the slower way, 4 s a block: 0.2 + 4 s at least. The least: 2.4 s."""
    fastest = np.array([[10.0, 1.0], [1.0, 10.0]])
    got = pattern_chains_s(fastest, np.zeros((2, 2)), np.array([2, 2]), replicas=np.array([2]),
                           busiest=np.array([1.0]), ring_bytes_per_s=np.array([10.0]), share=np.array([1.0]),
                           block_sync_bytes=4.0, first_sync_bytes=0.0, last_sync_bytes=0.0, sequence_bytes=1.0,
                           stages=2, layers=2, schedules=(Schedule.ONE_F_ONE_B,), interleaved=False,
                           per_round=math.inf, micro_batch=1.0, layer_s=0.0, head_s=0.0, boundary_s=0.1,
                           latency_s=0.0)
    assert got[0] == pytest.approx(2.4, rel=1e-5)


def test_raises_the_emulated_world_wide_case():
    """At 4 x 2 every stage group sits in one region (each replica's path visits all four: the least
    path Tokyo-Oregon-Virginia-Frankfurt, 1.37 s a micro-batch one way where the fastest pair would
    price 3 crossings at 1.06 s) or two groups span a region pair and sync over it: the pair's bound
    rises from 15.53 s to 18.66 s, above 18.38 s (25% under the 24.51 s plan); the least pair is 4 x 2."""
    from planner.inputs.job import load_job
    from planner.search import bounds

    job = load_job(_CASE5_MINI)
    pairs = bounds._pair_bounds_s(job.topology, job.model, job.training)
    assert pairs[4][1] >= 18.38
    assert bounds.lower_bound_s(job.topology, job.model, job.training) == pytest.approx(pairs[4][1])


@pytest.mark.slow
def test_random_plans_above_their_pair_bounds():
    """Random plans (tensor groups, uneven splits, every sync) on random clustered topologies."""
    from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds

    assert_random_plans_above_their_pair_bounds(102, 60)


@pytest.mark.parametrize("stages, replicas", [(4, 2), (3, 2), (8, 1), (5, 1)])
@pytest.mark.slow
def test_pinned_world_wide_plans_above_their_pair_bounds(stages, replicas):
    """The search pinned to the emulated world-wide case's lifted pairs: each plan above its bound."""
    from tests.test_bounds_clusters import pair_bound_and_pinned_plan_s

    bound, plan_s = pair_bound_and_pinned_plan_s(_CASE5_MINI, stages, replicas, seed=0)
    assert 0.0 < bound <= plan_s
