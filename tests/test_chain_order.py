"""Stage groups ordered along the widest chain of links (planner.search.chain_order) and the
stage-local cluster layouts that use it (planner.search.construct)."""

import itertools

import numpy as np

from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.search.chain_order import widest_chain
from planner.search.construct import MATCHED_DEVICES, cluster_layouts, layouts
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.locality import bandwidth_clusters

# Four regions of nine 8-GPU hosts each. A spanning tree from a takes b (10), then c (9 via a), then d
# (5 via c): as a chain a, b, c, d it crosses b-c at 1 Gbit/s. The chain b, a, c, d crosses 10, 9, 5.
# 288 devices: above MATCHED_DEVICES, where no matched layout orders the stages.
_GBPS = {("a", "b"): 10, ("a", "c"): 9, ("c", "d"): 5, ("b", "c"): 1, ("b", "d"): 1, ("a", "d"): 1}
_HOSTS, _PER_HOST = 9, 8


def _four_regions():
    pairs = [{"regions": [x, y], "latency": "30ms", "bandwidth": f"{g}Gbps"} for (x, y), g in _GBPS.items()]
    document = {"name": "four-regions",
                "devices": [{"name": f"{r}{h}-gpu", "count": _PER_HOST, "type": "A100-80GB", "host": f"host-{r}{h}",
                             "region": r} for r in "abcd" for h in range(_HOSTS)],
                "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                            "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                            "global": {"latency": "100ms", "bandwidth": "1Gbps"}, "region_pairs": pairs}}
    return parse_topology(document, name="four-regions")


def _context(topology):
    training = parse_training({"global_batch": 1024, "micro_batch_size": 1, "precision": "fp16", "recompute": True,
                               "flash_attention": True})
    return make_context(topology, model_preset("gpt3-xl"), training)


def _stage_regions(topology, assign):
    """Each stage's region, or None where a stage's devices span regions."""
    regions = [{topology.names[d][0] for d in assign[:, s]} for s in range(assign.shape[1])]
    return [next(iter(r)) for r in regions] if all(len(r) == 1 for r in regions) else None


def _slowest_link(topology, assign):
    chain = _stage_regions(topology, assign)
    if chain is None:
        return None
    return min(_GBPS.get((x, y), _GBPS.get((y, x))) for x, y in zip(chain, chain[1:]))


def _brute_widest(between):
    k = len(between)

    def key(order):
        links = [between[a, b] for a, b in zip(order, order[1:])]
        return (-min(links), sum(1.0 / x for x in links))

    return min(key(order) for order in itertools.permutations(range(k)))


def _chain_key(between, order):
    links = [between[a, b] for a, b in zip(order, order[1:])]
    return (-min(links), sum(1.0 / x for x in links))


def test_widest_chain_hand_case():
    names = "abcd"
    between = np.zeros((4, 4))
    for (x, y), g in _GBPS.items():
        between[names.index(x), names.index(y)] = between[names.index(y), names.index(x)] = g
    order = widest_chain(between)
    assert sorted(order) == [0, 1, 2, 3]
    assert order in ([1, 0, 2, 3], [3, 2, 0, 1])  # b, a, c, d: links 10, 9, 5


def test_widest_chain_matches_brute_force_on_random_groups():
    rng = np.random.default_rng(3)
    for k in range(3, 8):
        for _ in range(10):
            upper = np.triu(rng.choice([1.0, 2.0, 5.0, 10.0, 25.0, 40.0], size=(k, k)), 1)
            between = upper + upper.T
            order = widest_chain(between)
            assert sorted(order) == list(range(k))
            assert np.allclose(_chain_key(between, order), _brute_widest(between))


def test_stage_layouts_order_regions_along_the_widest_chain():
    """One stage per region, 4 x 72: the cluster layouts chain the regions b, a, c, d too (slowest
    link 5 Gbit/s), and the search's estimate prefers that to the spanning tree's a, b, c, d (1 Gbit/s)."""
    topology = _four_regions()
    ctx = _context(topology)
    stages, replicas = 4, _HOSTS * _PER_HOST
    assert stages * replicas > MATCHED_DEVICES
    found = cluster_layouts(topology, ctx.speed, ctx.capacity, stages, replicas, bandwidth_clusters(topology))
    widest = [a for a in found.values() if _slowest_link(topology, a) == 5]
    assert widest, {name: _slowest_link(topology, a) for name, a in found.items()}
    tree = [a for a in found.values() if _slowest_link(topology, a) == 1]
    best_widest = min(evaluate_placement(ctx, a, 1, "gpipe").score_s for a in widest)
    assert tree and all(best_widest < evaluate_placement(ctx, a, 1, "gpipe").score_s for a in tree)
    everything = layouts(topology, ctx.speed, ctx.capacity, stages, replicas)
    assert all(any(np.array_equal(a, b) for b in everything.values()) for a in widest)


def test_a_layout_puts_each_stage_in_a_region_of_its_own():
    """Four stages of 70 replicas in regions of 72 devices: the stage runs of 70 that the other layouts
    cut from the locality and cluster orders straddle regions (their all-reduces cross slow links);
    the stage-regions layout keeps each stage in one region, chained b, a, c, d (10, 9, 5 Gbit/s)."""
    topology = _four_regions()
    ctx = _context(topology)
    stages, replicas = 4, 70
    assert stages * replicas > MATCHED_DEVICES
    found = layouts(topology, ctx.speed, ctx.capacity, stages, replicas)
    regional = {name: a for name, a in found.items() if _stage_regions(topology, a) is not None}
    assert list(regional) == ["stage-regions"]
    assert _stage_regions(topology, regional["stage-regions"]) in (list("bacd"), list("dcab"))
    best = evaluate_placement(ctx, regional["stage-regions"], 1, "gpipe").score_s
    assert all(best < evaluate_placement(ctx, a, 1, "gpipe").score_s for name, a in found.items() if name not in regional)
