"""Local steps in sync groups (``planner.plan.sync_groups``): gradients all-reduced every iteration
inside a group, parameter deltas averaged across groups every ``sync_every``; the plan file, the
cost model, the search's choice and the runtime."""

import dataclasses

import numpy as np
import pytest

from cost_models.network import Sync
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.inputs.model import model_preset, parse_training
from planner.plan.dims import Schedule
from planner.plan.document import plan_from_document, plan_to_document
from planner.plan.plan import Plan, validate_plan
from planner.plan.sync_groups import (cluster_groups, grouped_sync, grouped_sync_bytes, grouping, kept_groups,
                                      outer_weights, sync_groups_problem)
from planner.prediction.predict import communication_bytes, predict
from planner.prediction.stage_model import layer_costs, stage_parameters


# -- the groups and their costs by hand -----------------------------------------------------------
def test_cluster_groups_join_replicas_whose_stages_share_regions():
    regions = np.array([0, 0, 1, 1, 0, 1])  # devices 0..5
    assert cluster_groups(regions, [[0, 2], [1, 3], [4, 5], [2, 0]]) == ((0, 1, 2), (3,))
    assert grouping("replica", 4, regions, [[0], [1], [2], [3]]) == ()
    assert grouping("cluster", 3, regions, [[0], [2], [4]]) == ((0, 2), (1,))
    assert grouping("cluster", 2, regions, [[0], [2]]) == ()  # every replica alone: written as none
    assert grouping("one", 3, regions, [[0], [2], [4]]) == ((0, 1, 2),)
    # a re-plan that drops replicas keeps the rest of their groups, renumbered
    assert kept_groups(((0, 1), (2, 3, 4)), [0, 2, 4]) == ((0,), (1, 2))
    assert kept_groups(((0, 1), (2, 3)), [0, 2]) == ()


@pytest.mark.parametrize("groups, H, sync, shard, fragment", [
    (((0, 1), (1, 2)), 4, "ring", False, "not a partition"),
    (((0, 1),), 4, "ring", False, "not a partition"),  # replica 2 missing
    (((0, 1), (2,)), 1, "ring", False, "sync_every is 1"),
    (((0, 1), (2,)), 4, "sharded", False, "set sync ring"),
    (((0, 1), (2,)), 4, "ring", True, "shard_optimizer"),
])
def test_sync_groups_problems_are_one_line(groups, H, sync, shard, fragment):
    problem = sync_groups_problem(groups, 3, H, sync, shard)
    assert fragment in problem and "\n" not in problem
    assert sync_groups_problem(((0, 2), (1,)), 3, 4, "ring", "auto") is None


def test_grouped_sync_charges_the_groups_every_iteration_and_the_leads_every_h(job):
    network = job.topology.network
    devices = [job.topology.index(d) for d in ("slow-0", "slow-1", "fast-0", "fast-1")]
    n, H = 1e8, 4
    seconds, holds = grouped_sync(network, devices, [0, 1, 2, 3], ((0, 1), (2, 3)), n, H)
    inner = [network.sync_s(Sync.RING, n, devices[:2]), network.sync_s(Sync.RING, n, devices[2:])]
    outer = network.sync_s(Sync.RING, n, [devices[0], devices[2]])  # the leads' ring
    assert seconds == pytest.approx(max(inner) * (1 + 1 / H) + outer / H, rel=1e-12)
    assert all(busy <= seconds * (1 + 1e-12) for _, busy in holds)
    alone, _ = grouped_sync(network, devices, [0, 1, 2, 3], tuple((r,) for r in range(4)), n, H)
    assert alone == pytest.approx(network.sync_s(Sync.RING, n, devices) / H, rel=1e-12)  # today's local steps
    one, _ = grouped_sync(network, devices, [0, 1, 2, 3], ((0, 1, 2, 3),), n, H)
    assert one == pytest.approx(network.sync_s(Sync.RING, n, devices), rel=1e-12)  # nothing across, no broadcast
    within, across = grouped_sync_bytes(((0, 1), (2, 3)), n, H)
    assert (within, across) == (pytest.approx(2 * 2 * n * (1 + 1 / H)), pytest.approx(2 * n / H))


# -- plan file and validation ---------------------------------------------------------------------
@pytest.fixture
def job(write_yaml):
    from conftest import small_topology

    return load_job(write_yaml(small_topology()))


