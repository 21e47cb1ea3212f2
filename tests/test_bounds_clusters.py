"""The lower bound's clusters term (``planner.search.cluster_bound``) on topologies whose devices sit
in hosts and regions joined by slow links: below every random valid plan's simulated time, tight
on a two-cluster case computed by hand, and the clusters it relies on are what it says."""

import numpy as np
import pytest

from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology

_TYPES = ("A100-80GB", "V100-16GB", "T4", "RTX-4090", "L4")


def _clustered_topology(rng):
    """2-3 regions of 1-2 hosts of 1-3 devices of one type each (or of 3-4 hosts of one device):
    fast links in a host, 10-100 Gbit/s in a region, 0.05-2 Gbit/s and 5-80 ms between regions
    (asymmetric region pairs), now and then a shared NIC on a host and a pair entry."""
    devices, hosts = [], []
    homes = rng.random() < 0.3  # one device per host: at the fastest threshold every device alone
    for r in range(int(rng.integers(2, 4))):
        for h in range(int(rng.integers(1, 3)) + 2 * homes):
            host = f"r{r}h{h}"
            hosts.append(host)
            devices.append({"name": host, "count": 1 if homes else int(rng.integers(1, 4)), "host": host,
                            "region": f"r{r}", "type": _TYPES[int(rng.integers(len(_TYPES)))]})
    regions = sorted({d["region"] for d in devices})
    pairs = [{"from": a, "to": b, "latency": f"{rng.uniform(5, 80):.1f}ms",
              "bandwidth": f"{rng.uniform(0.05, 2):.3f}Gbps"} for a in regions for b in regions
             if a != b and rng.random() < 0.6]
    network = {"host": {"latency": "0.01ms", "bandwidth": f"{rng.uniform(100, 2400):.0f}Gbps"},
               "region": {"latency": f"{rng.uniform(0.1, 2):.2f}ms", "bandwidth": f"{rng.uniform(10, 100):.1f}Gbps"},
               "global": {"latency": f"{rng.uniform(5, 80):.1f}ms", "bandwidth": f"{rng.uniform(0.05, 2):.3f}Gbps"},
               "region_pairs": pairs}
    if rng.random() < 0.5:
        network["nics"] = [{"host": hosts[int(rng.integers(len(hosts)))],
                            "egress": str(rng.choice(["0.2Gbps", "5Gbps"])),
                            "ingress": str(rng.choice(["0.3Gbps", "5Gbps"]))}]
    topology = parse_topology({"devices": devices, "network": network}, name="clustered")
    if rng.random() < 0.3:  # one pair entry (a faster or slower direct line)
        names = topology.names
        a, b = rng.choice(len(names), 2, replace=False)
        network["pairs"] = [{"from": names[a], "to": names[b], "latency": "3ms",
                             "bandwidth": f"{rng.uniform(0.1, 50):.2f}Gbps"}]
        topology = parse_topology({"devices": devices, "network": network}, name="clustered")
    return topology


def _random_training(rng):
    sync_every = int(rng.choice([1, 1, 4]))
    gradients = str(rng.choice(["off", "off", "powersgd"])) if sync_every == 1 else "off"
    sync = "ring" if sync_every > 1 or gradients == "powersgd" else str(
        rng.choice(["ring", "auto", "hierarchical", "parameter-server", "sharded"]))
    sharding = sync in ("ring", "sharded") and sync_every == 1 and gradients == "off"
    shard = bool(rng.random() < 0.5) if sharding else False
    document = {"global_batch": int(rng.choice([8, 16])),
                "micro_batch_size": int(rng.choice([1, 2])),
                "schedule": str(rng.choice(["1f1b", "gpipe"])), "precision": "fp16",
                "recompute": bool(rng.random() < 0.5), "compress_messages": str(rng.choice(["off", "int8"])),
                "compress_gradients": gradients, "sync": sync, "sync_every": sync_every, "shard_optimizer": shard}
    if sync_every > 1:
        document["sync_groups"] = "replica"
    return parse_training(document)


