"""The lower bound's every-stage chains term (``planner.search.stage_chains``): a small case by hand,
its split search against every split, and plans simulated on the topologies it tightens (every layer
split of one placement, both schedules) never below their pair's bound."""

import itertools
import math

import numpy as np
import pytest

from cost_models.schedule import Schedule
from planner.search.stage_chains import _least_split_s, clustered_stage_chains_s, stage_chains_s
from tests.test_bounds_clusters import pair_bound_and_pinned_plan_s

_SMALL = dict(stages=2, layers=4, busiest=np.array([8.0]), interleaved=False, per_round=np.inf, micro_batch=2.0,
              layer_s=1.0, head_s=0.0, boundary_s=0.5, latency_s=0.1, layer_sync_s=np.array([2.0]),
              first_sync_s=np.array([1.0]), last_sync_s=np.array([0.0]))


def test_small_case_by_hand():
    """2 stages, 4 blocks of 1 s a sequence, 8 sequences in micro-batches of 2, messages 0.5 s a
    sequence and 0.1 s latency, syncs 2 s a block and 1 s the embeddings. 1F1B: stage 0's work
    1 + 10 l0 and its chain of 2 trips of 2 micro-batches (4 sequences carried, 4 blocks and two
    messages each, 2 latencies a trip) 1 + 4 (4 + 1) + 0.4 + 2 l0; stage 1 waits 2 * 0.5 + 0.1 and
    works 10 l1. Splits 1+3: 31.1, 2+2: max(21, 25.4, 21.1) = 25.4, 3+1: 31 -> 25.4. GPipe: stage
    0's gap of one micro-batch's trip (2 * 4 + 2 * 1.1) after its 8 l0 of the other sequences, so 11.2
    + 8 l0, its phases 1 + 8 + 0.2 + 2 l0: 2+2 gives 27.2. ZB-H1's chain counts no compute: 5.4 +
    2 l0, and 2+2 gives 21.1."""
    assert stage_chains_s(schedules=(Schedule.ONE_F_ONE_B,), **_SMALL)[0] == pytest.approx(25.4, rel=1e-6)
    assert stage_chains_s(schedules=(Schedule.GPIPE,), **_SMALL)[0] == pytest.approx(27.2, rel=1e-6)
    both = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
    assert stage_chains_s(schedules=both, **_SMALL)[0] == pytest.approx(25.4, rel=1e-6)
    assert stage_chains_s(schedules=(Schedule.ZERO_BUBBLE,), **_SMALL)[0] == pytest.approx(21.1, rel=1e-6)
    # GPipe whose activations cannot fit is left out; interleaving keeps the work only
    assert stage_chains_s(schedules=(Schedule.ONE_F_ONE_B, Schedule.GPIPE), gpipe_fits=np.array([False]),
                          **_SMALL)[0] == pytest.approx(25.4, rel=1e-6)
    interleaved = {**_SMALL, "interleaved": True}
    assert stage_chains_s(schedules=(Schedule.ONE_F_ONE_B,), **interleaved)[0] == pytest.approx(21.1, rel=1e-6)


