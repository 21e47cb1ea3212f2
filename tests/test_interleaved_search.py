"""Interleaved 1F1B in the search (``planner.search.interleave``): the estimate charges it as the
simulator does, ``virtual_stages: auto`` picks v > 1 where the bubble dominates and messages are
cheap and v = 1 where they are slow, a fixed v that cannot hold is refused in one line, the same
seed and budget give the same plan, and the written plan validates and launches."""

from dataclasses import replace

import numpy as np
import pytest
import yaml

from planner.inputs.job import load_job
from planner.plan.plan import Plan, interleave_plan, validate_plan
from planner.prediction.predict import predict
from planner.search.evaluate import make_context, score_split
from planner.search.front import SearchOptions, search
from planner.search.interleave import multiple_split
from tests.conftest import ROOT

H100_X4 = ROOT / "topologies" / "local" / "h100-x4.yaml"
LAB = ROOT / "topologies" / "hetero" / "lab-mixed-a40-l4.yaml"


def _estimate_and_simulation(path, counts, micro_batches, v, overrides=None) -> tuple:
    job = load_job(path, training_overrides=overrides or {})
    size = job.training.micro_batch_size or 1
    training = replace(job.training, shard_optimizer=False, recompute=True, schedule="1f1b", micro_batch_size=size,
                       global_batch=size * sum(micro_batches))
    S, R = len(counts), len(micro_batches)
    assign = np.arange(S * R).reshape(R, S)
    names = job.topology.names
    plan = Plan(layer_bounds=tuple(np.concatenate([[0], np.cumsum(counts)]).tolist()),
                assignment=tuple(tuple(names[d] for d in row) for row in assign), micro_batches=tuple(micro_batches),
                micro_batch_size=training.micro_batch_size, schedule="1f1b")
    plan = interleave_plan(plan, v) if v > 1 else plan
    estimate = score_split(make_context(job.topology, job.model, training), assign, tuple(counts),
                           tuple(micro_batches), training.micro_batch_size, "1f1b", virtual_stages=v)
    return estimate, predict(plan, job.topology, job.model, training)[0].iteration_s


@pytest.mark.parametrize("path, counts, micro_batches, v", [
    (H100_X4, [6, 6, 6, 6], [4], 2), (H100_X4, [6, 6, 6, 6], [16], 3), (H100_X4, [5, 6, 6, 7], [16], 2),
    (H100_X4, [12, 12], [8, 8], 4), (LAB, [8] * 4, [16], 2), (LAB, [4] * 8, [16], 2), (LAB, [4] * 8, [32], 4),
])
def test_the_estimate_charges_interleaving_as_the_simulator_does(path, counts, micro_batches, v):
    """Within 5% of the simulated iteration on even and uneven stages, NVLink and the lab's mixed
    links, and well below plain 1F1B's estimate where the simulator says interleaving gains."""
    estimate, simulated = _estimate_and_simulation(path, counts, micro_batches, v)
    assert estimate == pytest.approx(simulated, rel=0.05)
    plain_estimate, plain_simulated = _estimate_and_simulation(path, counts, micro_batches, 1)
    if simulated < 0.98 * plain_simulated:
        assert estimate < plain_estimate


@pytest.mark.parametrize("bandwidth, latency", [("1Gbps", "2ms"), ("10Gbps", "1ms")])
def test_where_messages_bind_the_estimate_errs_against_interleaving(tmp_path, bandwidth, latency):
    """On 1 and 10 Gbit/s links v times the messages bind: the estimate charges each micro-batch's
    whole trip of S v - 1 piece boundaries, more than the simulator's queues take (9-46% above it),
    never less, so the search ranks interleaving after plain 1F1B there; the simulator judges the
    finalists."""
    _four_devices(tmp_path, bandwidth, latency)
    path = tmp_path / f"four-{bandwidth}.yaml"
    for micro_batches in ([4], [16]):
        plain = _estimate_and_simulation(path, [6, 6, 6, 6], micro_batches, 1)
        for v in (2, 3):
            estimate, simulated = _estimate_and_simulation(path, [6, 6, 6, 6], micro_batches, v)
            assert simulated <= estimate <= 1.5 * simulated
            assert estimate > plain[0]


