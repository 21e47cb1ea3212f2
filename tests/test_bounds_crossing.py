"""The lower bound's crossing arguments: traffic that crosses between clusters goes both ways
(``planner.search.link_clusters.fastest_both_ways_between``, ``slower_way_between``), a plan whose
some-but-not-all stages and replicas cross needs a cluster of ``S + D - 1`` cells, and stages compute
then sync (``planner.search.stage_split``): hand-computed cases on the shipped home topologies, where
each binds, and the link values against the dense matrices."""

import math
from pathlib import Path

import numpy as np
import pytest

from planner.inputs.job import load_job
from tests.test_bounds_clusters import _clustered_topology

_TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


def _job(name: str):
    return load_job(_TOPOLOGIES / f"{name}.yaml")


def test_both_ways_values_bound_the_dense_matrices():
    """At every threshold: no pair of devices in different clusters passes more than
    ``fastest_both_ways_between`` both ways (the least of its two directions, NIC caps included),
    and by levels it equals the dense matrices' largest such least wherever the topology has no pair
    entry; between exactly two clusters, ``slower_way_between`` is at least the slower of the two
    directions' fastest links, equal to it likewise."""
    from planner.search.link_clusters import (clusters_at, fastest_both_ways_between, link_thresholds,
                                              slower_way_between)

    rng = np.random.default_rng(21)
    split = two = 0
    for _ in range(80):
        network = _clustered_topology(rng).network
        dense = np.array(network.bandwidth_bytes_per_s, dtype=float)
        plain = not network.bandwidth_bytes_per_s.overrides
        for tau in link_thresholds(network):
            labels = clusters_at(network, tau)
            apart = labels[:, None] != labels[None, :]
            if not apart.any():
                continue
            split += 1
            truth = np.minimum(dense, dense.T)[apart].max()
            value = fastest_both_ways_between(network, labels)
            assert value >= truth * (1 - 1e-12)
            assert value == pytest.approx(truth) or not plain
            if labels.max() == 1:
                two += 1
                zero, one = labels == 0, labels == 1
                slower = min(dense[np.ix_(zero, one)].max(), dense[np.ix_(one, zero)].max())
                value = slower_way_between(network, labels)
                assert value >= slower * (1 - 1e-12)
                assert value == pytest.approx(slower) or not plain
            else:
                assert slower_way_between(network, labels) == np.inf
    assert split >= 30 and two >= 10


def test_home_mini_four_stages_in_one_replica_cross_the_slow_lines():
    """home-mini: four stages do not fit in one city's three homes, so the one replica's 128
    sequences cross between the cities both ways: at least ``128 * 8 MiB / 15 MB/s`` = 71.58 s, and
    the last message's 15 ms latency after it (``planner.search.crossing_link``; one replica: no sync
    after it) (the search's 4 x 1 plan simulates 76.75 s). Six stages use every home, the one on a 100 Mbit/s
    uplink too, which sends each sequence's message one way at least: ``128 * 8 MiB / 12.5 MB/s`` =
    85.90 s (``planner.search.slow_uplinks``; the search's 6 x 1 plan simulates 95.0 s)."""
    from planner.search.bounds import _pair_bounds_s

    job = _job("emulated/home-mini")
    pairs = _pair_bounds_s(job.topology, job.model, job.training)
    expected = 128 * 2048 * 2048 * 2 / (120e6 / 8) + 0.015
    for stages in (4, 5):
        assert pairs[stages][0] == pytest.approx(expected, rel=1e-9)
    assert pairs[6][0] == pytest.approx(128 * 2048 * 2048 * 2 / (100e6 / 8), rel=1e-6)  # stage_chains: from below


