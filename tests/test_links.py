"""A network described by levels is looked up by (host, region) keys, never as N x N, and gives the
same link times, rings, bounds and simulations as the dense matrices it stands for."""

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from benchmarks.scale import generated_topology
from cost_models.links import LevelMatrix, take
from planner.errors import InputError
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.bounds import lower_bound_s
from planner.search.front import SearchOptions, search

from conftest import small_topology


def _name(document: dict, host: int, k: int) -> str:
    return f"{document['devices'][host]['name']}-{k}"


def _document(devices: int = 64) -> dict:
    """``benchmarks/scale.py``'s topology with shared NICs and pair entries over the levels."""
    document = generated_topology(devices)
    document["network"]["nic"] = "25Gbps"
    document["network"]["nics"] = [{"host": "host1", "egress": "5Gbps", "ingress": "40Gbps"}]
    document["network"]["pairs"] = [
        {"from": _name(document, 0, 0), "to": _name(document, 1, 3), "latency": "7ms", "bandwidth": "2Gbps"},
        {"from": _name(document, 2, 1), "to": _name(document, 2, 5), "latency": "1ms", "bandwidth": "30Gbps",
         "symmetric": True}]
    return document


def _dense(topology):
    return replace(topology, latency_s=np.asarray(topology.latency_s),
                   bandwidth_bytes_per_s=np.asarray(topology.bandwidth_bytes_per_s))


def test_levels_and_dense_give_the_same_link_times():
    levels = parse_topology(_document())
    assert isinstance(levels.latency_s, LevelMatrix) and isinstance(levels.network.bandwidth_bytes_per_s, LevelMatrix)
    dense = _dense(levels)
    n = levels.size
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    for message_bytes in (0.0, 1e6, 3e9):
        assert np.array_equal(levels.network.transfer_s(a, b, message_bytes), dense.network.transfer_s(a, b, message_bytes))
    assert levels.network.transfer_s(0, 11, 1e6) == pytest.approx(7e-3 + 1e6 / (2e9 / 8))  # the pair entry
    assert levels.network.bandwidth_bytes_per_s[8, 24] == 5e9 / 8  # host1's egress NIC caps its links to host3
    assert levels.network.bandwidth_bytes_per_s[17, 21] == 30e9 / 8  # a pair on one host: no NIC
    members = list(range(0, n, 3))
    assert levels.network.ring_order(members) == dense.network.ring_order(members)
    assert levels.network.ring_cost(members) == dense.network.ring_cost(members)
    assert np.array_equal(levels.network.fastest_out_bytes_per_s(), dense.network.fastest_out_bytes_per_s())
    block = np.ix_(members, members)
    assert np.array_equal(take(levels.latency_s, members)[np.ix_(range(len(members)), range(len(members)))],
                          dense.latency_s[block])
    assert levels.network.sharded_exchange_s(1e8, members) == dense.network.sharded_exchange_s(1e8, members)


def test_levels_and_dense_give_the_same_search_bound_and_simulation():
    job = parse_topology(small_topology()), model_preset("tiny")
    training = parse_training(small_topology()["training"])
    levels, model = job
    dense = _dense(levels)
    assert lower_bound_s(levels, model, training) == lower_bound_s(dense, model, training)
    options = SearchOptions(seed=1, time_limit_s=60.0, budget_s=0.5, exact=False)
    plan = search(levels, model, training, options).plan
    other = search(dense, model, training, options).plan
    assert (plan.assignment, plan.layer_bounds, plan.micro_batches) == (other.assignment, other.layer_bounds,
                                                                       other.micro_batches)
    assert predict(plan, levels, model, training)[0] == predict(plan, dense, model, training)[0]


def test_a_missing_level_names_the_pair_and_the_level():
    document = generated_topology(512)  # 64 hosts in 4 regions: host h in region h % 4
    del document["network"]["global"]
    document["network"]["region_pairs"] = document["network"]["region_pairs"][1:]  # region0 - region1 missing
    with pytest.raises(InputError, match=r"no link from h0-\S+ \(host host0, region region0\) to h1-\S+ "
                                         r"\(host host1, region region1\): add network.global"):
        parse_topology(document)
    document["network"]["pairs"] = [{"from": _name(document, 0, i), "to": _name(document, 1, j), "latency": "1ms",
                                     "bandwidth": "1Gbps"} for i in range(8) for j in range(8)]
    with pytest.raises(InputError, match=r"no link from h0-\S+ \(host host0, .* to h5-"):  # region1's next host
        parse_topology(document)


def test_a_level_described_network_takes_memory_linear_in_devices():
    def peak_bytes(devices: int) -> int:
        document = generated_topology(devices)
        tracemalloc.start()
        topology = parse_topology(document)
        network = topology.network
        network.fastest_out_bytes_per_s()
        network.ring_order(list(range(0, devices, 4)), improve=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    small, large = peak_bytes(512), peak_bytes(4096)
    assert large < 12 * small  # 8x the devices; dense N x N float64 would be 64x (4096: 134 MB per matrix)
    assert large < 40e6
