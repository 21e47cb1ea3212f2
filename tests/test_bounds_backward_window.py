"""The lower bound's backward-window term (``planner.search.backward_window``): the least walks and
hop costs by hand, both cases of the term by hand, and on the generated 1,024 devices a bound that
rises and stays below the plan the search finds there."""

import numpy as np
import pytest

from cost_models.network import Network
from planner.search.backward_window import WindowTerm, hop_costs_s, least_walks_s, window_of


def test_least_walks_by_hand():
    """Four clusters on a line, 1 s between neighbours and 10 s otherwise: the closure prices a pair
    by the line (0 to 3 through 1 and 2: 3 s, not 10), so the least path through all four is 3 s,
    through {0, 2} 2 s, through {0, 3} 3 s; one cluster 0, none inf."""
    hop = np.full((4, 4), 10.0)
    np.fill_diagonal(hop, 0.0)
    for i in range(3):
        hop[i, i + 1] = hop[i + 1, i] = 1.0
    walks = least_walks_s(hop)
    assert walks[0b1111] == pytest.approx(3.0)
    assert walks[0b0101] == pytest.approx(2.0)
    assert walks[0b1001] == pytest.approx(3.0)
    assert walks[0b0010] == 0.0 and walks[0] == np.inf
    assert walks[0b0111] == pytest.approx(2.0) and walks[0b1011] == pytest.approx(3.0)


def _two_sites(latency_s: float, bandwidth_bytes_per_s: float) -> tuple:
    """8 devices, 4 on each of two sites: fast inside a site, ``latency_s`` and ``bandwidth`` between."""
    site = np.repeat([0, 1], 4)
    between = site[:, None] != site[None, :]
    latency = np.where(between, latency_s, 1e-5)
    bandwidth = np.where(between, bandwidth_bytes_per_s, 1e11)
    network = Network(link_latency_s=latency, link_bandwidth_bytes_per_s=bandwidth, host=np.arange(8),
                      nic_egress_bytes_per_s=np.full(8, np.inf), nic_ingress_bytes_per_s=np.full(8, np.inf))
    return network, site


def test_hop_costs_by_hand():
    """A message each way: 2 (0.05 s + 1e8 B / 1e9 B/s) = 0.3 s between the sites, 0 inside one."""
    network, site = _two_sites(0.05, 1e9)
    hop = hop_costs_s(network, site, 1e8)
    assert hop[0, 1] == pytest.approx(0.3) and hop[1, 0] == pytest.approx(0.3)
    assert hop[0, 0] == 0.0


def test_hop_costs_by_levels_match_the_dense_network():
    """Three regions of two hosts of two devices, asymmetric region pairs: the (host, region) tables
    give the same hop costs as the dense matrices of the same network."""
    from dataclasses import replace

    from planner.inputs.topology import parse_topology

    document = {"name": "three", "devices": [
        {"name": f"r{r}h{h}", "count": 2, "type": "A100-80GB", "host": f"r{r}h{h}", "region": f"r{r}"}
        for r in range(3) for h in range(2)],
        "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                    "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "global": {"latency": "100ms", "bandwidth": "1Gbps"},
                    "region_pairs": [{"regions": ["r0", "r1"], "latency": "30ms", "bandwidth": "5Gbps"},
                                     {"regions": ["r1", "r2"], "latency": "80ms", "bandwidth": "2Gbps"}]}}
    network = parse_topology(document).network
    dense = replace(network, link_latency_s=np.array(network.link_latency_s),
                    link_bandwidth_bytes_per_s=np.array(network.link_bandwidth_bytes_per_s))
    regions = np.repeat([0, 1, 2], 4)
    assert np.allclose(hop_costs_s(network, regions, 1e7), hop_costs_s(dense, regions, 1e7))
    # r0 - r2 has no entry: the global level's 100 ms and 1 Gbit/s
    assert hop_costs_s(network, regions, 1e7)[0, 2] == pytest.approx(2 * (0.1 + 1e7 / 1.25e8))


def _term(latency_s: float, work: float, window: float, cells: float, chain_s: float = 0.0) -> WindowTerm:
    network, site = _two_sites(latency_s, np.inf)
    return WindowTerm(window=window_of(network, site, np.ones(8), 0.0), work_flops=work, window_flops=window,
                      cells_flops=np.full(8, cells), chain_s=chain_s)


def test_every_group_pure_by_hand():
    """Two sites of 4 devices of 1 FLOP/s, 1 s between them (a round trip through both: 2 s):
    2 stages of 4 replicas fill both sites (one group each), so every replica goes there and back:
    T >= 2 s + 8 FLOPs of backward / 8 FLOP/s = 3 s (the work alone, 12 / 8, less). With 2 replicas
    both groups fit in one site: 12 FLOPs on its 4 devices, 3 s, or both sites at 3 s as well; the
    least is 3 s; with 10 FLOPs of work, one site takes 2.5 s, less than both (2 + 1)."""
    term = _term(1.0, 12.0, 8.0, 8.0)
    pure = term.pure_s(2, np.array([4, 2]), np.zeros(2))
    assert pure[0] == pytest.approx(3.0) and pure[1] == pytest.approx(3.0)
    assert _term(1.0, 10.0, 8.0, 8.0).pure_s(2, np.array([2]), np.zeros(1))[0] == pytest.approx(2.5)
    # a stage's sync longer than the way back: the forward half (1 s), then the 1.5 s sync
    assert term.pure_s(2, np.array([4]), np.array([1.5]))[0] == pytest.approx(1.0 + 1.5 + 1.0)
    # 3 groups of 4 fit nowhere: no plan of pure groups
    assert term.pure_s(3, np.array([4]), np.zeros(1))[0] == np.inf


def test_crossing_groups_by_hand():
    """Case (B) on the same sites: the pure groups fill one site at least. In one site, its pure
    cells (4 FLOP/s at most) wait for their sync (0.25 s), the crossing ones (the other 4) for
    theirs (1 s): T >= (8 + 4 * 0.25 + 4 * 1) / 8 = 1.625 s; in both (a 2 s round trip, every cell
    pure at most): (8 + 8 * 2) / 8 = 3 s; the least is 1.625 s. At two sites at least: 3 s."""
    term = _term(1.0, 8.0, 8.0, 8.0)
    rows = term.crossed_s(np.array([[1], [2]]), np.array([4]), np.array([0.25]), np.array([1.0]))
    assert rows[0, 0] == pytest.approx(1.625) and rows[1, 0] == pytest.approx(3.0)


def test_generated_1024_bound_rises_and_stays_below_its_plan(tmp_path):
    """``benchmarks/scale.py``'s 1,024 devices in 8 regions, as ``scale.py --command`` plans them: the
    term lifts the bound above the 1.745 s of the other terms, and stays below the plan found at
    ``--budget 5`` there (8 x 114, 4.27 s)."""
    import sys
    from pathlib import Path

    import yaml

    from planner.inputs.job import load_job
    from planner.search.bounds import lower_bound_s

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from scale import generated_topology

    document = generated_topology(1024)
    document["network"]["nic"] = "100Gbps"
    document["model"] = "gpt3-6.7b"
    document["training"] = {"global_batch": 2048, "micro_batch_size": 1, "precision": "auto", "recompute": True,
                            "flash_attention": True}
    path = tmp_path / "generated-1024.yaml"
    path.write_text(yaml.safe_dump(document))
    job = load_job(path)
    bound = lower_bound_s(job.topology, job.model, job.training)
    assert 1.8 < bound < 4.27
