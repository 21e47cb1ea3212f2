"""The first and last stage groups' placements (``planner.search.end_groups``): the runs they force by
hand, the term above ``replica_crossings``' on DTFM's on-demand case (8 hosts of 8 V100s), and below
the simulated time of random and pinned plans."""

import numpy as np
import pytest

from planner.search.end_groups import end_counts


def test_end_counts_by_hand():
    """Hosts of 8. At 9 x 7 every replica has 2 runs at least (M_i = 2 i); both ends pure take 7
    devices of two hosts each, one left over in each: two replicas of 2 runs at most, the others 3
    (2 i + max(0, i - 2): 2, 4, 7, 10, ...); one end pure adds nothing there (i + max(0, i - 1) <= 2 i).
    At 4 x 5 (M_i = i: a host holds two replicas) one pure end leaves 3 devices: 3 replicas of one
    run, then 2 runs (1, 2, 3, 5, 7)."""
    two = 2.0 * np.arange(1, 8)
    counts = end_counts(two, 9, np.array([7]), 8, 2, np.zeros((9, 1)))[:, 0]
    assert list(counts[:3]) == [0, 2, 5] and counts.sum() == 7
    assert list(end_counts(two, 9, np.array([7]), 8, 1, np.zeros((9, 1)))[:3, 0]) == [0, 7, 0]
    counts = end_counts(np.arange(1, 6, dtype=float), 4, np.array([5, 4]), 8, 1, np.zeros((4, 2)))
    assert list(counts[:, 0]) == [3, 2, 0, 0]
    assert list(counts[:, 1]) == [4, 0, 0, 0]  # D = 4: 4 devices left, every replica may fit in one host
    assert list(end_counts(np.arange(1, 6, dtype=float), 4, np.array([5]), 8, 0, np.zeros((4, 1)))[:, 0]) == [5, 0, 0, 0]
    kept = np.arange(4.0)[:, None]  # D = 9 on hosts of 8: no group pure, the counts given kept
    assert list(end_counts(np.arange(1, 10, dtype=float), 4, np.array([9]), 8, 2, kept)[:, 0]) == [0, 1, 2, 3]


def _case1():
    from planner.inputs.job import load_job

    job = load_job("topologies/dtfm/case1-datacenter-ondemand.yaml")
    return job.topology, job.model, job.training


def test_raises_the_on_demand_case():
    """At 9 x 7 the replicas' crossings term with any end groups is 8.75 s (1F1B's chain, every replica
    crossing once); either end group crossing syncs the embeddings or the head at 3.125 Gbit/s, both
    pure make five replicas cross twice: at least 0.3 s more. The least pair rises above 9 s."""
    from planner.search import bounds
    from planner.search.end_groups import end_groups_s

    topology, model, training = _case1()
    deferred = {}
    bounds._pair_bounds_s(topology, model, training, deferred=deferred)
    term, = [t for t in deferred[9] if t.func is end_groups_s]
    assert term()[6] >= term.args[0](floor=None)[6] + 0.3
    assert bounds.lower_bound_s(topology, model, training) > 9.0


@pytest.mark.slow
def test_random_plans_above_their_pair_bounds():
    """Random plans (tensor groups, uneven splits, every sync) on random clustered topologies."""
    from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds

    assert_random_plans_above_their_pair_bounds(67, 90)


def test_pinned_on_demand_plans_above_their_pair_bounds():
    """The search pinned to the least pairs of the on-demand case (12 x 5, 9 x 7) and to 4 x 8 with
    groups of 2: each plan simulated above its pair's bound."""
    from planner.search.bounds import _pair_bounds_s
    from planner.search.front import SearchOptions, search

    topology, model, training = _case1()
    pairs = _pair_bounds_s(topology, model, training)
    for stages, replicas, degrees in ((12, 5, (1,)), (9, 7, (1,)), (4, 8, (2,))):
        result = search(topology, model, training, SearchOptions(seed=0, budget_s=1, stages=stages, replicas=replicas,
                                                                 tensor_degrees=degrees))
        plan = result.plan
        assert pairs[plan.stages][plan.replicas - 1] <= result.objective_s, (stages, replicas, degrees)