def _random_plan(rng, topology, model, training):
    """A random valid plan of random degrees: tensor groups of two where a host has two devices of a
    type, random cells, uneven layer and batch splits, a sync the job allows; None if it does not fit."""
    from planner.plan.sync import syncs_for
    from planner.search.evaluate import Candidate, evaluate_placement, make_context, score_split
    from planner.search.plans import candidate_to_plan
    from planner.search.sync_choice import plan_with_sync

    groups = []
    by_host = {}
    for d in topology.devices:
        by_host.setdefault(d.host, []).append(d.name)
    for names in by_host.values():
        if len(names) >= 2 and rng.random() < 0.5:
            groups.append(tuple(names[:2]))
    ctx = make_context(topology, model, training, tuple(groups))
    n = ctx.topology.size
    stages = int(rng.integers(1, min(model.layers, n) + 1))
    replicas = int(rng.integers(1, n // stages + 1))
    # random cells, or filled region by region replica-major (replicas inside regions, stages
    # across) or stage-major (stages inside regions, replicas across): the crossing cases' edges
    order = rng.permutation(n)
    fill = int(rng.integers(3))
    if fill:
        order = order[np.argsort(ctx.topology.region_ids[order], kind="stable")]
    cells = order[:stages * replicas]
    assign = cells.reshape(replicas, stages) if fill < 2 else cells.reshape(stages, replicas).T
    cuts = np.sort(rng.choice(np.arange(1, model.layers), stages - 1, replace=False)) if stages > 1 else []
    counts = tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [model.layers]])))
    total = training.global_batch // training.micro_batch_size
    if total < replicas:
        return None
    batch_cuts = np.sort(rng.choice(np.arange(1, total), replicas - 1, replace=False)) if replicas > 1 else []
    micro = tuple(int(c) for c in np.diff(np.concatenate([[0], batch_cuts, [total]])))
    if rng.random() < 0.5:  # the estimate's best splits for these cells
        candidate = evaluate_placement(ctx, assign, training.micro_batch_size, training.schedule)
    else:
        score = score_split(ctx, assign, counts, micro, training.micro_batch_size, training.schedule)
        candidate = None if score is None else Candidate(
            assign=assign, layer_counts=counts, micro_batches=micro, micro_batch_size=training.micro_batch_size,
            schedule=training.schedule, score_s=score)
    if candidate is None:
        return None
    plan = candidate_to_plan(ctx, candidate)
    if training.sync == "auto" and replicas > 1:
        allowed = syncs_for(training, replicas)
        plan = plan_with_sync(plan, topology, allowed[int(rng.integers(len(allowed)))])
    return plan


def _fitting_pipelines(rng, count: int, models, training_of=_random_training):
    """(topology, model, training, plan, prediction) of each random plan of two stages or more that
    fits, out of ``count`` drawn: a clustered topology, a model of ``models``, ``training_of(rng)``."""
    from planner.errors import InputError
    from planner.prediction.predict import predict

    for _ in range(count):
        topology, model = _clustered_topology(rng), model_preset(str(rng.choice(models)))
        training = training_of(rng)
        try:
            plan = _random_plan(rng, topology, model, training)
            if plan is None or plan.stages < 2:
                continue
            prediction, _ = predict(plan, topology, model, training)
        except InputError:
            continue
        if prediction.fits:
            yield topology, model, training, plan, prediction


def _checked_plans(seed: int, count: int, bound_of):
    """(bound, predicted iteration) of up to ``count`` random fitting plans on random clustered topologies."""
    from planner.errors import InputError
    from planner.prediction.predict import predict

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        topology = _clustered_topology(rng)
        model = model_preset(str(rng.choice(["small", "gpt3-xl", "gpt3-xl"])))
        try:
            training = _random_training(rng)
            plan = _random_plan(rng, topology, model, training)
            if plan is None:
                continue
            prediction, _ = predict(plan, topology, model, training)
        except InputError:
            continue
        if prediction.fits:
            out.append((bound_of(topology, model, training), prediction.iteration_s, plan))
    return out


@pytest.mark.slow
def test_lower_bound_stays_below_random_plans_on_clustered_topologies():
    """Hosts, regions, slow asymmetric region pairs, shared NICs, pair entries; tensor groups, uneven
    layer and batch splits, int8 messages, PowerSGD, local steps, every sync algorithm, sharded
    optimizer state: the bound on plans of a plan's own degrees (``_pair_bounds_s``, whose least is
    the bound) never exceeds its simulated iteration, and the clusters term binds on some
    topologies (the bound there is above the bound without it)."""
    from planner.search.bounds import _lower_bound_s, _pair_bounds_s, lower_bound_s

    checked = _checked_plans(3, 160, lambda *job: _pair_bounds_s(*job))
    assert len(checked) >= 60
    close = 0
    for pairs, predicted, plan in checked:
        assert plan.stages in pairs, (plan.stages, sorted(pairs))  # a fitting plan's S is never skipped
        bound = pairs[plan.stages][plan.replicas - 1]
        assert bound <= predicted * (1 + 1e-9), (bound, predicted, plan.stages, plan.replicas)
        close += bound > 0.5 * predicted
    assert close >= 10
    tighter = 0
    rng = np.random.default_rng(5)
    for _ in range(30):
        topology, model, training = _clustered_topology(rng), model_preset("small"), _random_training(rng)
        if lower_bound_s(topology, model, training) > _lower_bound_s(topology, model, training, clusters=False) * 1.01:
            tighter += 1
    assert tighter >= 5


