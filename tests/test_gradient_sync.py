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
                  nic_egress_bytes_per_s=net.nic_egress_bytes_per_s,
                  nic_ingress_bytes_per_s=net.nic_ingress_bytes_per_s)
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


# Three replicas on host a's equal links: a ring there runs as torch's collective (``route_matters``).
ONE_HOST = dict(assignment=[["a0"], ["a1"], ["a2"]], layer_bounds=[0, 4], micro_batches=[2, 2, 2],
                micro_batch_size=1, schedule="1f1b", ring_orders=[[0, 2, 1]])


def test_only_a_ring_over_equal_links_of_one_host_is_left_to_the_collective(tmp_path):
    from planner.plan.document import read_plan
    from planner.inputs.topology import parse_topology
    from planner.io import read_yaml
    from planner.runtime.engine import Layout
    from planner.runtime.gradient_sync import route_matters, sync_route
    from tests.runtime_helpers import cpu_topology, write_test_plan

    topology_path = cpu_topology(tmp_path / "topology.yaml")
    topology = parse_topology(read_yaml(topology_path), name="cpu-six")
    for cells, sync, matters in ((ONE_HOST, Sync.RING, False), (ONE_HOST, Sync.PARAMETER_SERVER, True),
                                 (FOUR_REPLICAS, Sync.RING, True), (FOUR_REPLICAS, Sync.SHARDED, True)):
        folder = tmp_path / f"{len(cells['assignment'])}-{sync}"
        folder.mkdir()
        plan, _ = read_plan(write_test_plan(folder, topology_path, **cells, shard_optimizer=False, sync=str(sync)))
        layout = Layout.of_plan(plan)
        route = sync_route(plan, topology, layout, 0, 0, layout.rank(0, 0))
        assert route_matters(route) is matters, (cells["assignment"], sync)


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("sync, shard, cells", [(s, False, FOUR_REPLICAS) for s in Sync] + [
    (Sync.RING, True, FOUR_REPLICAS), (Sync.SHARDED, True, FOUR_REPLICAS), (Sync.RING, False, ONE_HOST),
    (Sync.RING, True, ONE_HOST)])
