"""Local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105): the cost model charges the
data-parallel sync and the outer step once every ``sync_every`` iterations and keeps the outer
state; the search and the plan file carry it; the runtime runs it."""

import dataclasses

import numpy as np
import pytest

from planner.errors import InputError
from planner.inputs.job import load_job
from planner.inputs.model import TrainingSpec, model_preset, parse_training
from planner.plan.dims import Schedule
from planner.plan.document import plan_from_document, plan_to_document
from planner.plan.plan import Plan, validate_plan
from planner.prediction.predict import communication_bytes, predict
from planner.prediction.stage_model import layer_costs, optimizer_shards, stage_parameters
from conftest import small_topology


def _training(**changes) -> TrainingSpec:
    base = dict(global_batch=16, micro_batch_size=1, precision="bf16", optimizer="adam", schedule="1f1b",
                shard_optimizer=False)
    base.update(changes)
    return TrainingSpec(**base)


def _tiny():
    return model_preset("tiny")


# -- inputs ---------------------------------------------------------------------------------------
def test_training_reads_sync_every_and_the_outer_optimizer():
    t = parse_training({"global_batch": 8, "sync_every": 16, "outer_learning_rate": 0.5, "outer_momentum": 0})
    assert (t.sync_every, t.outer_learning_rate, t.outer_momentum) == (16, 0.5, 0)
    assert parse_training({"global_batch": 8}).sync_every == 1


@pytest.mark.parametrize("document, field", [
    ({"sync_every": 0}, "training.sync_every"),
    ({"sync_every": "often"}, "training.sync_every"),
    ({"sync_every": 4, "shard_optimizer": True}, "training.shard_optimizer"),
    ({"outer_momentum": 1.0}, "training.outer_momentum"),
    ({"outer_learning_rate": 0}, "training.outer_learning_rate"),
])
def test_bad_local_step_settings_name_their_field(document, field):
    with pytest.raises(InputError) as caught:
        parse_training({"global_batch": 8, **document})
    assert caught.value.field == field


# -- cost model -----------------------------------------------------------------------------------
def test_layer_costs_amortise_the_sync_and_the_outer_step_and_keep_the_outer_state():
    model = _tiny()
    one = layer_costs(model, _training(), 1, 2, 4)
    four = layer_costs(model, _training(sync_every=4), 1, 2, 4)
    # Hand-computed: bf16 gradients (2 B) a quarter as often; Adam's 16 B of state + 8 B of fp32
    # snapshot and outer momentum; the step's 28 B + a quarter of the outer step's 24 B.
    assert one.gradient_bytes_per_param == 2.0 and four.gradient_bytes_per_param == 0.5
    assert one.state_bytes_per_param == 16.0 and four.state_bytes_per_param == 24.0
    assert one.optimizer_bytes_per_param == 28.0 and four.optimizer_bytes_per_param == 28.0 + 24.0 / 4
    alone = layer_costs(model, _training(sync_every=4), 1, 2, 1)  # one replica: nothing to sync, no outer state
    assert (alone.state_bytes_per_param, alone.optimizer_bytes_per_param, alone.sync_every) == (16.0, 28.0, 1)


def test_local_steps_unshard_the_optimizer_state_under_auto():
    assert optimizer_shards(_training(shard_optimizer="auto"), 4) == 4
    assert optimizer_shards(_training(shard_optimizer="auto", sync_every=2), 4) == 1


def _two_replica_plan(sync_every: int) -> Plan:
    return Plan(layer_bounds=(0, _tiny().layers), assignment=(("slow-0",), ("fast-0",)),
                micro_batches=(8, 8), micro_batch_size=1, schedule=Schedule.ONE_F_ONE_B, sync_every=sync_every)


@pytest.fixture
def job(write_yaml):
    return load_job(write_yaml(small_topology()))


def test_prediction_charges_the_sync_once_every_h_iterations(job):
    training = dataclasses.replace(job.training, precision="fp16", shard_optimizer=False)
    results = {}
    for H in (1, 4):
        plan = _two_replica_plan(H)
        t = dataclasses.replace(training, sync_every=H)
        validate_plan(plan, job.topology, job.model, t)
        results[H] = predict(plan, job.topology, job.model, t)[0]
    costs = layer_costs(job.model, training, 1, 1, 2)
    params = float(stage_parameters(costs, job.model.layers, 0))
    ring = [job.topology.index(d) for d in ("slow-0", "fast-0")]
    whole = job.topology.network.ring_allreduce_s(2.0 * params, ring)  # fp16 gradients, latency included
    assert results[1].breakdown_s["gradient_sync_s"] == pytest.approx(whole, rel=1e-9)
    assert results[4].breakdown_s["gradient_sync_s"] == pytest.approx(whole / 4, rel=1e-9)
    assert results[4].iteration_s < results[1].iteration_s
    for device in ("slow-0", "fast-0"):  # fp32 snapshot and outer momentum: 8 B per parameter
        assert results[4].memory_bytes[device] - results[1].memory_bytes[device] == pytest.approx(8.0 * params)