def test_clusters_split_only_slow_links():
    """At every threshold, two devices in different clusters are joined by links of at most the
    threshold both ways (NIC caps included) and at least the level's least latency between
    clusters, on the levels' path checked against the dense matrices (the latency: the least one)."""
    from planner.search.link_clusters import least_latency_between
    from planner.search.link_clusters import clusters_at, link_thresholds

    rng = np.random.default_rng(11)
    split = exact = 0
    for _ in range(60):
        network = _clustered_topology(rng).network
        dense = np.array(network.bandwidth_bytes_per_s, dtype=float)
        latency = np.array(network.latency_s, dtype=float)
        host = network.host
        for tau in link_thresholds(network):
            labels = clusters_at(network, tau)
            apart = labels[:, None] != labels[None, :]
            assert not (apart & (host[:, None] == host[None, :])).any()
            assert (dense[apart] <= tau).all() and (dense.T[apart] <= tau).all()
            if apart.any():
                split += 1
                least = least_latency_between(network, labels)
                assert least <= latency[apart].min()
                exact += least == latency[apart].min()
    assert split >= 30 and exact >= 0.8 * split


def test_two_clusters_bound_is_the_batch_over_the_slow_link():
    """Two regions joined at 10 Mbit/s: two devices in one, a third in the other, each holding at
    most a third of the model, so every plan pipelines over three stages across the slow link; the
    bound is the whole batch's activations over it and the last one's gradient back,
    ``(B + 1) s h 2 / tau`` (0.22 s here; ``planner.search.crossing_pipe``, whose blocks' compute on
    the fastest cell adds 4 us), where without the clusters term it is the fastest link's (100
    Gbit/s) and the compute's."""
    from planner.search.bounds import _lower_bound_s, lower_bound_s

    model = model_preset("small")  # 8 blocks, hidden 128
    training = parse_training({"global_batch": 16, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp16",
                               "recompute": False, "shard_optimizer": False})
    # the model's 1,660,160 parameters at 16 bytes of fp16 weights, gradients and Adam state: 26.6 MB,
    # so a device of 10.5 MB holds a third of it but not half
    devices = [{"name": "x", "count": 2, "type": "A100-80GB", "region": "x", "memory": "10.6MB",
                "memory_reserved": "0.1MB"},
               {"name": "y", "type": "A100-80GB", "region": "y", "memory": "10.6MB", "memory_reserved": "0.1MB"}]
    network = {"region": {"latency": "0ms", "bandwidth": "100Gbps"},
               "global": {"latency": "0ms", "bandwidth": "0.01Gbps"}}
    topology = parse_topology({"devices": devices, "network": network}, name="two")
    tau = 0.01e9 / 8
    expected = (training.global_batch + 1) * model.sequence * model.hidden * 2 / tau
    assert expected <= lower_bound_s(topology, model, training) <= expected + 1e-5
    assert _lower_bound_s(topology, model, training, clusters=False) < expected / 10


