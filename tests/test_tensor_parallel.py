"""Tensor parallelism inside a host: the formulas, the stage model, the simulator's input, the plan
file, validate_plan's refusals and the search."""

import json
from dataclasses import replace

import jsonschema
import pytest

from cost_models import comm, flops, memory
from planner.cli import main
from planner.errors import InputError
from planner.inputs.catalog import device_type
from planner.inputs.job import load_job
from planner.inputs.model import ModelSpec, TrainingSpec
from planner.plan.document import plan_from_document, plan_to_document, read_plan, write_plan
from planner.plan.plan import Plan, validate_plan
from planner.plan.tensor import group_devices, grouping_groups, groupings
from planner.prediction.predict import build_pipeline_job, predict
from planner.prediction.stage_model import layer_costs, stage_memory_bytes, stage_parameters, tensor_layer_s
from planner.search.front import SearchOptions, search

from conftest import ROOT

PLAN_SCHEMA = json.loads((ROOT / "planner" / "schema" / "plan.schema.json").read_text())

# One host of 4 A100 and 2 T4, another of 2 A100; 400 GB/s and 10 us inside a host.
HOSTS = {
    "name": "two-hosts",
    "devices": [{"name": "a", "count": 4, "type": "A100-80GB", "host": "node"},
                {"name": "t", "count": 2, "type": "T4", "host": "node"},
                {"name": "b", "count": 2, "type": "A100-80GB", "host": "other"}],
    "network": {"host": {"latency": "0.01ms", "bandwidth": "3200Gbps"},
                "region": {"latency": "0.05ms", "bandwidth": "100Gbps"}},
    "model": {"name": "m", "layers": 4, "hidden": 256, "heads": 4, "sequence": 128, "vocabulary": 1000},
    "training": {"global_batch": 8, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp16"},
}

# 2 A100-80GB and 2 hosts of 4 T4: one block of this model (29 GB of Adam state, 18 GB sharded over
# 2 replicas) fits no T4.
WIDE = {
    "name": "wide-on-t4",
    "devices": [{"name": "a100", "count": 2, "type": "A100-80GB", "host": "big"},
                {"name": "t4", "count": 8, "type": "T4", "gpus_per_host": 4, "host": "small"}],
    "network": {"host": {"latency": "0.01ms", "bandwidth": "128Gbps"},
                "region": {"latency": "0.05ms", "bandwidth": "100Gbps"}},
    "model": {"name": "wide", "layers": 4, "hidden": 12288, "heads": 96, "sequence": 1024, "vocabulary": 32000},
    "training": {"global_batch": 128, "precision": "auto", "optimizer": "adam", "recompute": False,
                 "schedule": "auto"},
}


def _model(**kw) -> ModelSpec:
    base = dict(name="m", layers=4, hidden=4, heads=2, sequence=8, vocabulary=10)
    return ModelSpec(**{**base, **kw})


# -- formulas ------------------------------------------------------------------------------------

def test_split_parameters_by_hand():
    # h 4, f 16: weights 4*16 + 2*4*16 = 192, column-parallel biases 3*4 + 16 = 28.
    assert flops.tensor_split_parameters(4, 16) == 220
    # Left whole: the projection's and fc2's biases (4 + 4) and two LayerNorms (16): 12h^2 + 13h - 220.
    assert flops.layer_parameters(4, 16) - flops.tensor_split_parameters(4, 16) == 24
    # SwiGLU without biases: every matrix splits (4*16 + 3*4*16 = 256), two RMSNorm scales stay whole.
    assert flops.tensor_split_parameters(4, 16, gated_mlp=True, biases=False) == 256
    assert flops.layer_parameters(4, 16, gated_mlp=True, biases=False) == 256 + 8


def test_activations_follow_korthikanti_table_2():
    s, b, h, a = 2048, 1, 4096, 32
    # Table 2 less the dropouts the runtime's block has not (two s*b*h masks whole on every member,
    # the attention dropout's 3as/(ht)): t = 4: 8 + 24/4 + 2*32*2048/(4096*4) = 8 + 6 + 8 = 22 bytes
    # per (token x hidden).
    assert memory.layer_activation_bytes(s, b, h, a, tensor=4) == 2048 * 4096 * 22
    # t = 1 is eq. 1 of the same paper less the same: 32 + 2as/h = 32 + 32.
    assert memory.layer_activation_bytes(s, b, h, a, tensor=1) == 2048 * 4096 * 64
    assert memory.layer_activation_bytes(s, b, h, a, tensor=4, flash_attention=True) == 2048 * 4096 * 14
    # Full recomputation keeps the block input, whole on every member.
    assert memory.layer_activation_bytes(s, b, h, a, tensor=4, recompute=True) == 2 * 2048 * 4096


def test_each_member_keeps_its_share_of_a_stage():
    model = ModelSpec(name="m", layers=8, hidden=512, heads=8, sequence=256, vocabulary=1000)
    training = TrainingSpec(global_batch=8, precision="bf16")
    costs = layer_costs(model, training, 2, 2)
    whole, split = flops.layer_parameters(512, 2048), flops.tensor_split_parameters(512, 2048)
    for t in (1, 2, 4, 8):  # the embeddings (the first stage's extra) stay whole
        per_member = 3 * (whole - split + split / t) + costs.stage_extra_params[0]
        assert stage_parameters(costs, 3, 0, t) == pytest.approx(per_member)
    # Second derivation: memory at t is the state of the member's parameters plus Table 2's activations.
    kept = memory.layer_activation_bytes(256, 2, 512, 8, tensor=4)
    state = memory.state_bytes_per_parameter("bf16", "adam")
    need = stage_memory_bytes(costs, 3, 1, 2, 4) - stage_memory_bytes(costs, 0, 1, 2, 4)
    assert need == pytest.approx(3 * (whole - split * 0.75) * state + 2 * 3 * kept)


def test_only_the_lead_keeps_the_whole_parameters_state():
    # fp16 Adam, one stage of 3 blocks (first and last: embeddings, final norm, tied head).
    model = ModelSpec(name="m", layers=3, hidden=512, heads=8, sequence=256, vocabulary=1000)
    training = TrainingSpec(global_batch=8, precision="fp16")
    costs = layer_costs(model, training, 2, 1)
    whole_block = flops.layer_parameters(512, 2048) - flops.tensor_split_parameters(512, 2048)
    embeddings = flops.embedding_parameters(1024, 512, 256)  # the padded vocabulary's rows
    whole = 3 * whole_block + embeddings + flops.head_parameters(1024, 512)
    lead, member = (stage_memory_bytes(costs, 3, 0, 1, 4, lead=k) for k in (True, False))
    # A member keeps the whole parameters' 2-byte weights and the embeddings' 2-byte gradients, not
    # their 16 bytes of weights, gradients and Adam state.
    assert lead - member == pytest.approx(whole * (16 - 2) - embeddings * 2)
    # A later stage has no embeddings: a member keeps only the whole weights.
    two = layer_costs(replace(model, layers=6), training, 2, 2)
    lead, member = (stage_memory_bytes(two, 3, 1, 1, 2, lead=k) for k in (True, False))
    last = flops.head_parameters(1024, 512) + 1024 * 512  # final norm and the tied embedding's copy
    assert lead - member == pytest.approx((3 * whole_block + last) * (16 - 2))
    # Alone, a device is its own lead.
    assert stage_memory_bytes(costs, 3, 0, 1) == stage_memory_bytes(costs, 3, 0, 1, 1, lead=True)


def test_tensor_all_reduces_by_hand(write_yaml):
    job = load_job(write_yaml(HOSTS))
    groups = group_devices(job.topology, (("a-0", "a-1", "a-2", "a-3"),))
    k = groups.virtual.index("a-0")
    assert list(groups.members[k]) == ["a-0", "a-1", "a-2", "a-3"] and groups.degree[k] == 4
    # Ring of 4 at 400 GB/s and 10 us a hop: 2*3/4 bytes / 4e11 + 6 * 1e-5 s.
    assert groups.allreduce_per_byte_s[k] == pytest.approx(1.5 / 4e11)
    assert groups.allreduce_latency_s[k] == pytest.approx(6e-5)
    model, training = job.model, job.training
    costs = layer_costs(model, training, 1, 2)
    message = 1 * 128 * 256 * 2  # (b, s, h) in fp16
    one = message * 1.5 / 4e11 + 6e-5
    assert comm.tensor_allreduces(False) == (2, 2) and comm.tensor_allreduces(True) == (2, 4)
    per_byte, latency = groups.allreduce_per_byte_s[k], groups.allreduce_latency_s[k]
    # A member's share of the block that takes long enough: only the all-reduces come on top.
    assert tensor_layer_s(costs, per_byte, latency, 1.0, 4) == pytest.approx(4 * one)
    recomputed = layer_costs(model, replace(training, recompute=True), 1, 2)
    assert tensor_layer_s(recomputed, per_byte, latency, 1.0, 4) == pytest.approx(6 * one)
    # A share too small to cover the block's issue time takes that time (forward issued again under
    # recomputation); one device alone takes nothing beyond its compute.
    floor = 3.15e-3
    assert 4 * one < floor
    assert tensor_layer_s(costs, per_byte, latency, 1e-4, 4, floor) == pytest.approx(floor - 1e-4)
    assert tensor_layer_s(recomputed, per_byte, latency, 0.0, 4, floor) == pytest.approx(4 / 3 * floor)
    assert tensor_layer_s(costs, 0.0, 0.0, 1e-4, 1, floor) == 0.0
    assert tensor_layer_s(costs, per_byte, latency, 1e-4, 4) == pytest.approx(4 * one)  # no floor: the all-reduces
    # The floor is the members' device type's: A100s have none in the catalog; H100s the fitted one.
    assert groups.issue_s[k] == 0.0
    assert device_type("H100-SXM").tensor_block_issue_s == pytest.approx(floor)
    floored = group_devices(_with_floor(job.topology, 2e-3), (("a-0", "a-1"),))
    assert list(floored.issue_s[floored.degree > 1]) == [2e-3] and set(floored.issue_s[floored.degree == 1]) == {0.0}


def _with_floor(topology, floor_s):
    """``topology`` with every device's tensor-group block floor set to ``floor_s``."""
    return replace(topology, devices=tuple(replace(d, tensor_block_issue_s=floor_s) for d in topology.devices))


def _two_stage_plan(job, tensor_groups=(("a-0", "a-1"),)) -> Plan:
    return Plan(layer_bounds=(0, 2, 4), assignment=(("a-0", "b-0"),), micro_batches=(8,), micro_batch_size=1,
                schedule="1f1b", topology_name=job.topology.name, topology_sha256=job.topology.sha256,
                idle=tuple(n for n in job.topology.names if n not in {"b-0"} | {m for g in tensor_groups for m in g}),
                tensor_groups=tuple(tensor_groups))


def test_the_simulator_times_a_group_as_its_members_plus_its_all_reduces(write_yaml):
    job = load_job(write_yaml(HOSTS))
    model, training = job.model, job.training
    alone, grouped = _two_stage_plan(job, ()), _two_stage_plan(job)
    job_alone = build_pipeline_job(alone, job.topology, model, training)
    costs = layer_costs(model, training, 1, 2)
    one = costs.tensor_message_bytes * 1.0 / 4e11 + 2 * 1e-5  # ring of 2: 2*1/2 bytes / bandwidth + 2 hops
    # This model's blocks are too small to cover a group's issue floor: first without the floor.
    job_grouped = build_pipeline_job(grouped, _with_floor(job.topology, 0.0), model, training)
    # Stage 0 (2 blocks and the embeddings' lookup): half the compute plus 2 all-reduces a block each way.
    assert job_grouped.forward_s[0, 0] == pytest.approx(job_alone.forward_s[0, 0] / 2 + 2 * 2 * one)
    assert job_grouped.backward_s[0, 0] == pytest.approx(job_alone.backward_s[0, 0] / 2 + 2 * 2 * one)
    assert job_grouped.forward_s[0, 1] == pytest.approx(job_alone.forward_s[0, 1])  # the head's stage is alone
    # With the floor, each block of the group takes its issue time in all, split as the all-reduces.
    job_grouped = build_pipeline_job(grouped, _with_floor(job.topology, 0.5), model, training)
    share = costs.layer_flops / (2 * job.topology.effective_flops(training.precision)[job.topology.index("a-0")])
    assert job_grouped.forward_s[0, 0] == pytest.approx(job_alone.forward_s[0, 0] / 2 + 2 * (0.5 - share) / 2)
    assert job_grouped.backward_s[0, 0] == pytest.approx(job_alone.backward_s[0, 0] / 2 + 2 * (0.5 - share) / 2)
    prediction, _ = predict(grouped, job.topology, model, training)
    assert set(prediction.memory_bytes) == {"a-0", "a-1", "b-0"}
    assert prediction.memory_bytes["a-0"] > prediction.memory_bytes["a-1"]  # the lead steps the whole part
    assert prediction.memory_bytes["a-0"] < predict(alone, job.topology, model, training)[0].memory_bytes["a-0"]


# -- validate_plan and the plan file ------------------------------------------------------------

@pytest.mark.parametrize("groups, fragment", [
    ((("a-0", "b-1"),), "spans hosts node, other"),
    ((("a-0", "t-0"),), "mixes device types A100-80GB, T4"),
    ((("a-0", "a-1", "a-2"),), "has 3 devices"),
    ((("a-1", "a-2"),), "lead a-1 runs no stage"),
    ((("a-0", "b-0"),), "spans hosts"),
])
def test_validate_plan_refuses_bad_groups(write_yaml, groups, fragment):
    job = load_job(write_yaml(HOSTS))
    with pytest.raises(InputError, match=fragment) as caught:
        validate_plan(_two_stage_plan(job, groups), job.topology, job.model, job.training)
    assert caught.value.field.startswith("tensor_groups") or caught.value.field == "replicas"


def test_validate_plan_refuses_a_degree_that_does_not_divide_the_heads(write_yaml):
    job = load_job(write_yaml({**HOSTS, "model": {**HOSTS["model"], "heads": 2}}))
    plan = _two_stage_plan(job, (("a-0", "a-1", "a-2", "a-3"),))
    with pytest.raises(InputError, match="degree 4, which does not divide the model's 2 heads"):
        validate_plan(plan, job.topology, job.model, job.training)
    validate_plan(_two_stage_plan(job), job.topology, job.model, job.training)  # degree 2 divides 2 heads


def test_plan_file_round_trip_keeps_the_groups(write_yaml, tmp_path):
    job = load_job(write_yaml(HOSTS))
    plan = _two_stage_plan(job)
    plan = plan.with_prediction(predict(plan, job.topology, job.model, job.training)[0])
    document = plan_to_document(plan, model=job.model, training=job.training)
    assert document["tensor_groups"] == [["a-0", "a-1"]] and document["degrees"]["tensor"] == 2
    assert set(document["prediction"]["memory"]) == {"a-0", "a-1", "b-0"}
    for name in ("plan.yaml", "plan.json"):
        write_plan(document, tmp_path / name)
        back, _ = read_plan(tmp_path / name)
        assert back.tensor_groups == plan.tensor_groups and back.assignment == plan.assignment
        assert back.used_devices == ["a-0", "a-1", "b-0"]
        validate_plan(back, job.topology, job.model, job.training)
    no_groups = plan_to_document(_two_stage_plan(job, ()))
    assert "tensor_groups" not in no_groups and no_groups["degrees"]["tensor"] == 1


def test_plan_files_match_the_json_schema(write_yaml):
    job = load_job(write_yaml(HOSTS))
    for groups in ((), (("a-0", "a-1"),), (("a-0", "a-1", "a-2", "a-3"),)):
        plan = _two_stage_plan(job, groups)
        plan = plan.with_prediction(predict(plan, job.topology, job.model, job.training)[0])
        jsonschema.validate(plan_to_document(plan, model=job.model, training=job.training), PLAN_SCHEMA)
    document = plan_to_document(_two_stage_plan(job))
    for bad in ([["a-0"]], [["a-0", "a-0"]], ["a-0"]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**document, "tensor_groups": bad}, PLAN_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**document, "degrees": {**document["degrees"], "tensor": 3}}, PLAN_SCHEMA)