def _four(job, groups=(), H=4) -> tuple:
    training = dataclasses.replace(job.training, precision="fp16", shard_optimizer=False, global_batch=16,
                                   sync_every=H)
    plan = Plan(layer_bounds=(0, job.model.layers), assignment=(("slow-0",), ("slow-1",), ("fast-0",), ("fast-1",)),
                micro_batches=(4, 4, 4, 4), micro_batch_size=1, schedule=Schedule.ONE_F_ONE_B, sync_every=H,
                sync_groups=groups, topology_name=job.topology.name, topology_sha256=job.topology.sha256)
    return plan, training


def test_plan_file_keeps_sync_groups_and_validate_refuses_bad_ones(job):
    plan, training = _four(job, ((0, 1), (2, 3)))
    validate_plan(plan, job.topology, job.model, training)
    document = plan_to_document(plan, model=job.model, training=training)
    assert document["sync_groups"] == [[0, 1], [2, 3]]
    assert plan_from_document(document).sync_groups == ((0, 1), (2, 3))
    assert "sync_groups" not in plan_to_document(dataclasses.replace(plan, sync_groups=()))
    for bad in (((0, 1), (1, 2, 3)), ((0, 1), (2, 4))):
        with pytest.raises(InputError) as caught:
            validate_plan(dataclasses.replace(plan, sync_groups=bad), job.topology, job.model, training)
        assert caught.value.field == "sync_groups"
    with pytest.raises(InputError) as caught:  # groups with H = 1
        one, t = _four(job, ((0, 1), (2, 3)), H=1)
        validate_plan(one, job.topology, job.model, t)
    assert caught.value.field == "sync_groups"
    with pytest.raises(InputError) as caught:  # not a list of whole numbers
        plan_from_document({**document, "sync_groups": [[0, "one"]]})
    assert caught.value.field == "sync_groups[0]"


# -- cost model -----------------------------------------------------------------------------------
def test_prediction_and_bytes_of_groups(job):
    alone, training = _four(job)
    grouped, _ = _four(job, ((0, 1), (2, 3)))
    singles, _ = _four(job, tuple((r,) for r in range(4)))
    p = {k: predict(plan, job.topology, job.model, training)[0] for k, plan in
         (("alone", alone), ("grouped", grouped), ("singles", singles))}
    assert p["singles"].iteration_s == pytest.approx(p["alone"].iteration_s, rel=1e-12)
    costs = layer_costs(job.model, training, 1, 1, 4)
    n = 2.0 * float(stage_parameters(costs, job.model.layers, 0))  # fp16 deltas
    devices = [job.topology.index(d) for d in ("slow-0", "slow-1", "fast-0", "fast-1")]
    expected = grouped_sync(job.topology.network, devices, [0, 1, 2, 3], ((0, 1), (2, 3)), n, 4)[0]
    assert p["grouped"].breakdown_s["gradient_sync_s"] == pytest.approx(expected, rel=1e-9)
    sent = communication_bytes(grouped, job.model, training)
    tokens = 16 * job.model.sequence
    assert sent["within_groups_bytes_per_token"] == pytest.approx(2 * 2 * n * 1.25 / tokens)
    assert sent["across_groups_bytes_per_token"] == pytest.approx(2 * n / 4 / tokens)
    assert communication_bytes(singles, job.model, training)["data_parallel_bytes_per_iteration"] == \
        pytest.approx(communication_bytes(alone, job.model, training)["data_parallel_bytes_per_iteration"])


# -- search and command line ----------------------------------------------------------------------
def test_search_chooses_groups_by_the_simulator_or_as_asked(job):
    from planner.search.front import SearchOptions, search
    from planner.search.group_choice import plan_with_groups

    training = dataclasses.replace(job.training, sync_every=4)
    result = search(job.topology, job.model, training, SearchOptions(seed=0, time_limit_s=2, replicas=2))
    tried = result.plan.search["sync_groups_tried"]
    assert set(tried) <= {"replica", "cluster", "one"} and "replica" in tried
    best = min(tried, key=tried.get)
    assert result.plan.sync_groups == plan_with_groups(result.plan, job.topology, best).sync_groups
    assert result.predicted_s == pytest.approx(tried[best])
    one = search(job.topology, job.model, dataclasses.replace(training, sync_groups="one"),
                 SearchOptions(seed=0, time_limit_s=2, replicas=2))
    assert one.plan.sync_groups == ((0, 1),) and "sync_groups_tried" not in one.plan.search
    validate_plan(one.plan, job.topology, job.model, one.training)