def test_each_algorithm_trains_like_one_process_and_sends_the_predicted_bytes(tmp_path, sync, shard, cells):
    from planner.plan.document import read_plan
    from planner.prediction.predict import communication_bytes
    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import cpu_topology, write_test_plan
    from tests.test_runtime import _assert_matches_single_process

    topology = cpu_topology(tmp_path / "topology.yaml")
    path = write_test_plan(tmp_path, topology, **cells, shard_optimizer=shard, sync=str(sync))
    plan, _ = read_plan(path)
    assert plan.sync == sync and (plan.sync_servers != ()) == (sync == Sync.PARAMETER_SERVER)
    out = tmp_path / "run"
    results = launch(path, LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    kwargs = {k: v for k, v in cells.items() if k != "ring_orders"}
    _assert_matches_single_process(results, out, kwargs, iterations=2, lr=0.05)
    from planner.inputs.model import model_preset, parse_training

    training = parse_training({"global_batch": 6, "micro_batch_size": 1, "precision": "fp32", "optimizer": "sgd",
                               "schedule": "1f1b", "shard_optimizer": shard, "sync": str(sync)})
    predicted = communication_bytes(plan, model_preset("tiny"), training)["data_parallel_bytes_per_iteration"]
    # ZeRO stage 1 pads the flat gradient to equal shards (at most k - 1 values more); torch's
    # collective counts a ring member's 2 (k - 1) / k of each bucket, rounded down
    sent = results["run"]["data_parallel_bytes_per_iteration"]
    assert sent == [pytest.approx(predicted, rel=1e-4 if shard or cells is ONE_HOST else 0)] * 2
    assert results["run"]["optimizer_shards"] == (len(cells["assignment"]) if shard else 1)


def test_plan_file_servers_round_trip_and_mistakes_are_one_line(tmp_path, capsys):
    from planner.io import read_yaml
    from planner.plan.document import plan_from_document, read_plan
    from planner.plan.plan import validate_plan
    from planner.inputs.job import load_topology
    from planner.inputs.model import model_preset, parse_training
    from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan

    topology_path = cpu_topology(tmp_path / "topology.yaml")
    path = write_test_plan(tmp_path, topology_path, **FOUR_REPLICAS, shard_optimizer=False, sync="parameter-server")
    plan, document = read_plan(path)
    assert [entry["server"] for entry in document["stages"]] == [plan.server(0)]
    import json
    from pathlib import Path

    import jsonschema

    root = Path(__file__).resolve().parent.parent
    schema = json.loads((root / "planner" / "schema" / "plan.schema.json").read_text())
    jsonschema.validate(document, schema)
    topology, model = load_topology(topology_path), model_preset("tiny")
    training = parse_training({**document["training"], "sync": "parameter-server"})
    validate_plan(plan, topology, model, training)
    with pytest.raises(InputError, match="training.sync is ring"):
        validate_plan(plan, topology, model, parse_training({**document["training"], "sync": "ring"}))
    wrong = {**document, "stages": [{**document["stages"][0], "server": "a2"}]}
    with pytest.raises(InputError, match=r"stages\[0\].server.*not a device of this stage"):
        plan_from_document(wrong)
    missing = {**document, "stages": [{k: v for k, v in document["stages"][0].items() if k != "server"}]}
    with pytest.raises(InputError, match="stages.server.*needs each stage's server"):
        validate_plan(plan_from_document(missing), topology, model, training)
    # The CLI: an unknown algorithm, and one the job cannot run with, each one line and exit 2.
    for argv in (["--sync", "star"], ["--sync", "parameter-server", "--sync-every", "4"]):
        code, out, err = run_cli([topology_path, "--model", "tiny", "--global-batch", "8", "--time-limit", "1",
                                  *argv], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "sync" in err and "Traceback" not in err
    assert read_yaml(path)["sync"] == "parameter-server"


def test_auto_picks_the_fastest_algorithm_by_the_simulator(tmp_path, capsys):
    from tests.runtime_helpers import cpu_topology, run_cli

    topology_path = cpu_topology(tmp_path / "topology.yaml", cross_host="50Mbps")
    out = tmp_path / "plan.json"
    code, text, err = run_cli([topology_path, "--model", "tiny", "--global-batch", "8", "--time-limit", "20",
                               "--budget", "2", "--sync", "auto", "--replicas", "4", "--stages", "1", "-o", out], capsys)
    assert code == 0, err
    import json

    document = json.loads(out.read_text())
    tried = document["search"]["sync_tried"]
    assert set(tried) == {str(s) for s in Sync}
    assert document["sync"] == min(tried, key=tried.get)
    assert document["prediction"]["iteration_s"] == pytest.approx(min(tried.values()))
    assert "chosen by the search" in text


@pytest.mark.runtime
@pytest.mark.slow
def test_emulated_parameter_server_follows_the_simulator_on_a_slow_link(tmp_path):
    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import cpu_topology, write_test_plan

    seconds = {}
    for sync in (Sync.RING, Sync.PARAMETER_SERVER):
        folder = tmp_path / str(sync)
        folder.mkdir()
        topology = cpu_topology(folder / "topology.yaml", cross_host="20Mbps")
        plan = write_test_plan(folder, topology, assignment=[["a0"], ["a1"], ["b0"]], layer_bounds=[0, 4],
                               micro_batches=[2, 2, 2], micro_batch_size=2, schedule="1f1b", shard_optimizer=False,
                               sync=str(sync))
        results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(folder / "run"),
                                             emulate=True, time_scale=2.0), log=lambda line: None)
        seconds[sync] = (results["comparison"]["measured_s"], results["comparison"]["predicted_s"])
    for measured, predicted in seconds.values():
        assert measured == pytest.approx(predicted, rel=0.25)
    ring, server = seconds[Sync.RING], seconds[Sync.PARAMETER_SERVER]
    assert server[1] != pytest.approx(ring[1], rel=0.05)  # the algorithms differ here, and the run says so
    assert server[0] / ring[0] == pytest.approx(server[1] / ring[1], rel=0.25)