def test_one_odd_stage_and_crossings_by_hand():
    """The small case, one stage's syncs 6 s a block and 3 s the embeddings (a ring across a slow
    link): on stage 0, 3 + 14 l0 and 23.4 + 6 l0 against 1.1 + 10 l1, 31.1 at 1+3; on stage 1,
    1 + 10 l0, 21.4 + 2 l0 against 1.1 + 14 l1, 29.1 at 2+2: the least, 29.1. Two clusters of two
    devices, 2 x 2 cells: either a stage's ring crosses (29.1) or each cluster holds one stage group
    and the replica's one boundary crosses, 0.3 s a sequence and 0.05 s a trip more on stage 0's
    chain, 1 + 4 (4 + 1 + 0.3) + 2 (0.2 + 0.05) + 2 l0 = 22.7 + 2 l0, 26.7 at 2+2: the least of the
    two, 26.7. One replica (2 cells) fits in a cluster, and without ring-only syncs the crossing
    stage is not priced: 0 then."""
    one = (Schedule.ONE_F_ONE_B,)
    odd = (np.array([6.0]), np.array([3.0]), np.array([0.0]))
    assert stage_chains_s(schedules=one, odd_sync=odd, **_SMALL)[0] == pytest.approx(29.1, rel=1e-6)
    assert stage_chains_s(schedules=one, crossings=(1, 0.3, 0.05), **_SMALL)[0] == pytest.approx(26.7, rel=1e-6)

    class Level:
        cluster_sizes = np.array([2, 2])
        slower_way_bytes_per_s = 1.0

    def clustered(replicas, ring_only):
        return clustered_stage_chains_s(Level, replicas=np.array([replicas]), ring_only=ring_only,
                                        share=np.array([1.0]), block_sync_bytes=6.0, first_sync_bytes=3.0,
                                        last_sync_bytes=0.0, crossing_extra=lambda fewest: (fewest, 0.3, 0.05),
                                        ring_bytes_per_s=np.array([10.0]), schedules=one, **_SMALL)[0]

    assert clustered(2, True) == pytest.approx(26.7, rel=1e-6)
    assert clustered(1, True) == 0.0 and clustered(2, False) == 0.0


