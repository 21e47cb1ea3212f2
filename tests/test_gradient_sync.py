"""Gradient sync algorithms: the formulas by hand on two hosts of two devices, every algorithm's
messages adding up to the bytes the cost model counts, the plan file and the CLI refusing what
does not go together, and the runtime's point-to-point implementations training exactly like
single-process training and sending the predicted bytes."""

import numpy as np
import pytest

from cost_models import comm
from cost_models.network import Network, Sync
from planner.errors import InputError
from planner.inputs.model import TrainingSpec

N = 1e9  # bytes synced


def _two_hosts(nic=np.inf, bandwidth=10e9, latency=1e-3) -> Network:
    """Devices 0, 1 on host 0 and 2, 3 on host 1; 10 GB/s links, hosts joined through a shared NIC."""
    nics = np.full(2, nic)
    return Network(link_latency_s=np.full((4, 4), latency), link_bandwidth_bytes_per_s=np.full((4, 4), bandwidth),
                   host=np.array([0, 0, 1, 1]), nic_egress_bytes_per_s=nics, nic_ingress_bytes_per_s=nics.copy())


def test_every_algorithm_by_hand_on_two_hosts_of_two():
    net = _two_hosts(nic=1e9)
    # Ring 0 1 2 3: hops 1->2 and 3->0 leave a host, each alone on its NIC (1 GB/s); 2 (k-1)/k n over the
    # slowest hop, plus 2 (k - 1) latencies (Patarasuk & Yuan 2009).
    assert net.sync_s(Sync.RING, N, [0, 1, 2, 3]) == pytest.approx(2 * 3 / 4 * N / 1e9 + 6 * 1e-3)
    # Hierarchical: 1 -> 0 and 3 -> 2 (n / 10 GB/s + latency), a ring of the leads 0, 2 over the NICs
    # (2 * 1/2 * n / 1 GB/s + 2 latencies), then back (the same as the reduce).
    inside = N / 10e9 + 1e-3
    assert net.sync_s(Sync.HIERARCHICAL, N, [0, 1, 2, 3]) == pytest.approx(2 * inside + N / 1e9 + 2e-3)
    # Parameter server 0: 2 and 3 share host 1's egress and host 0's ingress (0.5 GB/s each), twice.
    assert net.sync_s(Sync.PARAMETER_SERVER, N, [0, 1, 2, 3], server=0) == pytest.approx(2 * (N / 0.5e9 + 1e-3))
    # Sharded: device 0 exchanges 2 n / 4 with each other device: with 1 at 10 GB/s, with 2 and 3 at 1 GB/s.
    per = [2 * (1e-3 + N / (4 * b)) for b in (10e9, 1e9, 1e9)]
    assert net.sync_s(Sync.SHARDED, N, [0, 1, 2, 3]) == pytest.approx(sum(per))
    assert net.sync_s(Sync.PARAMETER_SERVER, N, [2]) == 0.0
    # The server with the best links: on a host of its own fast NIC a remote server is no better, so the first.
    assert net.parameter_server_of([0, 1, 2, 3]) == 0
    assert comm.ring_allreduce_time_s(N, [1e-3] * 4, [10e9, 1e9, 10e9, 1e9]) == net.sync_s(Sync.RING, N, [0, 1, 2, 3])


def test_parameter_server_prefers_the_member_with_the_fastest_links():
    net = _two_hosts(nic=np.inf, bandwidth=1e9)
    faster = net.link_bandwidth_bytes_per_s.copy()
    faster[3, :] = faster[:, 3] = 10e9  # device 3 has 10x links
    net = Network(link_latency_s=net.link_latency_s, link_bandwidth_bytes_per_s=faster, host=net.host,
                  nic_egress_bytes_per_s=net.nic_egress_bytes_per_s, nic_ingress_bytes_per_s=net.nic_ingress_bytes_per_s)
    assert net.parameter_server_of([0, 1, 2, 3]) == 3


@pytest.mark.parametrize("sync", list(Sync))
def test_every_algorithm_sends_2_k_minus_1_times_the_gradients(sync):
    net = _two_hosts(nic=1e9)
    senders, receivers, sizes = net.sync_flows(sync, [0, 2, 1, 3], N, server=1)
    assert sizes.sum() == pytest.approx(2 * 3 * N)
    assert (senders != receivers).all()
    # every NIC a flow crosses is held, links for the whole sync
    holds = dict(net.sync_holds(sync, [0, 2, 1, 3], N, 5.0, server=1))
    assert all(holds[("link", int(a), int(b))] == 5.0 for a, b in zip(senders, receivers))
    assert {("egress", 0), ("ingress", 1)} <= set(holds)


def test_hierarchical_crosses_between_hosts_once_each_way():
    net = _two_hosts(nic=1e9)
    senders, receivers, sizes = net.sync_flows(Sync.HIERARCHICAL, [0, 1, 2, 3], N)
    crossing = net.host[senders] != net.host[receivers]
    assert crossing.sum() == 2 and sizes[crossing].sum() == pytest.approx(2 * N)  # the two leads' ring


def test_training_refuses_sync_with_what_it_cannot_run_with():
    with pytest.raises(InputError, match="training.sync.*shard_optimizer"):
        TrainingSpec(global_batch=8, sync="parameter-server", shard_optimizer=True)
    with pytest.raises(InputError, match="sync_every"):
        TrainingSpec(global_batch=8, sync="hierarchical", sync_every=4)
    with pytest.raises(InputError, match="powersgd"):
        TrainingSpec(global_batch=8, sync="sharded", compress_gradients="powersgd")
    with pytest.raises(InputError, match="not one of"):
        TrainingSpec(global_batch=8, sync="star")
    TrainingSpec(global_batch=8, sync="sharded", shard_optimizer=True)  # ZeRO-1 is a sharded exchange's first half


# -- the runtime -------------------------------------------------------------------------------
FOUR_REPLICAS = dict(assignment=[["a0"], ["a1"], ["b0"], ["b1"]], layer_bounds=[0, 4], micro_batches=[1, 2, 1, 2],
                     micro_batch_size=1, schedule="1f1b", ring_orders=[[0, 2, 1, 3]])


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("sync", list(Sync))
def test_each_algorithm_trains_like_one_process_and_sends_the_predicted_bytes(tmp_path, sync):
    from planner.plan.document import read_plan
    from planner.prediction.predict import communication_bytes
    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import cpu_topology, write_test_plan
    from tests.test_runtime import _assert_matches_single_process

    topology = cpu_topology(tmp_path / "topology.yaml")
    path = write_test_plan(tmp_path, topology, **FOUR_REPLICAS, shard_optimizer=False, sync=str(sync))
    plan, _ = read_plan(path)
    assert plan.sync == sync and (plan.sync_servers != ()) == (sync == Sync.PARAMETER_SERVER)
    out = tmp_path / "run"
    results = launch(path, LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    kwargs = {k: v for k, v in FOUR_REPLICAS.items() if k != "ring_orders"}
    _assert_matches_single_process(results, out, kwargs, iterations=2, lr=0.05)
    from planner.inputs.model import model_preset, parse_training

    training = parse_training({"global_batch": 6, "micro_batch_size": 1, "precision": "fp32", "optimizer": "sgd",
                               "schedule": "1f1b", "shard_optimizer": False, "sync": str(sync)})
    predicted = communication_bytes(plan, model_preset("tiny"), training)["data_parallel_bytes_per_iteration"]
    assert results["run"]["data_parallel_bytes_per_iteration"] == [pytest.approx(predicted)] * 2
