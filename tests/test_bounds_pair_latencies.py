"""The stage groups' spread (``planner.search.pure_groups``) prices a replica's crossings between the
``g`` clusters its pure groups sit in at the ``g - 1`` least pair latencies
(``link_clusters.pair_latencies_between``, ``pure_groups.crossings_latency_s``), not ``g - 1`` times
the least: each by hand, and simulated plans on the generated 1,024 devices never below the bound."""

from types import SimpleNamespace

import numpy as np
import pytest

from planner.inputs.topology import parse_topology
from planner.search.link_clusters import pair_latencies_between
from planner.search.pure_groups import crossings_latency_s, spread_floors_s
from planner.search.slow_crossings import group_counts

LATENCY_MS = {("a", "b"): 10, ("a", "c"): 20, ("a", "d"): 90, ("b", "c"): 60, ("b", "d"): 40, ("c", "d"): 120}


def _four_regions():
    """4 regions of 2 devices (each its own host), 1 ms inside a region, LATENCY_MS between them."""
    devices = [{"name": r, "count": 2, "type": "A100-80GB", "region": r} for r in "abcd"]
    pairs = [{"regions": list(k), "latency": f"{v}ms", "bandwidth": "1Gbps"} for k, v in LATENCY_MS.items()]
    return parse_topology({"devices": devices, "network": {"region": {"latency": "1ms", "bandwidth": "100Gbps"},
                                                            "region_pairs": pairs}}, name="four")


def test_pair_latencies_by_levels_by_hand():
    network = _four_regions().network
    by_region = np.repeat(np.arange(4), 2)
    assert pair_latencies_between(network, by_region) == pytest.approx([0.01, 0.02, 0.04, 0.06, 0.09, 0.12])
    # every device its own cluster: the 4 pairs inside a region at 1 ms, then each region pair 4 times
    alone = pair_latencies_between(network, np.arange(8))
    assert alone == pytest.approx([0.001] * 4 + [v / 1e3 for v in sorted(LATENCY_MS.values()) for _ in range(4)])


def test_pair_latencies_dense_take_the_least_either_way():
    latency = np.array([[0.0, 0.5, 0.3, 0.9],
                        [0.4, 0.0, 0.2, 0.8],
                        [0.7, 0.6, 0.0, 0.05],
                        [0.9, 0.1, 0.3, 0.0]])
    # clusters {0, 1}, {2}, {3}: {0,1}-{2}: least of 0.3, 0.2, 0.7, 0.6 = 0.2; {0,1}-{3}: of 0.9, 0.8, 0.9,
    # 0.1 = 0.1; {2}-{3}: of 0.05, 0.3 = 0.05
    assert pair_latencies_between(SimpleNamespace(latency_s=latency), np.array([0, 0, 1, 2])) == pytest.approx(
        [0.05, 0.1, 0.2])
    assert pair_latencies_between(SimpleNamespace(latency_s=latency), np.zeros(4, dtype=int)).size == 0


def test_crossings_latency_by_hand():
    """Pairs at 20, 30 and 50 ms, the clusters' least 20 ms, 1 ms the least anywhere: 0, 1, 2, 3
    crossings add 0, 19, 19 + 29, 19 + 29 + 49 ms; a fourth (past the pairs looked up) 19 ms more."""
    level = SimpleNamespace(latency_s=0.02, pair_latencies_s=np.array([0.02, 0.03, 0.05]))
    assert crossings_latency_s(level, np.arange(5), 0.001) == pytest.approx([0.0, 0.019, 0.048, 0.097, 0.116])
    unknown = SimpleNamespace(latency_s=0.02, pair_latencies_s=np.zeros(0))  # every crossing at the least
    assert crossings_latency_s(unknown, np.arange(4), 0.001) == pytest.approx([0.0, 0.019, 0.038, 0.057])


def test_spread_prices_the_pure_groups_crossings_at_the_least_distinct_pairs():
    """4 clusters of 4 devices, 4 stages of 4 replicas, every group pure: the groups fill the 4
    clusters and every replica crosses 3 distinct pairs at least, 10 + 20 + 40 ms of LATENCY_MS's
    (not 3 x 10 ms): the 3 hops' average latency handed to the round trips is 1 ms + 67 ms / 3."""
    sizes = np.array([4, 4, 4, 4])
    speed = np.minimum(np.arange(1, 5)[None, :], sizes[:, None]).astype(float)
    level = SimpleNamespace(speed=speed, cluster_sizes=sizes, tau_bytes_per_s=1.0, latency_s=0.01,
                            pair_latencies_s=np.array(sorted(LATENCY_MS.values())) / 1e3)
    seen = {}

    def trips(b, lam, phases_b, phases_lam, deepest_s, cells_work_s):
        seen["lam"] = np.broadcast_to(lam, np.shape(cells_work_s))
        return np.zeros(np.shape(cells_work_s))

    spread_floors_s(level, group_counts(sizes, 4, 4), stages=4, replicas=np.arange(1, 5), work_flops=16.0,
                    cells_flops=np.array([4.0, 8, 12, 16]), most_cells_flops=lambda c: np.asarray(c, dtype=float),
                    round_trips=trips, boundary_s=0.0, latency_s=0.001, sequence_bytes=0.0, block_sync_bytes=1.0,
                    ring_only=True, sharded=False, sync_every=1)
    # rows (x, g, D): x = 0 (every group pure), g = 4 clusters, D = 4 replicas
    assert seen["lam"][0, 4, 3] == pytest.approx(0.001 + (0.01 + 0.02 + 0.04 - 3 * 0.001) / 3)
    assert seen["lam"][0, 2, 3] == pytest.approx(0.001 + (0.01 - 0.001) / 3)  # 2 clusters: one crossing


@pytest.mark.slow
def test_generated_thousand_devices_stage_per_region_plans_stay_above_their_pair_bounds():
    """GPT-3 6.7B on the generated 1,024 devices: plans with each stage in a region of its own
    (``construct._stage_regions``, and its stages in a random order), GPipe and 1F1B, simulated never
    below their pair's bound; the bound rises from 1.509 s (every crossing at the least latency
    between regions, 23.7 ms) to above 1.7 s."""
    from benchmarks.scale import generated_topology
    from cost_models.schedule import Schedule
    from planner.inputs.model import model_preset, parse_training
    from planner.prediction.predict import predict
    from planner.search.bounds import _pair_bounds_s, lower_bound_s
    from planner.search.construct import _stage_regions
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    topology = parse_topology(generated_topology(1024), name="generated-1024")
    model = model_preset("gpt3-6.7b")
    training = parse_training({"global_batch": 2048, "micro_batch_size": 1, "precision": "fp16",
                               "recompute": True, "flash_attention": True})
    pairs = _pair_bounds_s(topology, model, training)
    ctx = make_context(topology, model, training)
    rng = np.random.default_rng(0)
    checked = 0
    for stages, replicas, schedule in ((6, 114, Schedule.GPIPE), (8, 114, Schedule.GPIPE),
                                       (8, 64, Schedule.ONE_F_ONE_B)):
        layout = _stage_regions(ctx.topology, ctx.speed, ctx.capacity, stages, replicas)
        for assign in (layout, layout[:, rng.permutation(stages)]):
            candidate = evaluate_placement(ctx, assign, 1, schedule)
            prediction = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0]
            assert prediction.fits
            assert pairs[stages][replicas - 1] <= prediction.iteration_s
            checked += 1
    assert checked == 6
    assert 1.7 < lower_bound_s(topology, model, training) < 4.13  # 4.13 s: the best layout simulated