def test_least_split_agrees_with_every_split():
    """The greedy split and the search on the limit against the least over every split, on random affine terms
    whose intercepts fall with the blocks upstream."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        layers = int(rng.integers(2, 11))
        stages = int(rng.integers(2, min(layers, 5) + 1))
        coefficients = rng.random((stages, 3, 3)) * [4.0, 0.5, 3.0]  # per stage and term: a, -da/dP, b

        def terms(k, upstream, c=coefficients):
            size = np.shape(upstream)
            return [(np.broadcast_to(a + fall * (layers - upstream), size), np.full(size, b)) for a, fall, b in c[k]]

        got = _least_split_s(stages, layers, terms, (1,))[0]
        want = np.inf
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            sizes = np.diff((0, *cuts, layers))
            upstream = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            want = min(want, max(float((a + b * size)[0]) for k, size in enumerate(sizes)
                                 for a, b in terms(k, np.array([float(upstream[k])]))))
        assert got <= want and got == pytest.approx(want, rel=1e-6), (layers, stages)


def _home():
    from planner.inputs.job import load_job

    return load_job("topologies/hetero/home-consumer-gpus.yaml")


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_home_three_by_two_stays_below_every_split_of_its_placement(micro_batch_size):
    """home-consumer-gpus, 3 x 2 in Paris (the search's placement: a 3090 and the two 4090s, three
    3090s; its 144 and 112 sequences): under layer splits from 1 to 22 blocks on stages 0 and 1, in
    micro-batches of 1, 2 and 4 (1F1B: GPipe's activations do not fit), the plan simulates above the
    pair's bound, which the term raises from 43.71 s to above 50 s (the search's plan: 66.21 s)."""
    import planner.search.bounds as bounds
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict

    job = _home()
    topology, model, training = job.topology, job.model, job.training
    bound = bounds._pair_bounds_s(topology, model, training)[3][1]
    assert bound > 50.0
    assignment = (("paris-3090-0", "paris-4090-0", "paris-4090-1"), ("paris-3090-1", "paris-3090-2", "paris-3090-3"))
    simulated = 0
    for first in range(1, 23, 3):
        for second in range(1, 24 - first, 3):
            plan = Plan(layer_bounds=(0, first, first + second, 24), assignment=assignment,
                        micro_batches=(144 // micro_batch_size, 112 // micro_batch_size),
                        micro_batch_size=micro_batch_size, schedule=Schedule.ONE_F_ONE_B)
            prediction, _ = predict(plan, topology, model, training)
            if prediction.fits:
                simulated += 1
                assert prediction.iteration_s >= bound, (first, second, prediction.iteration_s, bound)
    assert simulated >= 20


@pytest.mark.slow
def test_stays_below_random_plans_and_raises_some(monkeypatch):
    """Random plans (tensor groups, uneven splits, every sync, 1F1B/GPipe/ZB-H1 by the random job,
    interleaving) on random clustered topologies never simulate below their pair's bound; the term
    raises that bound on some (the bound computed again with the term at zero)."""
    import planner.search.bounds as bounds
    from tests.test_bounds_clusters import _checked_plans

    checked = _checked_plans(29, 90, lambda *job: bounds._pair_bounds_s(*job))
    for pairs, predicted, plan in checked:
        bound = pairs[plan.stages][plan.replicas - 1]
        assert bound <= predicted * (1 + 1e-9), (bound, predicted, plan.stages, plan.replicas)
    monkeypatch.setattr(bounds, "stage_chains_s", lambda **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "clustered_stage_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "pattern_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))
    again = _checked_plans(29, 90, lambda *job: bounds._pair_bounds_s(*job))
    raised = sum(pairs[plan.stages][plan.replicas - 1] > 1.02 * without[plan.stages][plan.replicas - 1]
                 for (pairs, _, plan), (without, _, _) in zip(checked, again))
    assert len(checked) >= 30
    assert raised >= 1


def test_dtfm_mini_four_by_two_stays_below_its_placements():
    """dtfm-case5-mini, 4 x 2 on its eight V100s (four regions of two): every stage group in a region
    (each replica crossing three regions' links) or each replica in two regions (two stage groups'
    rings crossing), under several layer splits, simulate above the pair's bound, which the clusters'
    stage chains raise from 13.92 s to above 14.7 s (the search's plan: 24.73 s)."""
    from planner.inputs.job import load_job
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.bounds import _pair_bounds_s

    job = load_job("topologies/emulated/dtfm-case5-mini.yaml")
    topology, model, training = job.topology, job.model, job.training
    bound = _pair_bounds_s(topology, model, training)[4][1]
    assert bound > 14.7
    regions = ("tokyo", "oregon", "virginia", "frankfurt")
    stage_groups = tuple(tuple(f"{region}-{r}" for region in regions) for r in range(2))
    replicas = (("tokyo-0", "tokyo-1", "oregon-0", "oregon-1"), ("virginia-0", "virginia-1", "frankfurt-0",
                                                                 "frankfurt-1"))
    for assignment in (stage_groups, replicas):
        for layer_bounds in ((0, 4, 11, 19, 24), (0, 6, 12, 18, 24), (0, 1, 9, 17, 24), (0, 8, 16, 23, 24)):
            plan = Plan(layer_bounds=layer_bounds, assignment=assignment, micro_batches=(16, 16), micro_batch_size=4,
                        schedule=Schedule.ONE_F_ONE_B)
            prediction, _ = predict(plan, topology, model, training)
            assert prediction.iteration_s >= bound, (assignment, layer_bounds, prediction.iteration_s, bound)


def test_crossing_group_case_still_counts_each_replica_spanning_clusters():
    """dtfm-case5-mini, 4 x 2 (two V100s a region): where a stage group spans two regions, each
    replica's four cells still sit in two regions at least (``crossing_extra(fewest=0)``), so its
    trips cross between them: the pair's bound 14.81 -> 15.53 s; the search pinned there stays above."""
    bound, plan_s = pair_bound_and_pinned_plan_s("topologies/emulated/dtfm-case5-mini.yaml", 4, 2, seed=1)
    assert bound > 15.5
    assert plan_s >= bound


def testpure_groups_fill_both_of_two_clusters():
    """Two cities of six homes: 5 groups of 2 with one spanning both leave 5 homes a city, room for
    2 pure groups each, so the 4 pure groups fill both; with 4 spanning (2 a city left) one pure
    group fits in one city, so "many" does not hold; 3 groups of 2 with one spanning: 2 pure groups
    fit in one city of 5 homes."""
    from planner.search.stage_chains import pure_groups_fill_both

    sizes = np.array([6, 6])
    assert pure_groups_fill_both(sizes, 5, 2, "one")
    assert not pure_groups_fill_both(sizes, 5, 2, "many")
    assert not pure_groups_fill_both(sizes, 3, 2, "one")
    # three homes a city, 4 groups of 2: 2 spanning leave 1 home a city (2 pure groups, one in each),
    # 3 spanning leave none (1 pure group, nowhere to go), 4 cannot span
    assert pure_groups_fill_both(np.array([3, 3]), 4, 2, "many")
    assert not pure_groups_fill_both(np.array([3, 3]), 3, 2, "many")  # all 3 may span: no pure group


def test_home_consumer_five_by_two_crossing_group_forces_replicas_across():
    """home-consumer-gpus, 5 x 2 on ten of twelve homes: a group spanning Berlin and Paris leaves
    pure groups in both cities, so each replica crosses between them too: 44.54 -> above 46.5 s; the
    search pinned there stays above."""
    bound, plan_s = pair_bound_and_pinned_plan_s("topologies/hetero/home-consumer-gpus.yaml", 5, 2, seed=3)
    assert bound > 46.5
    assert plan_s >= bound


def testfewest_open_crossings_between_two_cities():
    """Two cities of six homes: 5 groups of 2 leave a pure group room in one city only with 4
    spanning (2 homes a city left); 4 groups of 3 with 3 spanning (3 left, one pure group); 3 groups
    of 3 already with 2; 4 groups of 2 over two cities of three homes never (3 may span at most,
    leaving one pure group and no city with two homes)."""
    from planner.search.stage_chains import fewest_open_crossings

    assert fewest_open_crossings(np.array([6, 6]), 5, 2) == 4
    assert fewest_open_crossings(np.array([6, 6]), 4, 3) == 3
    assert fewest_open_crossings(np.array([6, 6]), 3, 3) == 2
    assert fewest_open_crossings(np.array([3, 3]), 4, 2) == 0


def test_more_slow_stages_hand_computed():
    """Three stages over four blocks (1 s a block, no messages, usual syncs free, slow ones 5 s a
    block of the stage): two slow stages take the two one-block stages, ``max(2, 1 + 5, 1 + 5)`` = 6 s; three
    slow stages cannot avoid a two-block one: ``2 (1 + 5)`` = 12 s."""
    slow = (np.array([5.0]), np.array([0.0]), np.array([0.0]))
    arguments = dict(stages=3, layers=4, busiest=np.array([1.0]), schedules=(Schedule.ONE_F_ONE_B,), interleaved=True,
                     per_round=math.inf, micro_batch=math.inf, layer_s=1.0, head_s=0.0, boundary_s=0.0,
                     latency_s=0.0, layer_sync_s=np.array([0.0]), first_sync_s=np.array([0.0]),
                     last_sync_s=np.array([0.0]), odd_sync=slow, second_sync=slow)
    assert stage_chains_s(**arguments)[0] == pytest.approx(6.0, rel=1e-6)
    assert stage_chains_s(**arguments, seconds=2)[0] == pytest.approx(12.0, rel=1e-6)


def test_home_consumer_five_by_two_many_crossing_groups_sync_slowly():
    """home-consumer-gpus, 5 x 2 on ten of twelve homes: two or three groups spanning Berlin and Paris
    leave pure groups in both cities (each replica crosses), and a pure group fits in one city only
    once four span, whose four rings cross: 46.79 -> above 56 s; the search pinned there stays above."""
    bound, plan_s = pair_bound_and_pinned_plan_s("topologies/hetero/home-consumer-gpus.yaml", 5, 2, seed=5)
    assert bound > 56.0
    assert plan_s >= bound
