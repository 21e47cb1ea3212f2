"""The one network model: hand-computed messages and collectives, and the search's estimate, the
simulator and the emulation agreeing on transfers that share a host's NIC."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from cost_models import comm
from cost_models.network import Network
from planner.inputs.job import load_topology
from planner.inputs.model import model_preset, parse_training
from planner.prediction.predict import build_pipeline_job, predict
from planner.search.evaluate import make_context, score_split
from tests.runtime_helpers import write_test_plan


def _network(n=4, hosts=(0, 0, 1, 1), latency=1e-3, bandwidth=1e9, nic=None, overhead=0.0) -> Network:
    h = max(hosts) + 1
    nic_array = np.full(h, np.inf) if nic is None else np.full(h, nic)
    return Network(link_latency_s=np.full((n, n), latency), link_bandwidth_bytes_per_s=np.full((n, n), bandwidth),
                   host=np.array(hosts), nic_egress_bytes_per_s=nic_array, nic_ingress_bytes_per_s=nic_array.copy(),
                   message_overhead_s=overhead)


def test_a_message_costs_latency_overhead_and_wire_time_capped_by_the_nics():
    net = _network(nic=0.25e9, overhead=2e-4)
    assert net.transfer_s(0, 1, 1e6) == pytest.approx(1e-3 + 2e-4 + 1e6 / 1e9)  # same host: the link
    assert net.transfer_s(0, 2, 1e6) == pytest.approx(1e-3 + 2e-4 + 1e6 / 0.25e9)  # across hosts: the NIC
    assert net.busy_s(0, 2, 1e6) == pytest.approx(4e-3)
    assert net.transfer_matrix_s(1e6)[1, 1] == 0.0
    assert net.transfer_holds(0, 1, 1e6) == [(("link", 0, 1), pytest.approx(1e-3))]
    # Across hosts the link is held for the wire time at the NIC-capped rate, each NIC at its own rate.
    assert net.transfer_holds(0, 3, 1e6) == [(("link", 0, 3), pytest.approx(4e-3)), (("egress", 0), pytest.approx(4e-3)),
                                             (("ingress", 1), pytest.approx(4e-3))]
    fast_nic = _network(nic=100e9)
    assert fast_nic.transfer_holds(0, 3, 1e6) == [(("link", 0, 3), pytest.approx(1e-3)),
                                                  (("egress", 0), pytest.approx(1e-5)),
                                                  (("ingress", 1), pytest.approx(1e-5))]
    assert net.has_shared_nics and not _network().has_shared_nics


def test_nic_load_counts_every_message_that_crosses_it():
    net = _network(nic=1e9)
    egress, ingress = net.nic_busy_s([0, 1, 0], [2, 3, 1], 1e6)  # two cross host 0 -> 1, one stays inside
    assert egress == pytest.approx([2e-3, 0.0]) and ingress == pytest.approx([0.0, 2e-3])


def test_a_ring_occupies_the_nics_of_every_host_it_spans():
    net = _network(nic=1e9)
    assert net.ring_nics([0, 1]) == ()  # one host: no NIC
    assert set(net.ring_nics([1, 0, 3])) == {("egress", 0), ("egress", 1), ("ingress", 0), ("ingress", 1)}
    assert _network().ring_nics([0, 2]) == ()  # no shared NICs at all


def test_ring_splits_a_shared_nic_among_its_hops():
    # Ring 0 -> 2 -> 1 -> 3 -> 0 crosses between hosts on every hop: two hops leave each host.
    net = _network(nic=1e9, bandwidth=10e9)
    latency, bandwidth = net.ring_hops([0, 2, 1, 3])
    assert bandwidth == pytest.approx([0.5e9] * 4)
    # Ring 0 -> 1 -> 2 -> 3 -> 0 crosses twice: once out of each host.
    assert net.ring_hops([0, 1, 2, 3])[1] == pytest.approx([10e9, 1e9, 10e9, 1e9])
    assert net.ring_allreduce_s(1e9, [0, 1, 2, 3]) == pytest.approx(comm.ring_allreduce_time_s(
        1e9, [1e-3] * 4, [10e9, 1e9, 10e9, 1e9]))
    order = net.ring_order_of([0, 2, 1, 3])
    assert net.ring_allreduce_s(1e9, order) <= net.ring_allreduce_s(1e9, [0, 2, 1, 3])


def test_parameter_server_and_hierarchical_all_reduce_by_hand():
    net = _network(nic=1e9, bandwidth=10e9, latency=0.0)
    # Server 0: device 1 on its host at 10 GB/s, devices 2 and 3 share host 0's NIC (0.5 GB/s each).
    assert net.parameter_server_s(1e9, [0, 1, 2, 3], server=0) == pytest.approx(2 * 1e9 / 0.5e9)
    # Two hosts of two: ring inside (2 * 1/2 * n / 10 GB/s), ring of two leaders over 1 GB/s NICs
    # (2 * 1/2 * n / 1 GB/s), then a broadcast inside each host (n / 10 GB/s).
    assert net.hierarchical_allreduce_s(1e9, [0, 1, 2, 3]) == pytest.approx(0.1 + 1.0 + 0.1)
    assert net.sharded_exchange_s(1e9, [0]) == 0.0


def _nic_topology(path: Path, nic: str) -> Path:
    """Two hosts of three CPU 'devices' each; every cross-host message goes through a shared NIC."""
    devices = [{"name": "a", "count": 3, "type": "CPU-core", "host": "ha"},
               {"name": "b", "count": 3, "type": "CPU-core", "host": "hb"}]
    document = {"name": "shared-nic", "devices": devices,
                "network": {"host": {"latency": "0.1ms", "bandwidth": "10Gbps"},
                            "region": {"latency": "1ms", "bandwidth": "1Gbps"}, "nic": nic}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


ASSIGNMENT = [["a-0", "b-0"], ["a-1", "b-1"], ["a-2", "b-2"]]  # three pipelines, each crossing the NIC


def _estimate_and_simulation(topology_path: Path) -> tuple:
    topology = load_topology(topology_path)
    model = model_preset("tiny")
    training = parse_training({"global_batch": 48, "micro_batch_size": 4, "precision": "fp32", "optimizer": "sgd",
                               "schedule": "1f1b"})
    ctx = make_context(topology, model, training)
    assign = np.array([[topology.index(d) for d in row] for row in ASSIGNMENT])
    estimate = score_split(ctx, assign, (2, 2), (4, 4, 4), 4, "1f1b")
    plan_path = write_test_plan(topology_path.parent, topology_path, assignment=ASSIGNMENT, layer_bounds=[0, 2, 4],
                                micro_batches=[4, 4, 4], micro_batch_size=4, schedule="1f1b")
    from planner.plan.document import read_plan

    plan, _ = read_plan(plan_path)
    simulated = predict(plan, topology, model, training)[0].iteration_s
    return estimate, simulated, plan_path, build_pipeline_job(plan, topology, model, training)


def test_estimate_and_simulator_agree_when_pipelines_share_a_nic(tmp_path):
    shared, simulated, _, job = _estimate_and_simulation(_nic_topology(tmp_path / "t.yaml", "20Mbps"))
    # The NIC carries all three pipelines' messages: far slower than one link alone would be.
    one_link = float(job.network.busy_s(0, 3, job.boundary_bytes[0]))
    assert 3 * one_link > 2 * job.forward_s.max()
    assert shared == pytest.approx(simulated, rel=0.05)
    (tmp_path / "wide").mkdir()
    wide, wide_simulated, _, _ = _estimate_and_simulation(_nic_topology(tmp_path / "wide" / "t.yaml", "100Gbps"))
    assert wide == pytest.approx(wide_simulated, rel=0.05)
    assert simulated > 2 * wide_simulated  # the NIC matters, and both models see it


def _two_rings_topology(path, nic: str, between: str):
    """Two hosts in two regions joined by ``between``; each of a 2-stage plan's two stages has one
    device on each host, so both stages' all-reduce rings cross both hosts' NICs."""
    document = {"devices": [{"name": "a", "count": 2, "type": "A100-80GB", "host": "ha", "region": "r1"},
                            {"name": "b", "count": 2, "type": "A100-80GB", "host": "hb", "region": "r2"}],
                "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                            "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                            "global": {"latency": "1ms", "bandwidth": between}}}
    if nic:
        document["network"]["nic"] = nic
    path.write_text(yaml.safe_dump(document))
    return load_topology(path)


def test_rings_slower_than_a_nic_share_it_and_rings_limited_by_it_queue(tmp_path):
    """A ring bottlenecked by a 1 Gbit/s link behind 400 Gbit/s NICs uses a sliver of each NIC, so
    two stages' rings run together: the iteration equals that without NICs (holding the NIC for the
    whole all-reduce serialised them). Behind 1 Gbit/s NICs and a 100 Gbit/s link, the NIC is the
    bottleneck and the rings queue for it. The estimate agrees with the simulator in both."""
    from planner.plan.plan import Plan

    model = model_preset("gpt3-xl")
    training = parse_training({"global_batch": 8, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                               "schedule": "1f1b", "shard_optimizer": False})
    plan = Plan(layer_bounds=(0, 12, 24), assignment=(("a-0", "a-1"), ("b-0", "b-1")), micro_batches=(4, 4),
                micro_batch_size=1, schedule="1f1b")
    times = {}
    for name, nic, between in (("fast-nic", "400Gbps", "1Gbps"), ("no-nic", None, "1Gbps"),
                               ("slow-nic", "1Gbps", "100Gbps"), ("no-nic-fast-link", None, "100Gbps")):
        (tmp_path / name).mkdir()
        topology = _two_rings_topology(tmp_path / name / "t.yaml", nic, between)
        simulated = predict(plan, topology, model, training)[0].iteration_s
        assign = np.array([[topology.index(d) for d in row] for row in plan.assignment])
        estimate = score_split(make_context(topology, model, training), assign, (12, 12), (4, 4), 1, plan.schedule)
        assert estimate == pytest.approx(simulated, rel=0.05), name
        times[name] = simulated
    assert times["fast-nic"] == pytest.approx(times["no-nic"], rel=1e-3)
    assert times["slow-nic"] > times["no-nic-fast-link"] * 1.2


@pytest.mark.slow
@pytest.mark.runtime
def test_emulation_agrees_with_the_simulator_when_pipelines_share_a_nic(tmp_path):
    pytest.importorskip("torch")
    from planner.runtime.launch import LaunchOptions, launch

    estimate, simulated, plan_path, _ = _estimate_and_simulation(_nic_topology(tmp_path / "t.yaml", "20Mbps"))
    scale = 3.0  # emulated seconds per plan second
    results = launch(plan_path, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(tmp_path / "run"),
                                              emulate=True, time_scale=scale), log=lambda line: None)
    assert results["comparison"]["predicted_s"] == pytest.approx(simulated * scale)
    measured = results["comparison"]["measured_s"] / scale
    assert measured == pytest.approx(simulated, rel=0.15)
    assert estimate == pytest.approx(measured, rel=0.15)