@pytest.mark.parametrize("edit, field, fragment", [
    (lambda d: d["degrees"].update(tensor=4), "degrees.tensor", "is 4 but the plan has 2"),
    (lambda d: d.update(tensor_groups=[["a-1", "a-0"]]), "tensor_groups[0]", "lead 'a-1' is no replica's device"),
    (lambda d: d.update(tensor_groups=[["a-0", "b-0"]]), "tensor_groups[0]", "'b-0' is in two places"),
    (lambda d: d.update(tensor_groups=[["a-0"]]), "tensor_groups[0]", "two or more device names"),
])
def test_an_edited_plan_file_is_refused_in_one_line(write_yaml, edit, field, fragment):
    job = load_job(write_yaml(HOSTS))
    document = plan_to_document(_two_stage_plan(job))
    edit(document)
    with pytest.raises(InputError, match=fragment) as caught:
        plan_from_document(document, source="p.yaml")
    assert caught.value.field == field and "\n" not in str(caught.value)


# -- search --------------------------------------------------------------------------------------

def test_groupings_are_few_and_start_without_groups(write_yaml):
    job = load_job(write_yaml(WIDE))
    first, fallback = groupings(job.topology, job.model)
    # T4 (16 GB) joins in groups whose memory reaches an A100-80GB's: 8 wanted, 4 on the host.
    assert first == [{"A100-80GB": 1, "T4": 1}, {"A100-80GB": 1, "T4": 4}]
    assert fallback == [{"A100-80GB": 2, "T4": 2}, {"A100-80GB": 2, "T4": 4}]  # the A100 host has 2
    assert grouping_groups(job.topology, first[1]) == (("t4-0", "t4-1", "t4-2", "t4-3"),
                                                       ("t4-4", "t4-5", "t4-6", "t4-7"))
    assert groupings(job.topology, job.model, (1,)) == ([{"A100-80GB": 1, "T4": 1}], [])
    # One type: no grouping first; pairs, then fours, only if nothing fits without them.
    alike = load_job(write_yaml({**WIDE, "devices": [WIDE["devices"][1]]}))
    assert groupings(alike.topology, alike.model) == ([{"T4": 1}], [{"T4": 2}, {"T4": 4}])
    # Degrees without 1 ask for groups: each type at its largest (the A100 host has 2).
    assert groupings(job.topology, job.model, (2, 4)) == ([{"A100-80GB": 2, "T4": 4}], [])


