"""The lower bound's nested-crossings term (``planner.search.nested_crossings``): the three-class
layer split by hand and against every split, and on DTFM's world-wide case (8 regions of 8 devices;
Tokyo and Seoul joined to the others at 0.694 Gbit/s at most, every region to another at 1.16 at
most) its 8 x 8 pair raised and still below the plans it bounds."""

import itertools
import math

import numpy as np
import pytest

from planner.search.nested_crossings import split_three_s


def test_split_three_by_hand():
    """24 blocks over 8 stages: 3 at 2.02 s a block + 1.34 s, 5 at 1.2 s + 0.15 s: 3.75 s fits 3 + 15
    = 18 blocks, 4.95 s 3 + 20 = 23, 5.38 s 6 + 20 = 26: 5.38 s. With 2 of the 5 at 0.7 s + 0.07 s
    instead: 4.27 s fits 3 + 9 + 12 = 24."""
    s = np.array([2.02, 1.2, 0.7])
    l = np.array([1.34, 0.15, 0.07])
    assert np.isclose(split_three_s(24, np.array([3, 5, 0]), s, l), 2 * 2.02 + 1.34)
    assert np.isclose(split_three_s(24, np.array([3, 3, 2]), s, l), 6 * 0.7 + 0.07)
    # one class: ceil(L / S) blocks on the slowest stage
    assert np.isclose(split_three_s(24, np.array([0, 0, 8]), s, l), 3 * 0.7 + 0.07)
    # a class of free syncs holds every block at its latency; the others one block each
    assert np.isclose(split_three_s(24, np.array([1, 0, 7]), np.array([2.0, 1.0, 0.0]), l), 2.0 + 1.34)


def test_split_three_tiny_block_time_holds_every_block_quietly():
    """A class whose block time is a hair above zero (1e-305 s) holds every block: the slow class's
    one block a stage decides, with no float overflow warned on the way (the 1,024-device bound
    printed one to the user before)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = split_three_s(24, np.array([50, 5]), np.array([1e-305, 1000.0]), np.array([0.0, 0.0]))
    assert got == 1000.0


def test_split_three_is_every_splits_least_or_below():
    """Against the least over every split of random sizes and costs: never above it, and equal on
    most (the window from the relaxed least on)."""
    rng = np.random.default_rng(11)
    equal = 0
    for _ in range(300):
        layers = int(rng.integers(2, 13))
        stages = int(rng.integers(1, min(layers, 5) + 1))
        cut = np.sort(rng.integers(0, stages + 1, 2))
        counts = np.array([cut[0], cut[1] - cut[0], stages - cut[1]])
        s, l = rng.random(3) * 2.0, rng.random(3) * 0.5
        classes = np.repeat(np.arange(3), counts)
        want = math.inf
        for split in itertools.product(range(1, layers + 1), repeat=stages):
            if sum(split) == layers:
                want = min(want, max(a * s[k] + l[k] for a, k in zip(split, classes)))
        got = float(split_three_s(layers, counts, s, l))
        assert got <= want + 1e-9, (layers, counts, got, want)
        equal += np.isclose(got, want)
    assert equal >= 290


def _worldwide():
    from planner.inputs.job import load_job

    return load_job("topologies/dtfm/case5-worldwide.yaml")


@pytest.mark.slow
def test_worldwide_eight_by_eight_is_raised_and_stays_below_its_plans(monkeypatch):
    """8 x 8 uses every device, Tokyo's and Seoul's 16 too: either a group with a device there syncs
    over 0.694 Gbit/s, or their groups cross the other regions' 1.16 Gbit/s links, or both sets of
    pure groups make every replica cross between them; the bound rises from 19.47 s (each threshold
    alone; 19.65 s with the end groups' placements, ``end_groups``) to above 20.8 s. A replica in each region, a stage group in each region, and the searched
    plan simulate above it."""
    import planner.search.bounds as bounds
    from cost_models.schedule import Schedule
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.front import SearchOptions, search

    job = _worldwide()
    topology, model, training = job.topology, job.model, job.training
    bound = bounds._pair_bounds_s(topology, model, training)[8][7]
    assert bound > 20.8
    names = topology.names
    replica_major = [[names[8 * r + s] for s in range(8)] for r in range(8)]
    stage_major = [[names[8 * s + r] for s in range(8)] for r in range(8)]
    for assignment in (replica_major, stage_major):
        for schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE):
            plan = Plan(layer_bounds=(0, 2, 5, 8, 11, 14, 17, 20, 24), assignment=tuple(map(tuple, assignment)),
                        micro_batches=(128,) * 8, micro_batch_size=1, schedule=schedule)
            prediction, _ = predict(plan, topology, model, training)
            assert prediction.iteration_s >= bound, (schedule, prediction.iteration_s, bound)
    result = search(topology, model, training,
                    SearchOptions(seed=2, budget_s=1.0, time_limit_s=120.0, stages=8, replicas=8))
    assert result.objective_s >= bound
    monkeypatch.setattr(bounds, "nested_crossing_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    assert bounds._pair_bounds_s(topology, model, training)[8][7] < 19.7


@pytest.mark.slow
def test_stays_below_random_plans():
    """Random plans on random clustered topologies (``tests.test_bounds_clusters._checked_plans``:
    hosts, regions, slow region pairs, tensor groups, uneven splits, every sync and schedule) never
    simulate below their pair's bound with the nested crossings counted."""
    from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds

    assert_random_plans_above_their_pair_bounds(29, 90)