def test_uneven_chunks_are_charged_their_largest_chunk():
    """6 layers in 4 chunks (2, 2, 1, 1) drain like 3 chunks of 2: the estimate, as the simulator,
    gains nothing from v = 4 over v = 3 on equal stages."""
    three = _estimate_and_simulation(H100_X4, [6, 6, 6, 6], [16], 3)
    four = _estimate_and_simulation(H100_X4, [6, 6, 6, 6], [16], 4)
    assert four[1] == pytest.approx(three[1], rel=0.01)
    assert four[0] == pytest.approx(four[1], rel=0.01) and four[0] >= three[0]


def _four_devices(tmp_path, bandwidth: str, latency: str):
    """Four H100s on four hosts joined by ``bandwidth`` links; GPT-3 XL, 4 micro-batches of 2."""
    document = {"name": "four-hosts", "devices": [{"name": f"gpu-{i}", "type": "H100-SXM", "host": f"h{i}"}
                                                  for i in range(4)],
                "network": {"host": {"latency": "10us", "bandwidth": "450GB/s"},
                            "region": {"latency": latency, "bandwidth": bandwidth}},
                "model": "gpt3-xl",
                "training": {"global_batch": 8, "micro_batch_size": 2, "precision": "bf16", "schedule": "1f1b",
                             "recompute": False, "flash_attention": True, "virtual_stages": "auto"}}
    path = tmp_path / f"four-{bandwidth}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_job(path)


OPTIONS = SearchOptions(seed=0, time_limit_s=20.0, budget_s=1.0, stages=4, exact=False)


def test_auto_interleaves_where_the_bubble_dominates_and_not_where_messages_are_slow(tmp_path):
    """Four stages, four micro-batches: on 400 Gbit/s links the search interleaves (the bubble is 3 of
    7 slots of plain 1F1B) and its plan is faster than plain 1F1B's; on 1 Gbit/s links v times the
    messages cost more than the bubble saves and it keeps v = 1."""
    fast = _four_devices(tmp_path, "400Gbps", "10us")
    result = search(fast.topology, fast.model, fast.training, OPTIONS)
    plain = search(fast.topology, fast.model, replace(fast.training, virtual_stages=1), OPTIONS)
    assert result.plan.virtual_stages > 1 and result.training.virtual_stages == result.plan.virtual_stages
    assert result.predicted_s < 0.9 * plain.predicted_s
    assert all(len(result.plan.chunk_layers(s)) == result.plan.virtual_stages for s in range(4))
    validate_plan(result.plan, fast.topology, fast.model, result.training)
    from planner.report.text import render_plan

    text = render_plan(result.plan, fast.topology, fast.model, result.training)
    assert f"interleaved over {result.plan.virtual_stages} virtual stages" in text
    assert "Virtual stages tried (the best simulated finalist of each): v = 1: " in text
    slow = _four_devices(tmp_path, "1Gbps", "2ms")
    result = search(slow.topology, slow.model, slow.training, OPTIONS)
    assert result.plan.stages == 4 and result.plan.virtual_stages == 1
    tried = [f for f in result.plan.search["finalists"] if f.get("virtual_stages", 1) > 1]
    assert tried and min(f["simulated_s"] for f in tried) > result.predicted_s  # tried, and slower


def test_the_same_seed_and_budget_give_the_same_interleaved_plan(tmp_path):
    from planner.plan.document import plan_to_document

    job = _four_devices(tmp_path, "400Gbps", "10us")
    documents = []
    for _ in range(2):
        result = search(job.topology, job.model, job.training, OPTIONS)
        plan = replace(result.plan, search={})
        documents.append(plan_to_document(plan, model=job.model, training=result.training))
    assert documents[0] == documents[1] and documents[0]["virtual_stages"] > 1


@pytest.mark.parametrize("micro_batches, stages, expected", [
    ((5, 3), 2, (6, 2)), ((6, 2), 2, (6, 2)), ((7, 5, 4), 4, (8, 4, 4)), ((16,), 4, (16,)), ((5,), 2, None), ((1, 1, 2), 4, None),
])
def test_micro_batches_round_to_multiples_of_s(micro_batches, stages, expected):
    assert multiple_split(micro_batches, stages) == expected


def _cli_topology(tmp_path, **training):
    from tests.runtime_helpers import cpu_topology

    topology = cpu_topology(tmp_path / "topology.yaml")
    document = yaml.safe_load(topology.read_text())
    document["training"] = {"global_batch": 8, "micro_batch_size": 1, "precision": "fp32", **training}
    document["model"] = "tiny"
    topology.write_text(yaml.safe_dump(document))
    return topology


