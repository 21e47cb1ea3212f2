"""A crossing replica's messages over the slower way then a stage's sync
(``planner.search.crossing_link``), and the crossing stages' whole blocks
(``planner.search.cluster_bound._split_stages_s`` with ``layers``): hand-computed cases, the
home-consumer-gpus pairs they raise, and plans there that stay above them."""

from pathlib import Path

import numpy as np
import pytest

from planner.inputs.job import load_job
from planner.search.cluster_bound import _split_stages_s, _whole_blocks_s
from planner.search.crossing_link import crossing_link_s
from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds, pair_bound_and_pinned_plan_s

_HOME = Path(__file__).resolve().parent.parent / "topologies" / "hetero" / "home-consumer-gpus.yaml"


def test_hand_computed_crossing_link():
    """4 sequences of 2 bytes over a 4 byte/s way: 2 s, then 0.5 s of latency and a 1 s sync:
    3.5 s; 10 sequences with a 3 s sync: 5 + 0.5 + 3 = 8.5 s; a replica of no sequence sends
    nothing: 0."""
    seconds = crossing_link_s(np.array([4, 10, 0]), 2.0, 4.0, 0.5, np.array([1.0, 3.0, 1.0]))
    assert seconds.tolist() == [pytest.approx(3.5), pytest.approx(8.5), 0.0]


def test_whole_blocks_split_hand_computed():
    """Four blocks over three stages, two crossing (``X = A = 300 s``), one inside (``X = 60 s``):
    the crossing stages hold 2 or 3 blocks, the other 2 or 1: ``max(1 * 300, 2 * 60) / 4`` = 75 s or
    ``max(2 * 300, 60) / 4`` = 150 s, so 75 s, where shares of a block gave
    ``1 / (2 / 300 + 1 / 60)`` = 42.86 s; with 24 blocks, 6 on the crossing stages
    (``max(3 * 300, 18 * 60) / 24`` = 45 s), 5 (47.5 s) or 7 (50 s): 45 s."""
    A, inside = np.array([300.0]), np.array([60.0])
    assert _whole_blocks_s(4, 3, np.array([2.0]), A, inside)[0] == pytest.approx(75.0)
    # 3 x 4 in clusters of six: two crossing stages at least (``_split_stages_s``), S - 1 = 2 at most
    assert _split_stages_s(3, np.array([4]), np.array([12]), 6, A, inside, layers=4)[0] == pytest.approx(75.0)
    assert _split_stages_s(3, np.array([4]), np.array([12]), 6, A, inside)[0] == pytest.approx(1 / (2 / 300 + 1 / 60))
    assert _whole_blocks_s(24, 3, np.array([2.0]), A, inside)[0] == pytest.approx(45.0)
    # one crossing stage of two, a crossing count outside 1 .. S - 1: inf
    assert _whole_blocks_s(4, 2, np.array([1.0, 2.0]), np.array([300.0, 300.0]),
                           np.array([60.0, 60.0])).tolist() == [pytest.approx(max(300, 3 * 60) / 4), np.inf]


def test_whole_blocks_split_agrees_with_every_split():
    """The bisection over the largest crossing stage's blocks against every split of up to 10 blocks
    over up to 5 stages, the first ``c`` crossing: the same least (inf where ``c`` is 0 or ``S``)."""
    import itertools

    rng = np.random.default_rng(5)
    for _ in range(300):
        layers = int(rng.integers(2, 11))
        stages = int(rng.integers(2, min(layers, 5) + 1))
        crossing = int(rng.integers(0, stages + 1))
        a, b = rng.uniform(1.0, 100.0, 2)
        least = np.inf
        if 1 <= crossing < stages:
            for split in itertools.product(range(1, layers + 1), repeat=stages):
                if sum(split) == layers:
                    least = min(least, max(max(split[:crossing]) * a, max(split[crossing:]) * b) / layers)
        got = _whole_blocks_s(layers, stages, np.array([float(crossing)]), np.array([a]), np.array([b]))[0]
        assert got == pytest.approx(least, rel=1e-12) if np.isfinite(least) else got == np.inf