def test_bound_below_and_near_a_plan_whose_stages_all_cross():
    """Two regions of two T4s joined at 1 Gbit/s, a two-block model, one replica in each region:
    both stages cross, each syncing half the model over the slow link after half the compute. The
    bound stays below the simulated plan and within 25% of it (the deepest stage's share ``A / 2``
    of the whole model's sync and compute, case (ii)), where without the clusters term it is 41%
    below. Counting the whole model's ``A`` for a crossing stage instead (no fraction) would put the
    bound above this plan."""
    from planner.inputs.model import parse_model
    from planner.prediction.predict import predict
    from planner.search.bounds import _lower_bound_s, lower_bound_s
    from planner.search.evaluate import Candidate, make_context, score_split
    from planner.search.plans import candidate_to_plan

    model = parse_model({"layers": 2, "hidden": 256, "heads": 4, "sequence": 2048, "vocabulary": 256})
    training = parse_training({"global_batch": 64, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp16",
                               "recompute": False, "shard_optimizer": False, "sync": "ring"})
    devices = [{"name": "x", "count": 2, "type": "T4", "region": "x"},
               {"name": "y", "count": 2, "type": "T4", "region": "y"}]
    network = {"region": {"latency": "0ms", "bandwidth": "100Gbps"}, "global": {"latency": "0ms", "bandwidth": "1Gbps"}}
    topology = parse_topology({"devices": devices, "network": network}, name="two")
    ctx = make_context(topology, model, training)
    names = topology.names
    assign = np.array([[names.index("x-0"), names.index("x-1")], [names.index("y-0"), names.index("y-1")]])
    counts, micro = (1, 1), (32, 32)
    score = score_split(ctx, assign, counts, micro, 1, "1f1b")
    plan = candidate_to_plan(ctx, Candidate(assign=assign, layer_counts=counts, micro_batches=micro,
                                            micro_batch_size=1, schedule="1f1b", score_s=score))
    predicted = predict(plan, topology, model, training)[0].iteration_s
    bound = lower_bound_s(topology, model, training)
    assert 0.75 * predicted <= bound <= predicted
    assert _lower_bound_s(topology, model, training, clusters=False) < 0.6 * predicted


def test_a_host_behind_a_slow_nic_is_a_cluster_of_its_own():
    """One region at 10 Gbit/s; host b's shared NIC passes 0.2 Gbit/s each way: at 0.2 Gbit/s, b
    stands alone and host a's two devices stay together; at 0.1 Gbit/s all join."""
    from planner.search.link_clusters import clusters_at

    topology = parse_topology({"devices": [{"name": "a", "count": 2, "type": "T4", "host": "a"},
                                           {"name": "b", "type": "T4", "host": "b"}],
                               "network": {"host": {"latency": "0ms", "bandwidth": "100Gbps"},
                                           "region": {"latency": "1ms", "bandwidth": "10Gbps"},
                                           "nics": [{"host": "b", "egress": "0.2Gbps", "ingress": "0.2Gbps"}]}},
                              name="nic")
    labels = clusters_at(topology.network, 0.2e9 / 8)
    assert labels[0] == labels[1] != labels[2]
    assert len(set(clusters_at(topology.network, 0.1e9 / 8).tolist())) == 1


def test_heaviest_stage_is_the_best_split_of_whole_blocks_with_the_head_last():
    """``_heaviest_stage_flops`` against every split of L blocks over S stages of one block or
    more, the head on the last: the least heaviest stage (DTFM's GPT-3 XL, 24 blocks, 8 stages,
    a head of 1.5 blocks: 4 blocks, where the even share is 3.19)."""
    import itertools

    from planner.search.bounds import _heaviest_stage_flops

    def brute(layers, stages, w, h):
        best = float("inf")
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            counts = np.diff((0, *cuts, layers))
            best = min(best, max(max(counts[:-1] * w, default=0.0), counts[-1] * w + h))
        return best

    assert _heaviest_stage_flops(24, 8, 1.0, 1.5, False) == 4.0
    for layers, stages, h in ((6, 3, 0.4), (7, 2, 2.5), (8, 4, 0.0), (9, 1, 1.0), (5, 5, 3.0)):
        assert _heaviest_stage_flops(layers, stages, 1.0, h, False) == pytest.approx(brute(layers, stages, 1.0, h))
        assert _heaviest_stage_flops(layers, stages, 1.0, h, True) <= brute(layers, stages, 1.0, h)


def test_four_homes_two_by_two_is_near_its_pair_bound():
    """Four RTX 4090s in four homes on 0.5 Gbit/s lines, GPT-3 XL, 8 sequences: a 2 x 2 plan syncs
    each half of the model between two homes. The bound on 2 x 2 plans is within 20% of the
    plan's simulated time, and below it."""
    from planner.prediction.predict import predict
    from planner.search.bounds import _pair_bounds_s
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    model = model_preset("gpt3-xl")
    training = parse_training({"global_batch": 8, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp16",
                               "recompute": True, "shard_optimizer": False, "sync": "ring"})
    topology = parse_topology({"devices": [{"name": "home", "count": 4, "type": "RTX-4090", "region": "city"}],
                               "network": {"region": {"latency": "5ms", "bandwidth": "0.5Gbps"}}}, name="homes")
    ctx = make_context(topology, model, training)
    candidate = evaluate_placement(ctx, np.arange(4).reshape(2, 2), 1, "1f1b")
    predicted = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0].iteration_s
    bound = _pair_bounds_s(topology, model, training)[2][1]
    assert 0.8 * predicted <= bound <= predicted


