"""The plan syncs each stage in the order the search's estimate timed, for every algorithm.

``plans.plan_ring`` keeps the estimate's ring (``evaluate.ring_cost``) unless the 2-opt ring is
no slower per byte and no longer in latency; a parameter server is chosen among equal ones in the
estimate's order (``sync_choice.plan_with_sync``). Before, the plan's 2-opt ring on the replicas'
order could be slower than the estimate's (seed 26 below: the estimate 5.0% under the simulation)
or leave a host twice, holding its shared NIC twice as long as the estimate's ring (seed 39: 12.2%
under), and an equal server on another host could queue behind the pipeline's messages (seed 15:
22.6% over)."""

import pytest

from benchmarks.estimate_syncs import instance
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.evaluate import evaluate_placement, make_context, ring_cost, timed_ring
from planner.search.plans import candidate_to_plan


def _instance(seed: int):
    """``benchmarks/estimate_syncs.py``'s instance ``seed``: (topology, assignment)."""
    document, assign = instance(seed)
    return parse_topology(document, name="random"), assign


def _estimate_and_simulation(seed: int, sync: str):
    topology, assign = _instance(seed)
    model = model_preset("gpt3-xl")
    training = parse_training({"global_batch": 8 * assign.shape[0], "micro_batch_size": 1, "precision": "bf16",
                               "sync": sync, "shard_optimizer": False})
    ctx = make_context(topology, model, training)
    candidate = evaluate_placement(ctx, assign, 1, "1f1b")
    plan = candidate_to_plan(ctx, candidate)
    return ctx, assign, plan, candidate.score_s, predict(plan, topology, model, training)[0].iteration_s


@pytest.mark.parametrize("seed,sync,within", [(26, "ring", 1e-9), (39, "ring", 3e-3), (15, "parameter-server", 1e-3),
                                              (61, "ring", 0.012), (58, "parameter-server", 1e-3)])
def test_estimate_equals_the_simulation(seed, sync, within):
    """(Seed 15's estimate lies 0.06% under the simulation of the same servers, seed 39's 0.13%; seed
    61's 1.0% under, on shared NICs, where the estimate's ring had no 2-opt: 8.8% over, the plan
    syncing in a faster 2-opt ring than the one timed; seed 58's 0.03% under, its stages' equal
    servers on two hosts: on one, its NIC queued the syncs, 9.2% under, 4.784 s simulated.)"""
    _, _, _, estimate, simulated = _estimate_and_simulation(seed, sync)
    assert estimate == pytest.approx(simulated, rel=within)


@pytest.mark.parametrize("seed", [*range(8), 26, 39])
def test_plan_ring_never_slower_than_the_estimate(seed):
    ctx, assign, plan, estimate, simulated = _estimate_and_simulation(seed, "ring")
    for s in range(assign.shape[1]):
        devices = [ctx.topology.index(plan.assignment[r][s]) for r in plan.ring_orders[s]]
        per_byte, latency = ctx.network.ring_cost(devices)
        timed_per_byte, timed_latency = ring_cost(ctx, assign[:, s])
        assert per_byte <= timed_per_byte + 1e-18 and latency <= timed_latency + 1e-12
        timed_nics = dict(ctx.network.ring_nic_rates(timed_ring(ctx, tuple(sorted(assign[:, s].tolist())))))
        assert all(rate <= timed_nics[nic] for nic, rate in ctx.network.ring_nic_rates(devices))
    assert simulated <= estimate * (1 + 0.05)


@pytest.mark.parametrize("seed", range(12))
def test_two_opt_prices_many_rings_as_the_network_prices_one(seed):
    """``Network.ring_hops`` of many rings at once (the vectorised 2-opt's neighbours) gives each
    ring what it gives that ring alone, shared NICs split among the hops through them included."""
    import numpy as np

    topology, _ = _instance(seed)
    network = topology.network
    rng = np.random.default_rng(seed)
    rings = np.array([rng.permutation(network.size)[:min(10, network.size)] for _ in range(5)])
    latency, bandwidth = network.ring_hops(rings)
    alone = [network.ring_hops(ring) for ring in rings]
    assert np.allclose(latency, [hops[0] for hops in alone]) and np.allclose(bandwidth, [hops[1] for hops in alone])


def test_equal_servers_spread_over_hosts():
    """Two stages whose fastest servers both include a device of host 0: the second takes its equal
    server on another host; where it has none, the same host; a stage's own order decides first."""
    import numpy as np

    from cost_models.network import Network

    n = 6  # devices 0, 1 on host 0; 2, 3 on host 1; 4, 5 on host 2
    network = Network(link_latency_s=np.full((n, n), 1e-3), link_bandwidth_bytes_per_s=np.full((n, n), 1e9),
                      host=np.repeat([0, 1, 2], 2), nic_egress_bytes_per_s=np.full(3, np.inf),
                      nic_ingress_bytes_per_s=np.full(3, np.inf))
    assert network.fastest_servers([0, 2, 4]) == [0, 2, 4]  # every link alike: all equal
    assert network.spread_servers([[0, 2], [1, 3], [1]]) == [0, 3, 1]
    assert network.spread_servers([[2, 0], [1, 3]]) == [2, 1]


def test_local_steps_in_sync_groups_sync_in_the_timed_ring():
    """Local steps in the regions' sync groups: the groups' inner rings and the leads' ring are parts
    of the stage's ring, so the plan keeps exactly the ring the estimate timed them in (seed 59: the
    2-opt ring on the replicas' order simulated 3.054 s against the estimate's 2.176 s before)."""
    from planner.search.group_choice import with_asked_groups

    topology, assign = _instance(59)
    model = model_preset("gpt3-xl")
    training = parse_training({"global_batch": 8 * assign.shape[0], "micro_batch_size": 1, "precision": "bf16",
                               "sync": "ring", "shard_optimizer": False, "sync_every": 4, "sync_groups": "cluster"})
    ctx = make_context(topology, model, training)
    candidate = evaluate_placement(ctx, assign, 1, "1f1b")
    plan = with_asked_groups(candidate_to_plan(ctx, candidate), topology, training)
    assert len(plan.sync_groups) > 1
    assert predict(plan, topology, model, training)[0].iteration_s == pytest.approx(candidate.score_s, rel=1e-9)


def test_replanned_parameter_servers_are_chosen_again():
    """Re-planning that drops a replica (``replan._drop_rows``) chooses each stage's parameter server
    again among the replicas left: the old indices pointed one past the end (seed 2: servers 0, 4, 0
    of 5 replicas; without replica 0 there are 4)."""
    from planner.plan.plan import validate_plan
    from planner.search.replan import _drop_rows, _with_topology

    topology, assign = _instance(2)
    model = model_preset("gpt3-xl")
    training = parse_training({"global_batch": 8 * assign.shape[0], "micro_batch_size": 1, "precision": "bf16",
                               "sync": "parameter-server", "shard_optimizer": False})
    ctx = make_context(topology, model, training)
    plan = candidate_to_plan(ctx, evaluate_placement(ctx, assign, 1, "1f1b"))
    assert plan.replicas - 1 in plan.sync_servers
    dropped = _with_topology(plan, topology, **_drop_rows(plan, {0}))
    assert dropped.replicas == plan.replicas - 1 and max(dropped.sync_servers) < dropped.replicas
    validate_plan(dropped, topology, model, training)