def test_communication_per_token_shrinks_by_h(job):
    training = dataclasses.replace(job.training, precision="fp16", shard_optimizer=False)
    one = communication_bytes(_two_replica_plan(1), job.model, training)
    four = communication_bytes(_two_replica_plan(4), job.model, dataclasses.replace(training, sync_every=4))
    params = float(stage_parameters(layer_costs(job.model, training, 1, 1, 2), job.model.layers, 0))
    tokens = 16 * job.model.sequence
    # Two replicas, one stage: each sends 2 (k - 1) / k of the 2-byte gradients, k = 2.
    assert one["data_parallel_bytes_per_iteration"] == pytest.approx(2 * 1 * 2.0 * params)
    assert four["data_parallel_bytes_per_token"] == pytest.approx(one["data_parallel_bytes_per_token"] / 4)
    assert one["pipeline_bytes_per_iteration"] == 0.0 and one["bytes_per_token"] == pytest.approx(2 * 2.0 * params
                                                                                                 / tokens)


def test_search_plans_with_local_steps_and_the_plan_file_keeps_them(job):
    from planner.search.front import SearchOptions, search

    training = dataclasses.replace(job.training, sync_every=8)
    result = search(job.topology, job.model, training, SearchOptions(seed=0, time_limit_s=2, replicas=2))
    plan = result.plan
    assert plan.sync_every == 8
    document = plan_to_document(plan, model=job.model, training=result.training)
    assert document["sync_every"] == 8 and document["training"]["sync_every"] == 8
    again = plan_from_document(document)
    assert again.sync_every == 8
    validate_plan(again, job.topology, job.model, result.training)
    with pytest.raises(InputError) as caught:  # a plan and a training that disagree
        validate_plan(again, job.topology, job.model, dataclasses.replace(result.training, sync_every=1))
    assert caught.value.field == "sync_every"
    assert "sync_every" not in plan_to_document(dataclasses.replace(plan, sync_every=1))


