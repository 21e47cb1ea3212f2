"""Clusters of the bandwidth graph, the layouts built on them, and the structural local moves."""

from pathlib import Path

import numpy as np
import pytest

from planner.inputs.job import load_job
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.search.brute import brute_force_placement
from planner.search.construct import cluster_layouts
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.local import iterated_local_search
from planner.search.locality import bandwidth_clusters, best_ring, chained_ring
from planner.search.moves import STRUCTURAL_MOVES, Neighbourhood, structural_move

ROOT = Path(__file__).resolve().parent.parent


def test_clusters_put_a_home_behind_a_slow_uplink_alone():
    """Home swarm: berlin-4090-0 sends at 100 Mbit/s; the finest level is that home, the other
    Berlin homes, and Paris (500 Mbit/s inside a city, 120-200 Mbit/s between them)."""
    topology = load_job(ROOT / "topologies" / "hetero" / "home-consumer-gpus.yaml").topology
    finest = bandwidth_clusters(topology)[0]
    names = topology.names
    slow = finest[names.index("berlin-4090-0")]
    assert (finest == slow).sum() == 1
    berlin = {finest[i] for i, name in enumerate(names) if name.startswith("berlin") and name != "berlin-4090-0"}
    paris = {finest[i] for i, name in enumerate(names) if name.startswith("paris")}
    assert len(berlin) == 1 and len(paris) == 1 and berlin != paris


def test_cluster_layouts_keep_pipelines_in_regions_and_leave_the_far_ones_idle():
    """Case 5 (8 regions of 8 V100s) at 4 x 12: every pipeline inside one region, six regions used;
    the two left idle are the Asian ones, whose links to the rest are the slowest."""
    topology = load_job(ROOT / "topologies" / "dtfm" / "case5-worldwide.yaml").topology
    speed = topology.effective_flops("fp16")
    layouts = cluster_layouts(topology, speed, topology.memory_bytes(), 4, 12, bandwidth_clusters(topology)[:1])
    rows = layouts["clusters0-pipelines"]
    regions = topology.region_ids[rows]
    assert rows.shape == (12, 4) and len(np.unique(rows)) == 48
    assert all(len(set(r.tolist())) == 1 for r in regions)
    idle = set(range(topology.size)) - set(rows.ravel().tolist())
    assert {topology.names[d].rsplit("-", 1)[0] for d in idle} == {"tokyo", "seoul"}
    stages = layouts["clusters0-stages"]  # each stage's group inside at most two regions (12 = 8 + 4)
    assert all(len(set(topology.region_ids[stages[:, s]].tolist())) <= 2 for s in range(4))


def test_a_plan_fits_whole_inside_a_slower_cluster_without_a_slow_uplink():
    """Home swarm at 3 x 2: the cluster of most compute (the Berlin homes but berlin-4090-0, five
    GPUs) cannot hold six devices, so the first layout takes berlin-4090-0 behind its 100 Mbit/s
    uplink too; Paris (six GPUs, two of them 4090s) holds the plan alone and gets a layout of its
    own. The search then plans 66.21 s there instead of 70.09 s on 2 x 2 Berlin GPUs (budget 2)."""
    from planner.search.front import SearchOptions, search

    job = load_job(ROOT / "topologies" / "hetero" / "home-consumer-gpus.yaml")
    topology = job.topology
    speed = topology.effective_flops(job.training.precision)
    layouts = cluster_layouts(topology, speed, topology.memory_bytes(), 3, 2, bandwidth_clusters(topology)[:1])
    within = [name for name in layouts if "-within" in name]
    assert len(within) == 1
    assert {topology.names[d] for d in layouts[within[0]].ravel()} == {f"paris-4090-{i}" for i in range(2)} | {
        f"paris-3090-{i}" for i in range(4)}
    result = search(topology, job.model, job.training, SearchOptions(budget_s=2, time_limit_s=100))
    assert result.predicted_s < 66.3 and all(d.startswith("paris") for d in result.plan.used_devices)


def test_the_estimate_s_ring_chains_regions_and_improves_by_two_opt():
    """Twelve devices, two in each of six regions: nearest neighbour closes its ring over a slow
    link; chaining the regions halves its time, and the vectorised 2-opt leaves some regions split
    so that no hop takes a slow link (1.09 Gbit/s at worst, against 0.79 chained, 0.404 nearest and
    1.02 for Network.ring_order's 2-opt)."""
    topology = load_job(ROOT / "topologies" / "dtfm" / "case5-worldwide.yaml").topology
    members = [0, 4, 8, 12, 16, 20, 40, 44, 48, 52, 56, 60]  # oregon to ohio, london to ireland
    network = topology.network

    def ring_s(order):
        return network.ring_allreduce_s(1e9, [members[i] for i in order])

    nearest = network.ring_order(members, improve=False)
    chained = chained_ring(topology, members)
    best = best_ring(topology, members, improve=False)
    assert sorted(chained) == sorted(best) == list(range(12))
    assert ring_s(chained) < 0.6 * ring_s(nearest)
    assert ring_s(best) < 0.8 * ring_s(chained)
    assert ring_s(best) <= ring_s(network.ring_order(members))  # no slower than Network's own 2-opt
    assert chained_ring(topology, [0, 1, 2]) is None  # one region


