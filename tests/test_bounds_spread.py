"""The lower bound's GPipe idle term (``planner.search.gpipe_idle``) and the spread of the stage groups
over clusters (``planner.search.pure_groups``): each by hand, both against random plans on clustered
topologies, and the generated 1,024-device topology's bound raised above its work bound (where the
pure groups' crossings and the crossing groups' syncs both cost)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from planner.search.gpipe_idle import gpipe_idle_s
from planner.search.pure_groups import cluster_totals, spread_floors_s
from planner.search.slow_crossings import group_counts
from tests.test_bounds_clusters import assert_random_plans_above_their_pair_bounds


def test_gpipe_idle_by_hand():
    """3 stages: the work's 2 s plus 2 boundaries crossed each way by one sequence (0.1 s message,
    0.05 s latency): 2 + 4 x 0.15 = 2.6 s; micro-batches of 2 sequences send 0.2 s messages: 3.0 s;
    a clustering's crossing adds its (k, per sequence, per trip): 1 x (2 x 0.3 + 0.4) = 1.0 s more."""
    assert np.isclose(gpipe_idle_s(stages=3, cells_work_s=np.array([2.0]), boundary_s=0.1, latency_s=0.05), 2.6)
    assert np.isclose(gpipe_idle_s(stages=3, cells_work_s=np.array([2.0]), boundary_s=0.1, latency_s=0.05,
                                   micro_batch=2), 3.0)
    assert np.isclose(gpipe_idle_s(stages=3, cells_work_s=np.array([2.0]), boundary_s=0.1, latency_s=0.05,
                                   micro_batch=2, crossings=((1, 0.3, 0.4), (0, 0.0, 0.0))), 4.0)


def _level(sizes, speed_per_device=1.0):
    """A clustering of clusters of ``sizes`` devices of one speed (a ``cluster_bound.ClusterLevel``'s
    fields that ``pure_groups`` reads), links between them of 1 byte/s and no latency."""
    sizes = np.asarray(sizes)
    width = int(sizes.max())
    speed = np.minimum(np.arange(1, width + 1)[None, :], sizes[:, None]) * speed_per_device
    return SimpleNamespace(speed=speed, cluster_sizes=sizes, tau_bytes_per_s=1.0, latency_s=0.0)


def test_spread_floors_by_hand():
    """4 clusters of 4 devices of 1 FLOP/s, 2 stages of 4 replicas (a cluster holds one pure group),
    16 FLOPs of work, a crossing group's sync 1 s, round trips free: every group pure fills 2
    clusters, 8 FLOP/s: 2 s; one crossing group beside a pure one: 4 + 4 FLOP/s, min(16 / 4,
    (16 + 4 x 1) / 8) = 2.5 s; both crossing: 8 FLOP/s and the sync after: 3 s."""
    level = _level([4, 4, 4, 4])
    assert np.array_equal(cluster_totals(level), [4.0, 4.0, 4.0, 4.0])
    counts = group_counts(level.cluster_sizes, 4, 2)
    pure, crossing = spread_floors_s(
        level, counts, stages=2, replicas=np.arange(1, 5), work_flops=16.0, cells_flops=np.array([2.0, 4, 6, 8]),
        most_cells_flops=lambda cells: np.asarray(cells, dtype=float), round_trips=_free_trips, boundary_s=0.0,
        latency_s=0.0, sequence_bytes=0.0, block_sync_bytes=1.0, ring_only=False, sharded=False, sync_every=1)
    assert np.isclose(pure[3], 2.0) and np.isclose(crossing[3], 2.5)
    # one replica: every group pure in one cluster, 2 FLOP/s (the cells'); no group of one cell crosses
    assert np.isclose(pure[0], 8.0) and crossing[0] == math.inf


def test_spread_floors_merged_clusters_count_each():
    """Past ``MAX_CLUSTERS`` a level keeps one row for the merged clusters (their largest): each of
    them counts at that speed, so ``C_g`` never falls below the true ``g`` fastest."""
    level = SimpleNamespace(speed=np.array([[5.0, 9.0], [3.0, 3.0]]), cluster_sizes=np.array([2, 1, 1, 1]),
                            tau_bytes_per_s=1.0, latency_s=0.0)
    assert np.array_equal(cluster_totals(level), [9.0, 3.0, 3.0, 3.0])


def _free_trips(b, lam, phases_b, phases_lam, deepest_s, cells_work_s):
    return np.zeros(np.shape(cells_work_s))


@pytest.mark.slow
def test_random_plans_stay_above_their_pair_bounds():
    """GPipe and 1F1B plans of random degrees, splits and syncs on random clustered topologies
    (``test_bounds_clusters``): none simulated below its pair's bound, these terms included."""
    assert_random_plans_above_their_pair_bounds(71, 90)


def test_generated_thousand_devices_bound_above_its_work_bound():
    """GPT-3 6.7B on the generated 1,024 devices (8 regions joined at 1-10 Gbit/s, 20-150 ms): the
    pairs whose cells reach every device must either spread their pure groups over the regions
    (every replica crosses them) or sync a crossing group over a slow link, so the bound rises 13%
    above the work bound (1.33 s; the plan the search finds takes 4.26 s)."""
    from benchmarks.scale import generated_topology
    from planner.inputs.model import model_preset, parse_training
    from planner.inputs.topology import parse_topology
    from planner.search.bounds import lower_bound_s, work_bound_s

    topology = parse_topology(generated_topology(1024), name="generated-1024")
    model = model_preset("gpt3-6.7b")
    training = parse_training({"global_batch": 2048, "micro_batch_size": 1, "precision": "fp16",
                               "recompute": True, "flash_attention": True})
    bound, work = lower_bound_s(topology, model, training), work_bound_s(topology, model, training)
    assert 1.12 * work < bound < 4.2


def test_thresholds_keep_the_fastest_link_between_hosts():
    """The generated topology's 30 link values are thinned to a few thresholds; the fastest link
    between two hosts (100 Gbit/s inside a region) stays among them, so the clustering of one host a
    cluster is priced at it (not at NVLink's 2,400 Gbit/s, the next value up): a stage group of more
    than 8 cells syncs at 100 Gbit/s at most."""
    from benchmarks.scale import generated_topology
    from planner.inputs.topology import parse_topology
    from planner.search.link_clusters import link_thresholds

    thresholds = link_thresholds(parse_topology(generated_topology(1024), name="generated-1024").network)
    assert np.isclose(thresholds, 100e9 / 8).any() and thresholds.size <= 10