def test_cli_plans_a_tensor_group_when_degrees_leave_out_1(tmp_path, capsys):
    # The committed GPU plan benchmarks/plans/h100x2-tensor.yaml was made this way.
    out = tmp_path / "tensor.yaml"
    assert main([str(ROOT / "topologies" / "local" / "h100-x2.yaml"), "--stages", "1", "--replicas", "1",
                 "--tensor-degrees", "2", "--time-limit", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    plan, _ = read_plan(out)
    assert plan.tensor_groups == (("gpu-0", "gpu-1"),) and plan.assignment == (("gpu-0",),) and plan.idle == ()


def test_a_model_that_fits_no_device_alone_is_planned_over_tensor_groups(write_yaml):
    # Eight T4 on two hosts: one block (1.26e9 parameters, 20 GB of Adam state) fits no T4 alone, so
    # only the fallback groupings (every type in groups of 2, then 4) find a plan.
    job = load_job(write_yaml({**WIDE, "devices": [{"name": "t4", "count": 8, "type": "T4", "gpus_per_host": 4,
                                                    "host": "small"}],
                               "model": {"name": "wider", "layers": 4, "hidden": 10240, "heads": 80,
                                         "sequence": 1024, "vocabulary": 8000}}))
    with pytest.raises(InputError, match="no plan fits"):
        search(job.topology, job.model, job.training, SearchOptions(time_limit_s=2, tensor_degrees=(1,)))
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=4))
    assert result.plan.tensor_groups and result.plan.prediction.fits
    assert "T4: 1" not in result.plan.search["tensor_tried"]  # it found no plan