# -- command line ---------------------------------------------------------------------------------
def test_cli_plans_with_sync_every_and_says_it_changes_the_optimisation(write_yaml, tmp_path, capsys):
    from planner.cli import main
    from planner.plan.document import read_plan

    path = write_yaml(small_topology())
    out = tmp_path / "plan.yaml"
    assert main([str(path), "--sync-every", "4", "--replicas", "2", "--time-limit", "2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "every 4 iterations" in text and "This changes the optimisation" in text
    assert "per token sent between workers" in text
    plan, document = read_plan(out)
    assert plan.sync_every == 4 and document["training"]["sync_every"] == 4


@pytest.mark.parametrize("argv, fragment", [
    (["--sync-every", "0"], "field '--sync-every'"),
    (["--sync-every", "1000000"], "field '--sync-every'"),
])
def test_cli_refuses_a_bad_sync_every_in_one_line(write_yaml, capsys, argv, fragment):
    from planner.cli import main

    assert main([str(write_yaml(small_topology())), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


def test_cli_refuses_sync_every_with_a_sharded_optimizer_naming_the_file(write_yaml, capsys):
    from planner.cli import main

    document = small_topology()
    document["training"]["shard_optimizer"] = True
    path = write_yaml(document)
    assert main([str(path), "--sync-every", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "training.shard_optimizer" in err and len(err.splitlines()) == 1


# -- runtime (CPU, gloo, fp32) --------------------------------------------------------------------
def _local_plan(folder, *, sync_every: int, model=None, micro_batches=(3, 1)):
    """2 replicas x 2 stages of the tiny model on CPU devices (a0 b0 / a1 b1), 1F1B, SGD, fp32."""
    from planner.inputs.topology import parse_topology
    from planner.io import read_yaml
    from planner.plan.document import write_plan
    from tests.runtime_helpers import cpu_topology

    model = model or _tiny()
    topology_path = cpu_topology(folder / "topology.yaml")
    topology = parse_topology(read_yaml(topology_path), name="cpu-six")
    training = parse_training({"global_batch": sum(micro_batches), "micro_batch_size": 1, "precision": "fp32",
                               "optimizer": "sgd", "schedule": "1f1b", "shard_optimizer": "auto",
                               "sync_every": sync_every})
    assignment = (("a0", "b0"), ("a1", "b1"))
    plan = Plan(layer_bounds=(0, 2, 4), assignment=assignment, micro_batches=tuple(micro_batches),
                micro_batch_size=1, schedule=Schedule.ONE_F_ONE_B, topology_name=topology.name,
                topology_sha256=topology.sha256, sync_every=sync_every,
                idle=tuple(d.name for d in topology.devices if d.name not in {"a0", "b0", "a1", "b1"}))
    path = folder / "plan.yaml"
    write_plan(plan_to_document(plan, model=model, training=training, topology_source=str(topology_path)), path)
    return path


def _launch(plan_path, out, iterations: int, lr: float):
    from planner.runtime.launch import LaunchOptions, launch

    return launch(plan_path, LaunchOptions(backend="gloo", iterations=iterations, warmup=0, out_dir=str(out),
                                           learning_rate=lr, save_state=True), log=lambda line: None)


def _diloco_reference(spec, *, micro_batches, sync_every: int, iterations: int, lr: float, outer_lr=0.7,
                      outer_momentum=0.9) -> dict:
    """Hand-written DiLoCo: each replica a whole model trained alone (SGD with momentum 0.9, the
    inner optimizer keeping its state across syncs as in DiLoCo; the mean loss over its own
    rows of each global batch) for ``sync_every`` steps; then the deltas averaged, each weighted by
    its replica's rows over the batch's, and an outer Nesterov step from the common snapshot."""
    import torch
    import torch.nn.functional as F

    from planner.runtime.data import global_batch_tokens
    from planner.runtime.gpt import build_stage

    R, batch = len(micro_batches), sum(micro_batches)
    replicas = [build_stage(spec, 0, spec.layers, seed=0) for _ in range(R)]
    snapshot = {k: v.detach().clone() for k, v in replicas[0].state_dict().items()}
    momentum = {k: torch.zeros_like(v) for k, v in snapshot.items()}
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in replicas]  # the runtime's SGD
    for iteration in range(iterations):
        tokens = global_batch_tokens(0, iteration, batch, spec.sequence, spec.vocabulary)
        first = 0
        for model, optimizer, count in zip(replicas, optimizers, micro_batches):
            rows = tokens[first:first + count]
            first += count
            logits = model(rows[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if (iteration + 1) % sync_every == 0:
            states = [m.state_dict() for m in replicas]
            new = {}
            for name in snapshot:
                delta = sum(count / batch * (snapshot[name] - s[name]) for s, count in zip(states, micro_batches))
                momentum[name] = outer_momentum * momentum[name] + delta
                new[name] = snapshot[name] - outer_lr * (delta + outer_momentum * momentum[name])
            snapshot = new
            for m in replicas:
                m.load_state_dict(new)
    return snapshot


@pytest.mark.runtime
@pytest.mark.slow
def test_runtime_local_steps_equal_a_hand_written_diloco(tmp_path):
    import torch

    spec = _tiny()
    results = _launch(_local_plan(tmp_path, sync_every=2), tmp_path / "run", iterations=4, lr=0.05)
    weights = {}
    for s in range(2):
        weights.update(torch.load(tmp_path / "run" / "state" / f"stage{s}.pt"))
    reference = _diloco_reference(spec, micro_batches=(3, 1), sync_every=2, iterations=4, lr=0.05)
    assert torch.allclose(weights.pop("head.weight"), reference["embed.weight"], atol=1e-5)  # the tied copy
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    synchronous = _diloco_reference(spec, micro_batches=(3, 1), sync_every=1, iterations=4, lr=0.05, outer_lr=1.0,
                                    outer_momentum=0.0)  # outer SGD of rate 1: plain averaging every step
    assert not torch.allclose(weights["embed.weight"], synchronous["embed.weight"], atol=1e-5)
    assert results["run"]["sync_every"] == 2


@pytest.mark.runtime
@pytest.mark.slow
def test_runtime_counts_data_parallel_bytes_that_shrink_by_h(tmp_path):
    import dataclasses as dc

    untied = dc.replace(_tiny(), tied_embeddings=False)  # every byte of the sync crosses the stage's replicas
    sent = {}
    for H in (1, 2):
        folder = tmp_path / f"h{H}"
        folder.mkdir()
        results = _launch(_local_plan(folder, sync_every=H, model=untied, micro_batches=(2, 2)), folder / "run",
                          iterations=4, lr=0.05)
        assert results["run"]["sync_every"] == H
        sent[H] = results["run"]["data_parallel_bytes_per_iteration"]
    training = parse_training({"global_batch": 4, "precision": "fp32", "shard_optimizer": False})
    params = stage_parameters(layer_costs(untied, training, 1, 2, 2), np.array([2.0, 2.0]), np.arange(2))
    whole = 2 * 4 * int(params.sum())  # two replicas of each stage hand over their fp32 gradients
    assert sent[1] == [whole] * 4
    assert sent[2] == [0, whole, 0, whole]  # the deltas, once every 2 iterations
    assert sum(sent[2]) / 4 == sum(sent[1]) / 4 / 2


def test_launch_refuses_checkpoints_of_a_local_steps_plan_in_one_line(tmp_path, capsys):
    from planner.cli import main

    plan = _local_plan(tmp_path, sync_every=4)
    assert main(["launch", str(plan), "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(plan) in err and "field 'sync_every'" in err and "--checkpoint-every" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