def _two_clusters(write_yaml):
    """Two regions of 4 A100s each (100 Gbps inside) joined by a 3 Gbps, 50 ms link; GPT-3 XL, local
    steps every 4 iterations."""
    return load_job(write_yaml({
        "name": "two-clusters",
        "devices": [{"name": "a", "count": 4, "type": "A100-80GB", "region": "east"},
                    {"name": "b", "count": 4, "type": "A100-80GB", "region": "west"}],
        "network": {"region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "global": {"latency": "50ms", "bandwidth": "3Gbps"}},
        "model": "gpt3-xl",
        "training": {"global_batch": 128, "micro_batch_size": 1, "schedule": "1f1b", "precision": "bf16",
                     "sync_every": 4},
    }))


def _estimate_s(result, job) -> float:
    """The search's estimate (``score_split``) of the returned plan."""
    from planner.search.evaluate import make_context, score_split

    plan = result.plan
    ctx = make_context(job.topology, job.model, result.training, plan.tensor_groups)
    assign = np.array([[ctx.topology.index(d) for d in row] for row in plan.assignment])
    counts = tuple(b - a for a, b in zip(plan.layer_bounds, plan.layer_bounds[1:]))
    return score_split(ctx, assign, counts, plan.micro_batches, plan.micro_batch_size, plan.schedule)


def test_search_places_for_the_groups_asked_for(write_yaml):
    from planner.search.front import SearchOptions, search
    from planner.search.group_choice import plan_with_groups

    job = _two_clusters(write_yaml)
    found = {kind: search(job.topology, job.model, dataclasses.replace(job.training, sync_groups=kind),
                          SearchOptions(seed=0, budget_s=2, replicas=4)) for kind in ("cluster", "one")}
    assert found["cluster"].plan.sync_groups == ((0, 1), (2, 3))  # a group per region
    assert found["one"].plan.sync_groups == ((0, 1, 2, 3),)
    for kind, result in found.items():  # the estimate charges the groups as the simulator does
        assert _estimate_s(result, job) == pytest.approx(result.predicted_s, rel=1e-3), kind
        # CP-SAT times one ring over all replicas: its candidates count, its bounds prove nothing here
        assert result.exact_shapes and all(e["bound_s"] is None for e in result.exact_shapes), kind
    # One group syncs every iteration: across the slow link it costs more than it saves, so its
    # replicas stay in one region; by cluster they span both (the leads cross once every 4).
    regions = {kind: {job.topology.devices[job.topology.index(d)].region for row in r.plan.assignment for d in row}
               for kind, r in found.items()}
    assert regions == {"cluster": {"east", "west"}, "one": {"east"}}
    spanning = plan_with_groups(found["cluster"].plan, job.topology, "one")
    slower = predict(spanning, job.topology, job.model, found["one"].training)[0].iteration_s
    assert found["one"].predicted_s < 0.6 * slower


def test_auto_groups_are_simulated_only_within_the_work_and_the_time_the_search_left(job, monkeypatch):
    """Each grouping besides the plan's own costs one simulation of the plan's work: none when no
    work is left (the plan's own grouping stands, the others listed untried), all with enough; a
    clock past the limit leaves them untried too, and says the clock did."""
    from planner.search import group_choice
    from planner.search.deadline import plan_simulation_s
    from planner.search.front import SearchOptions, search

    training = dataclasses.replace(job.training, sync_every=4)
    plan = search(job.topology, job.model, training, SearchOptions(seed=0, time_limit_s=2, replicas=2)).plan
    own = group_choice.plan_with_groups(plan, job.topology, "replica")
    own = own.with_prediction(predict(own, job.topology, job.model, training)[0])
    distinct = {}  # each grouping that differs from those before it
    for kind in ("replica", "cluster", "one"):
        distinct.setdefault(group_choice.plan_with_groups(own, job.topology, kind).sync_groups, kind)
    others = set(distinct.values()) - {"replica"}
    assert others  # the fixture's two replicas sit in two regions: "one" differs from every replica alone
    calls = []
    monkeypatch.setattr(group_choice, "predict", lambda *a, **k: calls.append(a[0].sync_groups) or predict(*a, **k))
    starved = group_choice.choose_sync_groups(own, job.topology, job.model, training, work_s=0.0)
    assert starved.plan is own and set(starved.tried) == {"replica"} and set(starved.untried) == others
    assert not starved.clock_cut and calls == []
    late = group_choice.choose_sync_groups(own, job.topology, job.model, training, deadline=0.0)
    assert set(late.untried) == others and late.clock_cut and calls == []
    full = group_choice.choose_sync_groups(own, job.topology, job.model, training,
                                           work_s=len(others) * plan_simulation_s(own))
    assert set(full.tried) == {"replica"} | others and full.untried == () and len(calls) == len(others)


def test_cli_refuses_a_bad_sync_groups_in_one_line(write_yaml, capsys):
    from conftest import small_topology
    from planner.cli import main

    assert main([str(write_yaml(small_topology())), "--sync-every", "4", "--sync-groups", "region"]) == 2
    err = capsys.readouterr().err.strip()
    assert "field '--sync-groups'" in err and len(err.splitlines()) == 1


def test_report_says_which_replicas_sync_every_step(job):
    from planner.report.text import render_plan

    plan, training = _four(job, ((0, 1), (2, 3)))
    plan = plan.with_prediction(predict(plan, job.topology, job.model, training)[0])
    text = render_plan(plan, job.topology, job.model, training)
    assert "Sync groups" in text and "replicas 0, 1" in text and "This changes the optimisation" in text
    assert "within groups" in text and "across groups" in text and "stage 0: slow-0 slow-1" in text
    assert "replicas 0, 1 (delta weight 0.5)" in text  # 8 of the 16 micro-batches
    alone, _ = _four(job)
    alone = dataclasses.replace(alone, search={"sync_groups_tried": {"replica": 1.0, "cluster": 2.0}})
    alone = alone.with_prediction(predict(alone, job.topology, job.model, training)[0])
    text = render_plan(alone, job.topology, job.model, training)
    assert "Sync groups: none, every replica alone (chosen by the search: fastest of replica 1 s, cluster 2 s)" in text


def test_token_weights_make_one_inner_step_synchronous_training():
    import torch

    from planner.runtime.local_steps import outer_nesterov_step

    generator = torch.Generator().manual_seed(0)
    start, x, y = (torch.randn(*shape, generator=generator) for shape in ((5,), (6, 5), (6,)))
    micro_batches, groups, lr = (1, 1, 4), ((0, 1), (2,)), 0.1  # a row per micro-batch; groups of 2 and 4 rows

    def step(rows):  # one SGD step on the mean squared error over ``rows``: the delta snapshot - new
        w = start.clone().requires_grad_(True)
        ((x[rows] @ w - y[rows]) ** 2).mean().backward()
        return lr * w.grad

    weights = outer_weights(groups, micro_batches)
    assert weights == pytest.approx((2 / 6, 4 / 6))  # by tokens; by replica count it would be 2/3, 1/3
    assert outer_weights((), micro_batches) == pytest.approx((1 / 6, 1 / 6, 4 / 6))
    deltas = [step(list(range(0, 2))), step(list(range(2, 6)))]
    mean = sum(w * d for w, d in zip(weights, deltas))
    new = outer_nesterov_step([start], [mean], [torch.zeros(5)], learning_rate=1.0, momentum_factor=0.0)[0]
    assert torch.allclose(new, start - step(list(range(6))), atol=1e-6)  # H = 1: the whole batch's step


# -- runtime (CPU, gloo, fp32) --------------------------------------------------------------------
def _grouped_plan(folder, groups, micro_batches=(2, 1, 1, 2), sync_every=2):
    """4 replicas x 1 stage of the tiny model on CPU devices a0 a1 (host a) b0 b1 (host b), SGD, fp32."""
    from planner.inputs.topology import parse_topology
    from planner.io import read_yaml
    from planner.plan.document import write_plan
    from tests.runtime_helpers import cpu_topology

    model = model_preset("tiny")
    topology_path = cpu_topology(folder / "topology.yaml")
    topology = parse_topology(read_yaml(topology_path), name="cpu-six")
    training = parse_training({"global_batch": sum(micro_batches), "micro_batch_size": 1, "precision": "fp32",
                               "optimizer": "sgd", "schedule": "1f1b", "shard_optimizer": "auto",
                               "sync_every": sync_every})
    assignment = (("a0",), ("a1",), ("b0",), ("b1",))
    plan = Plan(layer_bounds=(0, model.layers), assignment=assignment, micro_batches=tuple(micro_batches),
                micro_batch_size=1, schedule=Schedule.ONE_F_ONE_B, topology_name=topology.name,
                topology_sha256=topology.sha256, sync_every=sync_every, sync_groups=groups,
                idle=tuple(d.name for d in topology.devices if d.name not in {"a0", "a1", "b0", "b1"}))
    validate_plan(plan, topology, model, training)
    path = folder / "plan.yaml"
    write_plan(plan_to_document(plan, model=model, training=training, topology_source=str(topology_path)), path)
    return path, plan, model, training


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("groups, workers", [
    (((0, 1), (2, 3)), (3, 3)),  # each group one DiLoCo worker on its replicas' combined rows
    (((0,), (1,), (2,), (3,)), (2, 1, 1, 2)),  # groups of one: plain local steps, four workers
    (((0, 1, 2), (3,)), (4, 2)),  # unequal groups: deltas weighted 2/3 and 1/3 by tokens, not 3/4 and 1/4
], ids=["two-groups", "groups-of-one", "unequal-groups"])
def test_runtime_groups_equal_a_hand_written_diloco_and_send_the_predicted_bytes(tmp_path, groups, workers):
    import torch

    from tests.test_local_steps import _diloco_reference, _launch

    path, plan, model, training = _grouped_plan(tmp_path, groups)
    results = _launch(path, tmp_path / "run", iterations=4, lr=0.05)
    weights = torch.load(tmp_path / "run" / "state" / "stage0.pt")
    reference = _diloco_reference(model, micro_batches=workers, sync_every=2, iterations=4, lr=0.05)
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    sent = results["run"]["data_parallel_bytes_per_iteration"]
    predicted = communication_bytes(plan, model, training)["data_parallel_bytes_per_iteration"]
    assert sum(sent) / len(sent) == pytest.approx(predicted, rel=1e-6)


def test_plan_and_topology_files_with_sync_groups_match_their_schemas(job):
    import json

    import jsonschema

    from conftest import ROOT, small_topology

    schemas = {k: json.loads((ROOT / "planner" / "schema" / f"{k}.schema.json").read_text())
               for k in ("plan", "topology")}
    plan, training = _four(job, ((0, 1), (2, 3)))
    plan = plan.with_prediction(predict(plan, job.topology, job.model, training)[0])
    document = plan_to_document(plan, model=job.model, training=training)
    jsonschema.validate(document, schemas["plan"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**document, "sync_groups": [[0, 1], ["two"]]}, schemas["plan"])
    topology = small_topology()
    topology["training"].update(sync_every=4, sync_groups="cluster")
    jsonschema.validate(topology, schemas["topology"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**topology, "training": {**topology["training"], "sync_groups": "host"}},
                            schemas["topology"])
    for document in ({"sync_groups": "host"}, {"sync_groups": "cluster"}):  # the second with sync_every 1
        with pytest.raises(InputError) as caught:
            parse_training({"global_batch": 8, **document})
        assert caught.value.field == "training.sync_groups"


@pytest.mark.slow
def test_auto_compares_every_grouping_at_a_small_budget():
    """The search keeps a share of its limit for auto's simulations: on the shipped two-region
    cluster at budget 2 every distinct grouping is simulated (with only the work the search left,
    none besides the plan's own was)."""
    from conftest import ROOT
    from planner.search.front import SearchOptions, search

    job = load_job(ROOT / "topologies" / "hetero" / "h100-a100-two-regions.yaml")
    training = dataclasses.replace(job.training, sync_groups="auto", sync_every=4)
    plan = search(job.topology, job.model, training, SearchOptions(seed=0, budget_s=2, time_limit_s=120)).plan
    record = plan.search
    assert set(record["sync_groups_tried"]) == {"replica", "cluster", "one"}, record
    assert "sync_groups_untried" not in record
    assert plan.sync_groups  # cluster is the fastest here