def _assign():
    return np.array([[0, 1, 2], [3, 4, 5]])  # 2 pipelines x 3 stages on 12 devices, 6 idle


def _hood(**kwargs):
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])  # four clusters of three
    return Neighbourhood(levels=[labels], max_stages=8, max_replicas=8, **kwargs)


@pytest.mark.parametrize("name", sorted(STRUCTURAL_MOVES))
def test_each_structural_move(name):
    assign, hood = _assign(), _hood()
    if name == "split-replicas":  # an even depth to cut in halves
        assign = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    move, out = structural_move(assign, 12, hood, np.random.default_rng(3), name)
    assert move == name
    used = set(out.ravel().tolist())
    assert len(used) == out.size and used <= set(range(12))  # each device at most once
    idle_clusters = hood.levels[0][sorted(set(range(12)) - set(assign.ravel().tolist()))]
    if name == "stage-swap":
        assert out.shape == (2, 3) and sorted(map(tuple, out.T.tolist())) == sorted(map(tuple, assign.T.tolist()))
        assert not np.array_equal(out, assign)
    elif name == "stage-move":
        assert out.shape == (2, 3) and sorted(out.ravel().tolist()) == sorted(assign.ravel().tolist())
        assert any(np.array_equal(np.insert(np.delete(assign, a, axis=1), b, assign[:, a], axis=1), out)
                   for a in range(3) for b in range(3) if a != b)
        assert not np.array_equal(out, assign)
    elif name == "reverse":
        assert np.array_equal(out, assign[:, ::-1])
    elif name == "stage-out":
        changed = [s for s in range(3) if not np.array_equal(out[:, s], assign[:, s])]
        assert len(changed) == 1 and len(set(hood.levels[0][out[:, changed[0]]].tolist())) == 1
        assert set(out[:, changed[0]].tolist()).isdisjoint(assign.ravel().tolist())
    elif name == "cluster-swap":
        gone = set(assign.ravel().tolist()) - used
        came = used - set(assign.ravel().tolist())
        assert gone and len(set(hood.levels[0][list(gone)].tolist())) == 1
        assert len(set(hood.levels[0][list(came)].tolist())) == 1 and len(gone) == len(came)
        assert set(hood.levels[0][list(came)].tolist()) <= set(idle_clusters.tolist())
    elif name == "drop-replica":
        assert out.shape == (1, 3) and any(np.array_equal(out[0], row) for row in assign)
    elif name == "add-replica":
        assert out.shape == (3, 3) and np.array_equal(out[:2], assign)
        assert len(set(hood.levels[0][out[2]].tolist())) == 1  # one cluster has three idle devices
    elif name == "drop-stage":
        assert out.shape == (2, 2) and any(np.array_equal(out, np.delete(assign, s, axis=1)) for s in range(3))
    elif name == "add-stage":
        assert out.shape == (2, 4) and any(np.array_equal(np.delete(out, s, axis=1), assign) for s in range(4))
    elif name == "split-replicas":
        assert np.array_equal(out, [[0, 1], [4, 5], [2, 3], [6, 7]])
    elif name == "merge-replicas":
        assert out.shape == (1, 6) and sorted(out[0].tolist()) == list(range(6))
        assert {tuple(out[0, :3].tolist()), tuple(out[0, 3:].tolist())} == {(0, 1, 2), (3, 4, 5)}


@pytest.mark.parametrize("name", ["drop-replica", "add-replica", "drop-stage", "add-stage", "split-replicas",
                                  "merge-replicas"])
def test_pinned_degrees_keep_their_shape(name):
    hood = _hood(stages_pinned=True, replicas_pinned=True)
    assert structural_move(np.array([[0, 1], [2, 3]]), 12, hood, np.random.default_rng(0), name) == (None, None)


def test_moves_that_need_idle_devices_do_not_apply_without_them():
    full = np.arange(12).reshape(3, 4)
    for name in ("stage-out", "cluster-swap", "add-replica", "add-stage"):
        assert structural_move(full, 12, _hood(), np.random.default_rng(0), name) == (None, None)