def test_stage_split_is_the_work_plus_an_average_stage_sync(monkeypatch):
    """home-consumer-gpus, 2 stages x 6 replicas on all twelve homes: the blocks' work over the
    twelve devices' speed plus half of every block's ring all-reduce over a 500 Mbit/s hop
    (``2 (D - 1) / D`` of its bf16 gradients), 42.28 s, and, since every stage group of six crosses
    between homes (``cluster_bound``'s case (ii)), the ring's ``2 (D - 1)`` steps of the 8 ms between
    them: 42.36 s, above every other term (39.82 s before the stage split) but the stages' chains (``planner.search.stage_chains``, 75.61 s with the slow uplink's stage) and
    the crossing replicas' activations before a sync (``planner.search.crossing_pipe``), both left out."""
    import planner.search.bounds as bounds

    monkeypatch.setattr(bounds, "stage_chains_s", lambda **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "clustered_stage_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "pattern_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "uplink_chains_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    # every replica of 2 stages crosses the homes' lines (``crossing_pipe``: 43.70 s here; left out)
    monkeypatch.setattr(bounds, "crossing_pipe_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    from planner.prediction.stage_model import layer_costs
    from planner.search.bounds import _least_block_slowdown, _pair_bounds_s

    job = _job("hetero/home-consumer-gpus")
    topology, model, training = job.topology, job.model, job.training
    costs = layer_costs(model, training, 1, 1)
    block_flops = training.global_batch * model.layers * costs.layer_flops * _least_block_slowdown(topology, training)
    speed = float(topology.effective_flops(training.precision).sum())
    sync_s = model.layers * costs.layer_params * 2 * (2 * 5 / 6) / (500e6 / 8)
    expected = block_flops / speed + sync_s / 2 + 2 * (6 - 1) * 0.008
    assert _pair_bounds_s(topology, model, training)[2][5] == pytest.approx(expected, rel=1e-9)


def test_split_stages_takes_the_fewest_crossing_stages_room_allows():
    """``_split_stages_s``: with ``c`` of ``S`` stages crossing (``X = A``) and the rest inside
    (``X = K + Y``), ``1 / (c / A + (S - c) / (K + Y))``, the least over the ``c`` room allows:
    twelve cells (3 x 4) in clusters of at most six leave six cells to at most three crossing
    replicas, so two crossing stages of three; in a cluster of eleven, one crossing stage may do,
    and where crossing is the cheaper (``A < K + Y``), every stage but one crosses; where no cluster
    holds ``S + D - 1`` cells, the case cannot happen."""
    from planner.search.cluster_bound import _split_stages_s

    A, inside = 300.0, 60.0
    four = _split_stages_s(3, np.array([4]), np.array([12]), 6, np.array([A]), np.array([inside]))
    assert four[0] == pytest.approx(1.0 / (2 / A + 1 / inside))
    roomy = _split_stages_s(3, np.array([4]), np.array([12]), 11, np.array([A]), np.array([inside]))
    assert roomy[0] == pytest.approx(1.0 / (1 / A + 2 / inside))
    # a crossing stage cheaper than an inside one: the plan would cross every stage it may
    cheap = _split_stages_s(3, np.array([4]), np.array([12]), 11, np.array([30.0]), np.array([inside]))
    assert cheap[0] == pytest.approx(1.0 / (2 / 30.0 + 1 / inside))
    # 3 x 2 in clusters of three: a stage and a replica inside need 3 + 2 - 1 = 4 cells in one
    no_room = _split_stages_s(3, np.array([2]), np.array([6]), 3, np.array([A]), np.array([inside]))
    assert no_room[0] == np.inf


@pytest.mark.parametrize("stages, replicas", [(2, 2), (3, 2), (2, 3), (4, 1)])
def test_home_mini_searched_plans_stay_above_their_pair_bounds(stages, replicas):
    """The search pinned to each degree pair the crossing arguments tightened on home-mini: its
    plan's simulated time is at least the bound on plans of those degrees."""
    from planner.search.bounds import _pair_bounds_s
    from planner.search.front import SearchOptions, search

    job = _job("emulated/home-mini")
    result = search(job.topology, job.model, job.training,
                    SearchOptions(seed=0, budget_s=1.0, time_limit_s=60.0, stages=stages, replicas=replicas))
    bound = _pair_bounds_s(job.topology, job.model, job.training)[stages][replicas - 1]
    assert bound <= result.objective_s


def test_home_consumer_four_by_three_splits_stages_over_the_slower_line(monkeypatch):
    """home-consumer-gpus, 4 x 3 on all twelve homes: where some but not all stages and replicas
    cross, one city's six homes hold every cell but six, which sit in crossing stages and replicas
    (two crossing replicas at most), so three stages of four cross. Each stage of a share ``f`` of the
    blocks takes ``f X``: ``X = K + Y / 15 MB/s`` crossing (the ring across the two cities goes both
    ways, so over the 120 Mbit/s Paris -> Berlin line), ``K + Y / 62.5 MB/s`` inside, with ``K`` the
    busiest replica's 86 sequences through every block on one RTX 4090 and ``Y`` every block's bf16
    gradients times ``2 (D - 1) / D``: ``1 / (3 / A + 1 / X_in)`` = 40.81 s with shares of a block,
    and in whole blocks (12 on the crossing stages, 4 each, and 12 inside) ``max(4 A, 12 X_in) / 24``
    = 40.82 s (32.13 s with the crossing ring priced at the faster direction's 200 Mbit/s), the slow
    uplink's term left out (``planner.search.slow_uplinks``: 52.70 s with it). And the inside replicas
    carry what the crossing ones cannot (``cluster_bound._loaded_split_s``): in ``T`` = 41.68 s a
    crossing replica passes at most ``floor(T 256 / P)`` = 74 sequences across (``P`` = 143.17 s,
    the batch's 8 MiB activations a sequence at 15 MB/s), so the two inside replicas hold 182 at
    least, the busiest 91, not 86: with ``K`` for 91 sequences the same split gives 41.68 s, which
    binds (the bisection stops within 1e-3 below it)."""
    import planner.search.bounds as bounds

    monkeypatch.setattr(bounds, "uplink_chains_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    # every replica of 2 stages crosses the homes' lines (``crossing_pipe``: 43.70 s here; left out)
    monkeypatch.setattr(bounds, "crossing_pipe_s", lambda *a, **k: np.zeros(np.shape(k["replicas"])))
    from planner.prediction.stage_model import layer_costs
    from planner.search.bounds import _least_block_slowdown, _pair_bounds_s

    job = _job("hetero/home-consumer-gpus")
    topology, model, training = job.topology, job.model, job.training
    costs = layer_costs(model, training, 1, 1)
    sequence_s = model.layers * costs.layer_flops * _least_block_slowdown(topology, training) / float(
        topology.effective_flops(training.precision).max())
    sync_bytes = model.layers * costs.layer_params * 2 * (4 / 3)

    def split_s(sequences):  # whole blocks, the busiest replica holding that many sequences
        crossing, inside = (sequences * sequence_s + sync_bytes / (120e6 / 8),
                            sequences * sequence_s + sync_bytes / (500e6 / 8))
        return crossing, inside, max(4 * crossing, 12 * inside) / 24
    crossing, inside, evenly = split_s(86)
    assert 1.0 / (3 / crossing + 1 / inside) == pytest.approx(40.81, abs=0.01)
    assert evenly == pytest.approx(40.82, abs=0.01)
    batch_s = 256 * 2048 * 2048 * 2 / (120e6 / 8)
    assert batch_s == pytest.approx(143.17, abs=0.01)
    expected = split_s(91)[2]
    assert expected == pytest.approx(41.68, abs=0.01)
    assert math.floor(expected * 256 / batch_s) == 74 and math.ceil((256 - 74) / 2) == 91
    assert math.floor(split_s(90)[2] * 256 / batch_s) == 74  # so 90 sequences are too few
    bound = _pair_bounds_s(topology, model, training)[4][2]
    assert expected * (1 - 1e-3) <= bound <= expected


def test_crossing_extra_counts_the_fewest_crossings_both_ways():
    """``crossing_extra_s``: eight stages in clusters of at most two cross at least three
    boundaries, each trip sending a sequence's 16 bytes over each forward and back (at 4 bytes/s the
    slower way, 8 the other) and paying two latencies there, less what the fast links already
    counted; stages that fit in one cluster cross none, unless the replica is known to cross."""
    from planner.search.round_trip import crossing_extra_s

    link = dict(tau_bytes_per_s=8.0, both_ways_bytes_per_s=4.0, between_latency_s=0.1, sequence_bytes=16.0,
                boundary_s=0.5, latency_s=0.01)
    crossings, per_sequence, per_trip = crossing_extra_s(stages=8, largest=2, **link)
    assert crossings == 3
    assert per_sequence == pytest.approx(16 / 4 + 16 / 8 - 2 * 0.5)
    assert per_trip == pytest.approx(2 * (0.1 - 0.01))
    assert crossing_extra_s(stages=2, largest=2, **link) == (0, 0.0, 0.0)
    assert crossing_extra_s(stages=2, largest=2, fewest=1, **link)[0] == 1


def test_dtfm_mini_eight_stages_cross_three_region_links_each_trip(monkeypatch):
    """dtfm-case5-mini, 8 x 1: two V100s a region, so the replica's eight stages cross between
    regions three times at least; each of its 4 trips of 4 micro-batches (the chain of ``32 / 8``
    trips carries 16 sequences) sends each sequence's 8 MiB activation and gradient across at 1.02
    Gbit/s at best, where the fast links priced them at 2 Gbit/s, and its three crossings join the
    four regions, so they are three distinct region pairs: 67 + 90 + 96 ms at least (Oregon-Virginia,
    Virginia-Frankfurt, Oregon-Tokyo; ``pure_groups.crossings_latency_s``) where the least latency
    is 5 ms (20.17 s with 67 ms a crossing): 20.59 s, above the plan's bound without the crossings
    (15.59 s; the search's 8 x 1 plan simulates 28.98 s). The stages' chains
    (``planner.search.stage_chains``), which count no crossing, are left out."""
    import planner.search.bounds as bounds
    from planner.search.bounds import _pair_bounds_s

    monkeypatch.setattr(bounds, "stage_chains_s", lambda **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "clustered_stage_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))
    monkeypatch.setattr(bounds, "pattern_chains_s", lambda *a, **k: np.zeros(np.shape(k["busiest"])))

    job = _job("emulated/dtfm-case5-mini")
    topology, model, training = job.topology, job.model, job.training
    without = _pair_bounds_s(topology, model, training, clusters=False)[8][0]
    message = 2048 * 2048 * 2
    extra = 16 * 3 * (2 * message / (1.02e9 / 8) - 2 * message / (2e9 / 8)) + 4 * 2 * (0.067 + 0.090 + 0.096
                                                                                      - 3 * 0.005)
    assert _pair_bounds_s(topology, model, training)[8][0] == pytest.approx(without + extra, rel=1e-9)


def test_a_crossing_replica_pays_its_crossing_in_the_round_trips():
    """home-mini, 3 x 2 on all six homes: no city holds 3 + 2 - 1 = 4 cells, so either every stage
    crosses (syncing over the slow lines) or every replica does (the case that bound the pair at
    35.79 s: 64 sequences' activations and gradients over 120 Mbit/s one way). Then the busiest
    replica crosses in each of its round trips too: under 1F1B, 6 trips of 4 sequences (16
    micro-batches of 4, 3 apart), each sequence its compute ``c`` on an RTX 4090, two messages of
    8 MiB at 500 Mbit/s and the crossing's at 120 and 200 Mbit/s, each trip four 8 ms latencies
    and two 15 ms ones; GPipe's round sends all 64 sequences across and back (57 s). The pair's
    bound is at least that (and below the search's 78.01 s plan), and home-mini's least pair bound
    is 40.19 s (39.15 s before every stage's chain, ``planner.search.stage_chains``; the plan found
    at budget 5 takes 44.41 s)."""
    from planner.search.bounds import _pair_bounds_s, work_bound_s

    job = _job("emulated/home-mini")
    topology, model, training = job.topology, job.model, job.training
    pairs = _pair_bounds_s(topology, model, training)
    message = 2048 * 2048 * 2
    fastest = float(topology.effective_flops(training.precision).max())
    c = work_bound_s(topology, model, training) * float(topology.effective_flops(training.precision).sum()) / (
        fastest * training.global_batch)
    trip = c + 2 * message / (500e6 / 8) + message / (120e6 / 8) + message / (200e6 / 8)
    by_hand = 24 * trip + 6 * (4 * 0.008 + 2 * 0.015)
    assert by_hand <= pairs[3][1] <= 78.01
    assert pairs[3][1] > 40.0  # 35.79 without the crossing in the trips
    assert min(float(values.min()) for values in pairs.values()) == pytest.approx(40.19, abs=0.01)