def test_home_consumer_least_pairs_are_raised():
    """home-consumer-gpus: 3 x 3 (48.98 s before): a plan spans the cities; where no stage group spans
    them every replica crosses, the busiest's 86 sequences' 8 MiB messages over the 120 Mbit/s way
    (48.1 s), then a block's sync over a 500 Mbit/s ring (2.15 s); where two groups span them (the
    room the others leave), whole blocks split 5 + 4 + 15 at best: 50.68 s. 4 x 3 (47.95 s before):
    every group pure, each replica crosses, the slow uplink's replica's share decides the busiest:
    52.70 s. Every pair at 49.66 s or more: the 66.21 s plan's gap 25% at most."""
    from planner.search import bounds

    job = load_job(_HOME)
    pairs = bounds._pair_bounds_s(job.topology, job.model, job.training)
    assert pairs[3][2] == pytest.approx(50.68, abs=0.01)
    assert pairs[4][2] == pytest.approx(52.70, abs=0.01)
    assert min(float(v.min()) for v in pairs.values()) >= 49.66
    assert bounds.lower_bound_s(job.topology, job.model, job.training) >= 49.66


@pytest.mark.parametrize("stages, replicas, seed", [(3, 3, 1), (4, 3, 2), (2, 5, 3)])
@pytest.mark.slow
def test_home_consumer_pinned_plans_stay_above_their_pair_bounds(stages, replicas, seed):
    """The search pinned to the pairs this raised finds plans above their bounds."""
    bound, plan_s = pair_bound_and_pinned_plan_s(_HOME, stages, replicas, seed=seed)
    assert plan_s >= bound


def test_home_consumer_city_groups_stay_above_their_pair_bounds():
    """Plans of 3 x 3, 4 x 3 and 2 x 4 whose stage groups each sit in one city (every replica crosses),
    uneven layer and batch splits, 1F1B and GPipe: none simulates below its pair's bound."""
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search import bounds

    job = load_job(_HOME)
    topology, model, training = job.topology, job.model, job.training
    pairs = bounds._pair_bounds_s(topology, model, training)
    cities = {c: [n for n in topology.names if n.startswith(c)] for c in ("berlin", "paris")}
    rng = np.random.default_rng(11)
    checked = 0
    for stages, replicas in ((3, 3), (4, 3), (2, 4)) * 4:
        free = {c: list(rng.permutation(names)) for c, names in cities.items()}
        groups = []
        for s in range(stages):
            roomy = [c for c in free if len(free[c]) >= replicas]
            city = roomy[int(rng.integers(len(roomy)))] if s else "berlin"
            groups.append([free[city].pop() for _ in range(replicas)])
        if len({g[0][:5] for g in groups}) < 2:
            continue  # every group in one city: not a crossing plan
        assignment = tuple(tuple(str(groups[s][r]) for s in range(stages)) for r in range(replicas))
        cuts = np.sort(rng.choice(np.arange(1, model.layers), stages - 1, replace=False))
        shares = rng.multinomial(training.global_batch - replicas, np.ones(replicas) / replicas) + 1
        plan = Plan(layer_bounds=(0, *map(int, cuts), model.layers), assignment=assignment,
                    micro_batches=tuple(int(b) for b in shares), micro_batch_size=1,
                    schedule="gpipe" if rng.random() < 0.3 else "1f1b")
        prediction, _ = predict(plan, topology, model, training)
        if not prediction.fits:
            continue
        assert prediction.iteration_s >= pairs[stages][replicas - 1], (stages, replicas, prediction.iteration_s)
        checked += 1
    assert checked >= 8


@pytest.mark.slow
def test_stays_below_random_plans():
    """Random plans on random clustered topologies (``tests.test_bounds_clusters._checked_plans``)
    never simulate below their pair's bound with the crossing link and whole blocks counted."""
    assert_random_plans_above_their_pair_bounds(71, 90)