def _four_regions():
    """Two regions of A100s and two of H100s, 100 Gbit/s inside a region, 1 Gbit/s between."""
    doc = {"devices": [{"name": "a", "count": 2, "type": "A100-80GB", "region": "a"},
                       {"name": "b", "count": 2, "type": "A100-80GB", "region": "b"},
                       {"name": "c", "count": 2, "type": "H100-SXM", "region": "c"},
                       {"name": "d", "count": 2, "type": "H100-SXM", "region": "d"}],
           "network": {"region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                       "global": {"latency": "5ms", "bandwidth": "1Gbps"}}}
    topology = parse_topology(doc, name="four-regions")
    training = parse_training({"global_batch": 32, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp16"})
    return make_context(topology, model_preset("gpt3-xl"), training)


@pytest.mark.slow
def test_structural_moves_leave_the_optimum_the_swaps_cannot_reach():
    """2 x 2 starting on the A100 regions (a stage group in each): a single swap or an idle H100
    brought in makes a stage's all-reduce cross a 1 Gbit/s link, so the swap-only search stays
    there on seeds 0-2; moving whole stage groups into the H100 regions reaches the brute-force
    optimum (or better: the local search refines the splits) on every seed."""
    ctx = _four_regions()
    start = evaluate_placement(ctx, np.array([[0, 2], [1, 3]]), 1, "1f1b")
    optimum = brute_force_placement(ctx, 2, 2, 1, "1f1b")
    hood = Neighbourhood(levels=bandwidth_clusters(ctx.topology), stages_pinned=True, replicas_pinned=True,
                         max_stages=ctx.model.layers, max_replicas=32)
    for seed in range(3):
        swaps, _ = iterated_local_search(ctx, start, np.random.default_rng(seed), 300, np.inf)
        moved, _ = iterated_local_search(ctx, start, np.random.default_rng(seed), 300, np.inf, hood)
        assert swaps.score_s > 1.05 * optimum
        assert moved.score_s <= optimum * (1 + 1e-9)
        assert set(moved.assign.ravel().tolist()) == {4, 5, 6, 7}  # the H100s


def test_structural_search_is_deterministic_with_the_seed():
    ctx = _four_regions()
    start = evaluate_placement(ctx, np.array([[0, 2], [1, 3]]), 1, "1f1b")
    hood = Neighbourhood(levels=bandwidth_clusters(ctx.topology), max_stages=ctx.model.layers, max_replicas=32)
    runs = [iterated_local_search(ctx, start, np.random.default_rng(5), 200, np.inf, hood) for _ in range(2)]
    (a, used_a), (b, used_b) = runs
    assert a.key() == b.key() and a.score_s == b.score_s and used_a == used_b


def _regions_topology(hosts_per_region: int, pairs: list | None = None):
    """Three regions of hosts of 4 GPUs each; asymmetric region links, a capped NIC on one host."""
    document = {
        "name": "regions",
        "devices": [{"name": f"{r}", "count": 4 * hosts_per_region, "type": "A100-80GB", "gpus_per_host": 4,
                     "region": r} for r in ("east", "west", "south")],
        "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                    "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "global": {"latency": "20ms", "bandwidth": "5Gbps"},
                    "region_pairs": [{"from": "east", "to": "west", "latency": "5ms", "bandwidth": "40Gbps"},
                                     {"from": "west", "to": "east", "latency": "5ms", "bandwidth": "20Gbps"}],
                    "nics": [{"host": "east-h0", "egress": "10Gbps", "ingress": "100Gbps"}],
                    **({"pairs": pairs} if pairs else {})},
    }
    return parse_topology(document, name="regions")


def test_clusters_over_hosts_are_the_clusters_over_every_pair(monkeypatch):
    """Above MAX_CLUSTER_DEVICES, a network of levels is clustered over one device per host: the same
    levels as over every pair (hosts, the east-west pair, the regions, a slow-NIC host alone)."""
    import planner.search.locality as locality

    topology = _regions_topology(hosts_per_region=4)  # 48 devices in 12 hosts
    every_pair = bandwidth_clusters(topology)
    assert len(every_pair) >= 2
    monkeypatch.setattr(locality, "MAX_CLUSTER_DEVICES", 8)  # past it: the hosts' path
    by_hosts = bandwidth_clusters(topology)
    assert len(by_hosts) == len(every_pair)
    for a, b in zip(every_pair, by_hosts):
        assert np.array_equal(a, b)
    # a per-pair override makes a link depend on more than the hosts: no clusters over hosts
    overridden = _regions_topology(4, pairs=[{"from": "east-0", "to": "west-0", "latency": "1ms",
                                              "bandwidth": "1Gbps"}])
    assert bandwidth_clusters(overridden) == []
    monkeypatch.setattr(locality, "MAX_HOST_CLUSTER_DEVICES", 40)  # and none past both limits
    assert bandwidth_clusters(topology) == []
