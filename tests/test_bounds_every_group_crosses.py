"""Stage groups that no cluster of a finer clustering holds (``slow_crossings.every_group_crosses``):
the slowest link and longest latency by hand, and on DTFM's world-wide case (8 regions of 8
devices, Tokyo and Seoul joined to the rest at 0.694 Gbit/s at most) the bound of its stuck pairs
raised and still below the plans it bounds."""

from types import SimpleNamespace

import numpy as np
import pytest

from planner.search.slow_crossings import every_group_crosses


def _level(sizes, tau, latency):
    return SimpleNamespace(cluster_sizes=np.array(sizes), tau_bytes_per_s=tau, latency_s=latency)


def test_every_group_crosses_by_hand():
    """Clusterings of sizes (48, 16) at 80 MB/s, 100 ms and (8 x 8) at 145 MB/s, 11 ms: a group of 8
    cells or fewer fits a cluster of both (no link counted); of 9 to 48 only the finer's clusters are
    too small (145 MB/s, 11 ms); above 48 both are, and the slower link and the longer latency count
    together."""
    levels = [_level([48, 16], 80e6, 0.1), _level([8] * 8, 145e6, 0.011)]
    tau, latency = every_group_crosses(levels, np.array([1, 8, 9, 48, 49]))
    assert list(tau) == [np.inf, np.inf, 145e6, 145e6, 80e6]
    assert list(latency) == [0.0, 0.0, 0.011, 0.011, 0.1]
    # the longest latency may come from the faster clustering
    tau, latency = every_group_crosses([_level([4], 50e6, 0.01), _level([2, 2], 90e6, 0.03)], np.array([3, 5]))
    assert list(tau) == [90e6, 50e6] and list(latency) == [0.03, 0.03]


def _worldwide():
    from planner.inputs.job import load_job

    return load_job("topologies/dtfm/case5-worldwide.yaml")


@pytest.mark.slow
def test_worldwide_pairs_are_raised_and_stay_below_their_plans(monkeypatch):
    """3 x 21 and 4 x 16: a stage group of 21 (16) cells needs three (two) regions, so its ring has a
    hop of at most 1.16 Gbit/s even where it stays out of Tokyo and Seoul, while a group with a
    device there syncs at 0.694 Gbit/s at most: the bound rises from 18.57 s and 19.04 s (one
    threshold at a time; 19.10 s at 4 x 16 with the end groups' placements, ``end_groups``) to above
    22.5 s and 22.2 s; the plans of stage groups filled region by region
    and the searched plans of those degrees simulate above it."""
    import planner.search.bounds as bounds
    from cost_models.schedule import Schedule
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.front import SearchOptions, search

    job = _worldwide()
    topology, model, training = job.topology, job.model, job.training
    pairs = bounds._pair_bounds_s(topology, model, training)
    with monkeypatch.context() as patch:  # this term alone, without two clusterings at once
        patch.setattr(bounds, "nested_crossing_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
        alone = bounds._pair_bounds_s(topology, model, training)
    assert alone[3][20] > 22.5 and alone[4][15] > 22.2
    names = topology.names
    for stages, replicas, layer_bounds in ((3, 21, (0, 8, 16, 24)), (4, 16, (0, 6, 12, 18, 24))):
        bound = pairs[stages][replicas - 1]
        busy = 1024 % replicas
        micro_batches = tuple(1024 // replicas + (r < busy) for r in range(replicas))
        stage_major = [[names[replicas * s + r] for s in range(stages)] for r in range(replicas)]
        for schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE):
            plan = Plan(layer_bounds=layer_bounds, assignment=tuple(map(tuple, stage_major)),
                        micro_batches=micro_batches, micro_batch_size=1, schedule=schedule)
            prediction, _ = predict(plan, topology, model, training)
            assert prediction.iteration_s >= bound, (stages, schedule, prediction.iteration_s, bound)
        result = search(topology, model, training,
                        SearchOptions(seed=1, budget_s=1.0, time_limit_s=120.0, stages=stages, replicas=replicas))
        assert result.objective_s >= bound, (stages, result.objective_s, bound)
    # one threshold at a time (no finer clustering's link for pure groups, no two clusterings at once), as before
    monkeypatch.setattr(bounds, "nested_crossing_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    monkeypatch.setattr(bounds, "every_group_crosses",
                        lambda levels, replicas: (np.full(np.shape(replicas), np.inf), np.zeros(np.shape(replicas))))
    before = bounds._pair_bounds_s(topology, model, training)
    assert before[3][20] < 18.6 and before[4][15] < 19.15


@pytest.mark.slow
def test_stays_below_random_plans():
    """Random plans on random clustered topologies (``tests.test_bounds_clusters._checked_plans``:
    tensor groups, uneven splits, every sync and schedule, groups filled region by region or replicas
    so) never simulate below their pair's bound with the finer clusterings' links counted."""
    from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds

    assert_random_plans_above_their_pair_bounds(41, 90)