@pytest.mark.parametrize("training, argv, words", [
    ({}, ["--schedule", "gpipe"], "set schedule 1f1b or virtual_stages 1"),
    ({"compress_messages": "int8"}, [], "set compress_messages off"),
    ({}, ["--tensor-degrees", "2"], "tensor groups only"),
    ({"global_batch": 7}, ["--stages", "2"], "multiples of 2 stages"),
    ({}, ["--stages", "3"], "do not give 3 stages 2 chunks"),
    ({}, ["--stages", "1"], "at least 2 stages"),
    ({}, ["--objective", "dtfm"], "one chunk per device"),
])
def test_a_fixed_virtual_stage_count_that_cannot_hold_is_refused_in_one_line(tmp_path, capsys, training, argv, words):
    from tests.runtime_helpers import run_cli

    topology = _cli_topology(tmp_path, **training)
    code, out, err = run_cli([topology, "--virtual-stages", "2", "--time-limit", "5", *argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert words in err and "virtual_stages" in err


@pytest.mark.parametrize("value", ["0", "17", "two"])
def test_a_bad_virtual_stages_option_is_refused_in_one_line(tmp_path, capsys, value):
    from tests.runtime_helpers import run_cli

    code, out, err = run_cli([_cli_topology(tmp_path), "--virtual-stages", value], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--virtual-stages" in err


def test_a_fixed_virtual_stage_count_is_planned_written_and_read_back(tmp_path, capsys):
    """``--virtual-stages 2`` on the six CPU devices and the tiny model (4 layers): a 2-stage plan of
    2 chunks per device, its chunks in the file, the report and the plan's training section, and
    the file validates against the topology and the JSON Schema."""
    import jsonschema

    from planner.io import read_yaml
    from planner.plan.document import plan_from_document
    from tests.runtime_helpers import run_cli
    from tests.test_tensor_parallel import PLAN_SCHEMA

    topology = _cli_topology(tmp_path)
    out_path = tmp_path / "plan.yaml"
    code, out, err = run_cli([topology, "--virtual-stages", "2", "--time-limit", "10", "--budget", "1",
                              "-o", out_path], capsys)
    assert code == 0, err
    document = read_yaml(out_path)
    jsonschema.validate(document, PLAN_SCHEMA)
    assert document["virtual_stages"] == 2 and document["training"]["virtual_stages"] == 2
    assert all(len(stage["chunks"]) == 2 for stage in document["stages"])
    assert "interleaved over 2 virtual stages per device" in out and "+[" in out
    plan = plan_from_document(document)
    job = load_job(topology, training_overrides={"virtual_stages": 2})
    validate_plan(plan, job.topology, job.model, replace(job.training, virtual_stages=2))
    assert all(m % plan.stages == 0 for m in plan.micro_batches)


@pytest.mark.slow
def test_the_searched_interleaved_plan_launches(tmp_path, capsys):
    """The plan ``--virtual-stages 2`` writes runs on the CPU devices (gloo, emulated): every stage
    runs both its chunks' backwards and the run ends with a finite loss."""
    import math

    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import run_cli

    out_path = tmp_path / "plan.yaml"
    code, out, err = run_cli([_cli_topology(tmp_path), "--virtual-stages", "2", "--time-limit", "10", "--budget", "1",
                              "-o", out_path], capsys)
    assert code == 0, err
    results = launch(out_path, LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(tmp_path / "run"),
                                             emulate=True, time_scale=20.0), log=lambda line: None)
    stages = yaml.safe_load(out_path.read_text())["degrees"]["pipeline"]
    assert {(op["stage"], op["chunk"]) for op in results["measured"]["trace"] if op["kind"] == "bwd"} == \
        {(s, c) for s in range(stages) for c in range(2)}
    assert math.isfinite(results["comparison"]["measured_s"])


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1"])
def test_auto_chunks_under_a_schedule_that_cannot_interleave_is_refused(tmp_path, capsys, schedule):
    """``auto`` asks for interleaving where it pays; under GPipe or ZB-H1 it never could."""
    from tests.runtime_helpers import run_cli

    code, out, err = run_cli([_cli_topology(tmp_path), "--virtual-stages", "auto", "--schedule", schedule], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is auto" in err and "set schedule 1f1b or auto" in err
