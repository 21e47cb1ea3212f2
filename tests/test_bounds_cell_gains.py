"""Tensor groups' gain in the replicas' chains counted per grouped cell (``planner.search.cell_gains``):
by hand, on DTFM's spot case (8 hosts of 4 V100s and 32 single ones) where it raises the replicas'
crossings term, and below the simulated time of random and pinned plans, tensor groups included."""

import numpy as np
import pytest

from planner.search.cell_gains import grouped_sequences_per_s, least_chained_time_s


def test_grouped_sequences_by_hand():
    """rho 0.5, 4 spare devices, window 4, 2 s a sequence: at most 0.5 x 4 / (4 x 2) = 0.25 sequences
    a second of the iteration; none without spare devices or at an infinite sequence time."""
    gained = grouped_sequences_per_s(0.5, np.array([0, 4, 4]), 4, np.array([2.0, 2.0, np.inf]))
    assert np.allclose(gained, [0.0, 0.25, 0.0])


def test_least_chained_time_by_hand():
    """100 sequences, replicas serving 10 a second after a 1 s sync: (100 + 1 x 10) / 10 = 11 s; with
    groups adding 0.25 a second of T: 110 / 10.25 s. One replica of two cells of 1 s a sequence, in a
    chain of window 2 (1 s a sequence), one cell a group of 1.5x (rho 0.5, one spare device): 2
    sequences take T >= 2 / (1 + 0.5 / 2) = 1.6 s, where the whole replica at 1.5x allowed 1.33 s; the
    plan itself takes 2 (1 + 1 / 1.5) / 2 = 1.67 s, above."""
    assert np.allclose(least_chained_time_s(100.0, np.array([10.0, 10.0]), np.array([1.0, 1.0]),
                                            np.array([0.0, 0.25])), [11.0, 110.0 / 10.25])
    one = least_chained_time_s(2.0, np.array([1.0]), np.array([0.0]),
                               grouped_sequences_per_s(0.5, np.array([1]), 2, np.array([1.0])))
    assert np.isclose(one[0], 1.6)
    assert 2.0 * 1.0 / 1.5 < one[0] <= 2.0 * (1.0 + 1.0 / 1.5) / 2.0


def _case2():
    from planner.inputs.job import load_job

    job = load_job("topologies/dtfm/case2-datacenter-spot.yaml")
    return job.topology, job.model, job.training


def test_raises_the_spot_case():
    """DTFM's spot case at 6 x 8: 16 spare devices, groups of at most 4 on the quad hosts; counted per
    cell they add at most 16 x 0.41 / 6 of a replica's chain (1.09 replicas to 8), where a whole
    replica at the largest group's speedup allowed 13.03 s: the replicas' crossings term is at least
    0.85 of its value without any group (17.27 s), and never above it."""
    from planner.search import bounds
    from planner.search.end_groups import end_groups_s

    topology, model, training = _case2()
    deferred = {}
    bounds._pair_bounds_s(topology, model, training, deferred=deferred)
    term, = [t.args[0] for t in deferred[6] if t.func is end_groups_s]  # any end groups
    with_groups = term(floor=None)[7]
    without = term(floor=None, tensor_speedups=np.ones(1))[7]
    assert 0.85 * without <= with_groups <= without


@pytest.mark.slow
def test_random_plans_above_their_pair_bounds():
    """Random plans (tensor groups, uneven splits, every sync) on random clustered topologies."""
    from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds

    assert_random_plans_above_their_pair_bounds(53, 90)


def test_pinned_spot_plans_above_their_pair_bounds():
    """The search pinned to 6 x 8 with groups of 2, and to 5 x 8 with groups of 4, on the spot case:
    each plan simulated above its pair's bound."""
    from planner.search.bounds import _pair_bounds_s
    from planner.search.front import SearchOptions, search

    topology, model, training = _case2()
    pairs = _pair_bounds_s(topology, model, training)
    for stages, replicas, degree in ((6, 8, 2), (5, 8, 4)):
        result = search(topology, model, training, SearchOptions(seed=0, budget_s=1, stages=stages, replicas=replicas,
                                                                 tensor_degrees=(degree,)))
        plan = result.plan
        assert pairs[plan.stages][plan.replicas - 1] <= result.objective_s, (stages, replicas, degree)