@pytest.mark.parametrize("name", ["hetero/home-consumer-gpus", "dtfm/case3-multi-datacenter",
                                  "emulated/dtfm-case5-mini", "emulated/home-mini"])
def test_pair_bounds_stay_below_random_plans_on_shipped_topologies(name):
    """Where the clusters term raised the bound most, random placements of random degrees (the
    estimate's splits) never simulate below the bound on plans of their degrees."""
    from dataclasses import replace
    from pathlib import Path

    from planner.inputs.job import load_job
    from planner.prediction.predict import predict
    from planner.search.bounds import _pair_bounds_s
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    job = load_job(Path(__file__).resolve().parent.parent / "topologies" / f"{name}.yaml")
    training = replace(job.training, recompute=True, schedule="1f1b",
                       micro_batch_size=job.training.micro_batch_size or 1)
    pairs = _pair_bounds_s(job.topology, job.model, training)
    ctx = make_context(job.topology, job.model, training)
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(12):
        stages = int(rng.integers(2, 7))
        replicas = int(rng.integers(1, job.topology.size // stages + 1))
        assign = rng.permutation(job.topology.size)[:stages * replicas].reshape(replicas, stages)
        candidate = evaluate_placement(ctx, assign, training.micro_batch_size, training.schedule)
        if candidate is None:
            continue
        prediction = predict(candidate_to_plan(ctx, candidate), job.topology, job.model, training)[0]
        if prediction.fits:
            assert pairs[stages][replicas - 1] <= prediction.iteration_s
            checked += 1
    assert checked >= 6


def pair_bound_and_pinned_plan_s(path, stages: int, replicas: int, seed: int) -> tuple:
    """(the bound of ``stages`` x ``replicas`` on the job at ``path``, the simulated time of the plan a
    search pinned to that pair finds): a term that lifts the pair must leave the plan above it."""
    from planner.inputs.job import load_job
    from planner.search import bounds
    from planner.search.front import SearchOptions, search

    job = load_job(path)
    bound = float(bounds._pair_bounds_s(job.topology, job.model, job.training)[stages][replicas - 1])
    result = search(job.topology, job.model, job.training,
                    SearchOptions(seed=seed, budget_s=1.0, time_limit_s=60.0, stages=stages, replicas=replicas))
    return bound, result.objective_s


def assert_random_plans_above_their_pair_bounds(seed: int, tries: int, least: int = 30) -> None:
    """``_checked_plans(seed, tries)`` against the whole pair bounds (``bounds._pair_bounds_s``): at
    least ``least`` plans checked, none simulated below its pair's bound."""
    import planner.search.bounds as bounds

    checked = _checked_plans(seed, tries, lambda topology, model, training: bounds._pair_bounds_s(topology, model,
                                                                                                training))
    assert len(checked) >= least
    for pairs, predicted, plan in checked:
        bound = pairs[plan.stages][plan.replicas - 1]
        assert bound <= predicted * (1 + 1e-9), (bound, predicted, plan.stages, plan.replicas)


def test_the_cases_recorded_for_a_reader_leave_every_bound_as_it_is():
    # bounds._pair_bounds_s(cases=...) hands cluster_bound a dict per stage count and clustering level
    # (benchmarks/generated_layouts.py prints it): the table is the same with and without it, and each
    # level's cases are recorded, one value per replica count, none above what the bound took.
    import numpy as np

    from conftest import ROOT

    from planner.inputs.job import load_job
    from planner.search import bounds

    job = load_job(ROOT / "topologies" / "dtfm" / "case5-worldwide.yaml")
    training = job.training
    plain = bounds._pair_bounds_s(job.topology, job.model, training)
    cases = {}
    recorded = bounds._pair_bounds_s(job.topology, job.model, training, cases=cases)
    assert plain.keys() == recorded.keys()
    assert all(np.array_equal(plain[s], recorded[s]) for s in plain)
    assert cases and {s for s, _ in cases} == set(plain)
    for (stages, _), parts in cases.items():
        assert {"inside", "(i)", "(ii)", "(iii)", "throughput"} <= set(parts)
        assert all(np.shape(v) == plain[stages].shape for v in parts.values())
        least = np.minimum(parts["inside"], np.minimum.reduce([parts["(i)"], parts["(ii)"], parts["(iii)"]]))
        assert np.all(plain[stages] >= least - 1e-12)
        assert np.all(plain[stages] >= parts["throughput"] - 1e-12)