@pytest.mark.parametrize("sync", list(Sync))
def test_search_estimate_charges_each_algorithm_as_the_simulator_does(tmp_path, sync):
    """One stage on four replicas, two per host, hosts behind 1 Gbit/s NICs: the search's estimate
    and the simulator agree for each algorithm, and the algorithms differ."""
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.evaluate import make_context, score_split
    from planner.search.sync_choice import plan_with_sync
    from tests.test_network import _two_rings_topology

    from planner.inputs.model import model_preset

    model = model_preset("gpt3-xl")
    training = parse_training_for(sync)
    topology = _two_rings_topology(tmp_path / "t.yaml", "1Gbps", "100Gbps")
    plan = Plan(layer_bounds=(0, model.layers), assignment=(("a-0",), ("b-0",), ("a-1",), ("b-1",)),
                micro_batches=(2, 2, 2, 2), micro_batch_size=1, schedule="1f1b",
                ring_orders=(tuple(topology.network.ring_order([0, 2, 1, 3])),))  # as the search writes it
    plan = plan_with_sync(plan, topology, sync)
    simulated = predict(plan, topology, model, training)[0].iteration_s
    assign = np.array([[topology.index(d) for d in row] for row in plan.assignment])
    estimate = score_split(make_context(topology, model, training), assign, (model.layers,), (2, 2, 2, 2), 1, "1f1b")
    assert estimate == pytest.approx(simulated, rel=0.05)
    ring = predict(plan_with_sync(plan, topology, Sync.RING), topology, model,
                   parse_training_for(Sync.RING))[0].iteration_s
    assert sync == Sync.RING or simulated != pytest.approx(ring, rel=1e-3)


def parse_training_for(sync):
    from planner.inputs.model import parse_training

    return parse_training({"global_batch": 8, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                           "schedule": "1f1b", "shard_optimizer": False, "sync": str(sync)})


def test_a_parameter_server_can_beat_the_ring_and_the_bound_stays_below_both():
    """Three devices, the third one sending at 1 Gbit/s and receiving at 100: with a parameter server
    it sends n once over its slow links (as a client, or as the server to each), where a ring sends
    2 (k - 1) / k n over one, so ``lower_bound_s`` counts n, not the ring's bytes, when the job may
    use a server."""
    from planner.inputs.model import model_preset, parse_training
    from planner.inputs.topology import parse_topology
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.bounds import lower_bound_s
    from planner.search.sync_choice import plan_with_sync

    topology = parse_topology({"name": "three", "devices": [
        {"name": "a", "count": 2, "type": "A100-80GB", "host": "ha", "region": "r1"},
        {"name": "c", "count": 1, "type": "A100-80GB", "host": "hc", "region": "r2"}],
        "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                    "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "global": {"latency": "1ms", "bandwidth": "100Gbps"},
                    "region_pairs": [{"from": "r2", "to": "r1", "latency": "1ms", "bandwidth": "1Gbps",
                                      "symmetric": False}]}})
    model = model_preset("gpt3-xl")

    def training(sync):
        return parse_training({"global_batch": 3, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                               "schedule": "1f1b", "shard_optimizer": False, "sync": sync})

    plan = Plan(layer_bounds=(0, model.layers), assignment=(("a-0",), ("a-1",), ("c",)), micro_batches=(1, 1, 1),
                micro_batch_size=1, schedule="1f1b")
    server = plan_with_sync(plan, topology, Sync.PARAMETER_SERVER)
    served = predict(server, topology, model, training("parameter-server"))[0].iteration_s
    ring = predict(plan, topology, model, training("ring"))[0].iteration_s
    assert served < ring
    assert lower_bound_s(topology, model, training("ring")) <= ring
    assert lower_bound_s(topology, model, training("parameter-server")) <= served
    assert lower_bound_s(topology, model, training("auto")) <= served