def test_tensor_groups_put_idle_t4s_to_work_and_the_iteration_gets_faster(write_yaml):
    job = load_job(write_yaml(WIDE))
    without = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=4, tensor_degrees=(1,)))
    assert len(without.plan.idle) == 8 and all(name.startswith("t4") for name in without.plan.idle)
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=8, tensor_degrees=(1, 4)))
    plan = result.plan
    assert plan.tensor_groups == (("t4-0", "t4-1", "t4-2", "t4-3"), ("t4-4", "t4-5", "t4-6", "t4-7"))
    assert plan.idle == ()
    assert result.predicted_s < without.predicted_s / 1.25  # 15.7 s against 20.5 s
    validate_plan(plan, job.topology, job.model, result.training)
    assert plan.prediction.fits and max(plan.prediction.memory_bytes[f"t4-{i}"] for i in range(8)) < 16e9


@pytest.mark.slow
def test_cli_prints_groups_and_launch_emulates_them(write_yaml, tmp_path, capsys):
    path = write_yaml(WIDE)
    out = tmp_path / "plan.yaml"
    # the clock cuts nothing; the grouped search gets the budget the ungrouped one leaves unused (at --budget 4,
    # 1.6 of 4): it reaches the 2 x 2 plan of groups (15.7 s)
    assert main([str(path), "--time-limit", "30", "--budget", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "t4-0 x4" in text and "t4-0: t4-0 t4-1 t4-2 t4-3" in text and "tensor groups of up to 4" in text
    assert (read_plan(out)[0].stages, read_plan(out)[0].replicas) == (2, 2)
    pytest.importorskip("torch")
    run = tmp_path / "run"
    assert main(["launch", str(out), "--emulate", "--iterations", "1", "--warmup", "0", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    plan, _ = read_plan(out)
    assert results["run"]["world"] == len(plan.used_devices) > plan.stages * plan.replicas  # a process per member
    assert results["run"]["executed_model"]["heads"] == 4  # a head per member of a group of 4 T4
    assert main([str(path), "--time-limit", "2", "--tensor-degrees", "1"]) == 0
    assert "x4" not in capsys.readouterr().out


def test_replanning_from_a_plan_with_groups_searches_with_its_groups(write_yaml):
    job = load_job(write_yaml(HOSTS))
    start = _two_stage_plan(job)
    start = start.with_prediction(predict(start, job.topology, job.model, job.training)[0])
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=2), x0=start)
    assert set(result.plan.tensor_groups) <= set(start.tensor_groups)  # no other grouping is tried
    assert result.plan.search.get("tensor_tried") is None
    assert result.predicted_s <= start.prediction.iteration_s * (1 + 1e-9)
    validate_plan(result.plan, job.topology, job.model, result.training)


def test_the_issue_floor_steers_groups_to_larger_micro_batches():
    """GPT-3 XL on 4 H100s as 2 stages of groups of 2, micro-batch chosen by the search: without the
    floor it picks micro-batch 2 (the smaller bubble), which ran 0.821 s on 4x H100 against 0.433 s
    at micro-batch 4 (``benchmarks/results/runtime_gpu_tensor_x4.json``); with it, 4 or more."""
    from planner.search.front import SearchOptions, search

    job = load_job(ROOT / "topologies" / "local" / "h100-x4.yaml")
    training = replace(job.training, micro_batch_size=0, schedule="1f1b")
    options = SearchOptions(seed=0, budget_s=2, time_limit_s=120, stages=2, replicas=1, tensor_degrees=(2,))
    assert search(job.topology, job.model, training, options).plan.micro_batch_size >= 4
    assert search(_with_floor(job.topology, 0.0), job.model, training, options).plan.micro_batch_size == 2


@pytest.mark.parametrize("floor_s", [0.0, 3.15e-3, 5e-3])
def test_the_estimate_and_the_simulator_charge_the_same_floor(floor_s):
    """GPT-3 XL on one group of 4 H100s at micro-batch 2 (the floor binds at 3.15 ms): the search's
    estimate and the simulator take the members' floor from the same function."""
    import numpy as np

    from planner.search.evaluate import make_context, score_split

    job = load_job(ROOT / "topologies" / "local" / "h100-x4.yaml")
    topology = _with_floor(job.topology, floor_s)
    group = tuple(topology.names)
    ctx = make_context(topology, job.model, job.training, (group,))
    assign = np.array([[ctx.topology.index(group[0])]])
    estimate = score_split(ctx, assign, (job.model.layers,), (16,), 2, "1f1b")
    plan = Plan(layer_bounds=(0, job.model.layers), assignment=((group[0],),), micro_batches=(16,),
                micro_batch_size=2, schedule="1f1b", tensor_groups=(group,))
    simulated = predict(plan, topology, job.model, job.training)[0].iteration_s
    assert estimate == pytest.approx(simulated, rel=0.01)
    if floor_s == 5e-3:  # bound by the floor: 24 blocks x 16 micro-batches at 5 ms, the head and step on top
        assert simulated > 24 * 16 * 5e-3


def _with_timed_blocks(topology, table):
    """``topology`` with every device's timed tensor-group blocks set to ``table`` ((degree,
    ((micro-batch, seconds), ...)), ...), as ``apply_calibration`` sets a calibrated type's."""
    return replace(topology, devices=tuple(replace(d, tensor_block_s=table) for d in topology.devices))


def test_a_timed_block_is_interpolated_between_the_timed_micro_batches():
    table = ((1, 3.0e-3), (2, 3.2e-3), (4, 3.9e-3), (8, 4.8e-3))
    assert comm.measured_tensor_block_s(table, 1) == 3.0e-3
    assert comm.measured_tensor_block_s(table, 3) == pytest.approx((3.2e-3 + 3.9e-3) / 2)
    assert comm.measured_tensor_block_s(table, 8) == 4.8e-3
    # Above the largest timed size its time per sequence; below the smallest, the smallest's (a floor).
    assert comm.measured_tensor_block_s(table, 16) == pytest.approx(2 * 4.8e-3)
    assert comm.measured_tensor_block_s(((2, 3.2e-3), (4, 3.9e-3)), 1) == 3.2e-3
    assert comm.measured_tensor_block_s((), 4) == 0.0


def test_a_timed_block_replaces_the_share_and_all_reduces(write_yaml):
    """Where the group's degree was timed, the block takes the timing (times the recomputation's or
    split backward's slowdown) whatever the all-reduces or the floor say; a degree not timed keeps
    the modelled block; a device alone takes nothing beyond its compute."""
    job = load_job(write_yaml(HOSTS))
    costs = layer_costs(job.model, job.training, 4, 2)
    assert costs.micro_batch_size == 4
    assert tensor_layer_s(costs, 1e-9, 1e-5, 1e-3, 2, 5e-3, 2.5e-3) == pytest.approx(1.5e-3)
    assert tensor_layer_s(costs, 1e-9, 1e-5, 4e-3, 2, 0.0, 2.5e-3, 4 / 3) == pytest.approx(4 / 3 * 2.5e-3 - 4e-3)
    assert tensor_layer_s(costs, 0.0, 0.0, 1e-3, 2, 5e-3, 0.0) == pytest.approx(4e-3)  # not timed: the floor
    recomputed = layer_costs(job.model, replace(job.training, recompute=True), 4, 2)  # one more forward: 4/3
    assert tensor_layer_s(recomputed, 1e-9, 1e-5, 1e-3, 2, 0.0, 3e-3, 1.1) == pytest.approx(4 / 3 * 3e-3 * 1.1 - 1e-3)
    timed = _with_timed_blocks(job.topology, ((2, ((1, 1e-3), (4, 2e-3))),))
    two = group_devices(timed, (("a-0", "a-1"),))
    assert {int(t): float(s) for t, s in zip(two.degree, two.timed_block_s(2))} == {
        1: 0.0, 2: pytest.approx(1e-3 + (2e-3 - 1e-3) / 3)}
    four = group_devices(timed, (("a-0", "a-1", "a-2", "a-3"),))
    assert not four.timed_block_s(2).any()  # only degree 2 was timed


def test_the_estimate_and_the_simulator_charge_the_same_timed_block():
    """GPT-3 XL on one group of 4 H100s at micro-batch 2, its block timed at 2.7 ms there: the
    search's estimate and the simulator both take the timing, and 24 blocks x 16 micro-batches of it
    (the head and the step on top) bound the iteration; a slower timing gives a slower iteration."""
    import numpy as np

    from planner.search.evaluate import make_context, score_split

    job = load_job(ROOT / "topologies" / "local" / "h100-x4.yaml")
    group = tuple(job.topology.names)
    plan = Plan(layer_bounds=(0, job.model.layers), assignment=((group[0],),), micro_batches=(16,),
                micro_batch_size=2, schedule="1f1b", tensor_groups=(group,))
    times = []
    for block_s in (2.7e-3, 4.0e-3):
        topology = _with_timed_blocks(job.topology, ((4, ((1, block_s - 1e-4), (2, block_s), (4, 2 * block_s))),))
        ctx = make_context(topology, job.model, job.training, (group,))
        estimate = score_split(ctx, np.array([[ctx.topology.index(group[0])]]), (job.model.layers,), (16,), 2, "1f1b")
        simulated = predict(plan, topology, job.model, job.training)[0].iteration_s
        assert estimate == pytest.approx(simulated, rel=0.01)
        assert 24 * 16 * block_s < simulated < 24 * 16 * block_s * 1.3
        times.append(simulated)
    assert times[1] - times[0] == pytest.approx(24 * 16 * 1.3e-3, rel=0.02)


def test_the_lower_bound_holds_for_groups_faster_as_timed_than_modelled(monkeypatch):
    """A calibration may time a group's block faster than the model's share plus all-reduces (NCCL
    inside a host ran 1.2-5x faster than the ring over the ping-pong links predicts): the bound's
    tensor speed-up takes the timing, so a plan of that group stays above the bound."""
    from planner.search import bounds
    from planner.search.bounds import lower_bound_s

    job = load_job(ROOT / "topologies" / "local" / "h100-x4.yaml")
    group = tuple(job.topology.names)
    plan = Plan(layer_bounds=(0, job.model.layers), assignment=((group[0],),), micro_batches=(16,),
                micro_batch_size=2, schedule="1f1b", tensor_groups=(group,))
    costs = layer_costs(job.model, job.training, 2, 1)
    alone_s = costs.layer_flops / job.topology.effective_flops(job.training.precision)[0]  # one device's block
    fast = _with_timed_blocks(job.topology, ((4, ((1, alone_s / 7.0), (2, alone_s / 3.9))),))  # 3.9x at 2
    simulated = predict(plan, fast, job.model, job.training)[0].iteration_s
    assert simulated < predict(plan, job.topology, job.model, job.training)[0].iteration_s
    assert lower_bound_s(fast, job.model, job.training) <= simulated
    # the pair of this plan (1 stage, 1 replica): within the timing, and above it with the model's speed-up alone
    assert bounds._pair_bounds_s(fast, job.model, job.training)[1][0] <= simulated
    monkeypatch.setattr(bounds, "_timed_speedups", lambda *a: {})
    assert bounds._pair_bounds_s(fast, job.model, job.training)[1][0] > simulated


def test_the_lower_bound_takes_a_group_s_received_timing_where_it_is_the_faster():
    """A ZB-H1 plan's group runs without graphs and is priced by its calibration's received timings
    (``tensor_block_received_s``): where those are faster than the graphed ones, the bound's
    tensor speed-up takes them, so the plan stays above the bound."""
    from planner.search import bounds
    from planner.search.bounds import lower_bound_s

    job = load_job(ROOT / "topologies" / "local" / "h100-x4.yaml")
    group = tuple(job.topology.names)
    plan = Plan(layer_bounds=(0, job.model.layers), assignment=((group[0],),), micro_batches=(16,),
                micro_batch_size=2, schedule="zb-h1", tensor_groups=(group,))
    costs = layer_costs(job.model, job.training, 2, 1)
    alone_s = costs.layer_flops / job.topology.effective_flops(job.training.precision)[0]
    graphed = ((4, ((1, alone_s / 1.5), (2, alone_s / 1.2))),)  # slower than the model's share
    received = ((4, ((1, alone_s / 7.0), (2, alone_s / 3.9))),)
    topology = replace(job.topology, devices=tuple(replace(d, tensor_block_s=graphed, tensor_block_received_s=received)
                                                   for d in job.topology.devices))
    simulated = predict(plan, topology, job.model, job.training)[0].iteration_s
    assert simulated < predict(replace(plan, schedule="1f1b"), topology, job.model, job.training)[0].iteration_s
    # per sequence, the received table's least time is at micro-batch 2: alone_s / 3.9 / 2, a 3.9x group
    per_sequence = layer_costs(job.model, job.training, 1, 1)
    assert bounds._timed_speedups(topology, per_sequence, topology.effective_flops(job.training.precision))[4] == \
        pytest.approx(3.9, rel=1e-9)
    assert lower_bound_s(topology, job.model, job.training) <= simulated
    assert bounds._pair_bounds_s(topology, job.model, job.training)[1][0] <= simulated
