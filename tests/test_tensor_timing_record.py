"""Iteration time of tensor-group plans on real GPUs against the recorded runs: the 4x H200 runs of
``benchmarks/results/accuracy_gpu4_h200_tensor`` (compiled; calibrated on the host that ran them; the
group's block timed at micro-batches 1, 2, 4 and 8 per degree) and of ``accuracy_gpu4_h200_graphs``
and the 4x H100 ``accuracy_gpu4_h100_graphs`` (the group's blocks replayed as CUDA graphs, timed so by
its calibration) re-predicted as they were
recorded, and without the timed blocks (the share of the compute plus the all-reduces, and the
floor) for comparison. No GPU needed: the plans, calibrations and measurements are committed."""

import json
import shutil
from dataclasses import replace

import pytest
import yaml

from conftest import ROOT
from planner.prediction.predict import predict
from planner.runtime.inputs import load_run_inputs

RESULTS = ROOT / "benchmarks" / "results"
RECORDS = ("accuracy_gpu4_h200_tensor", "accuracy_gpu4_h200_graphs", "accuracy_gpu4_h100_graphs")
# A second stage's tensor group ran as CUDA graphs, and one member re-recorded them every iteration
# (6.36 s instead of 0.43 s); such a stage is no longer graphed (``planner.runtime.graphs``), so the
# run times nothing a launch now runs.
NOT_RUN_SO_NOW = {"accuracy_gpu4_h100_graphs/2x1-mb4-tensor-2"}
# The one host-bound case: compiled without graphs, a member's share of a block at micro-batch 4 over
# a group of 4 is shorter than its host takes to issue it; the same plan measured 0.543, 0.606 and
# 0.668 s in three runs on two hosts (``accuracy_gpu4_h200_tensor_repeat``), the timing it is
# predicted from swings with them. Replayed as CUDA graphs, the host issues a block in a third of it.
HOST_BOUND = {"accuracy_gpu4_h200_tensor/1x1-mb4-tensor-4"}


def _recorded():
    return [(record, row) for record in RECORDS
            for row in json.loads((RESULTS / f"{record}.json").read_text())["rows"]
            if (RESULTS / record / row["label"] / "results.json").is_file()
            and f"{record}/{row['label']}" not in NOT_RUN_SO_NOW]


def _inputs(record: str, label: str, tmp_path):
    results = json.loads((RESULTS / record / label / "results.json").read_text())
    plan = tmp_path / f"{label}.yaml"
    plan.write_text(yaml.safe_dump(results["plan"]))
    shutil.copy(RESULTS / record / "calibration.yaml", tmp_path / "calibration.yaml")
    return load_run_inputs(plan, ROOT / results["plan"]["topology"]["path"]), results["run"]["compiled"]


@pytest.mark.parametrize("record, row", _recorded(), ids=lambda r: r if isinstance(r, str) else r["label"])
def test_recorded_tensor_runs_are_predicted_from_the_timed_blocks(record, row, tmp_path):
    inputs, compiled = _inputs(record, row["label"], tmp_path)
    assert any(d.tensor_block_s for d in inputs.topology.devices)  # the calibration timed the groups
    now = predict(inputs.plan, inputs.topology, inputs.model, inputs.training, compiled=compiled)[0].iteration_s
    assert now == pytest.approx(row["predicted_s"], rel=1e-6)  # as recorded
    error = now / row["measured_s"] - 1
    untimed = replace(inputs.topology, devices=tuple(replace(d, tensor_block_s=()) for d in inputs.topology.devices))
    before = predict(inputs.plan, untimed, inputs.model, inputs.training, compiled=compiled)[0].iteration_s
    if f"{record}/{row['label']}" in HOST_BOUND:
        assert abs(error) < 0.25
    else:
        assert abs(error) <= 0.05
        assert abs(error) < abs(before / row["measured_s"] - 1)  # the share + all-reduces model was further off


def test_graphs_take_the_host_out_of_the_host_bound_group():
    """The host-bound plan, its group's blocks replayed as CUDA graphs: faster than every compiled
    measurement of it, and predicted within 1% where the compiled run was 20% off."""
    def row(record):
        return next(r for r in json.loads((RESULTS / f"{record}.json").read_text())["rows"]
                    if r["label"] == "1x1-mb4-tensor-4")

    graphed, compiled = row("accuracy_gpu4_h200_graphs"), row("accuracy_gpu4_h200_tensor")
    repeats = [json.loads((RESULTS / "accuracy_gpu4_h200_tensor_repeat" / run / "results.json").read_text())
               ["comparison"]["measured_s"] for run in ("1x1-mb4-tensor-4-1",)]
    assert graphed["graphs"] == "tensor" and compiled.get("graphs") is None
    assert graphed["measured_s"] < min([compiled["measured_s"], *repeats])
    assert abs(graphed["error"]) < 0.01 and abs(compiled["error"]) > 0.2


def test_a_received_tensor_group_is_not_graphed_since_one_member_re_recorded_its_graphs():
    """The recorded run behind the rule: its second stage's group was graphed and ran 15x its
    prediction, the first stage's as predicted; a launch now graphs only the first stage's group."""
    from planner.runtime.graphs import Graphed, stage_graphed

    results = json.loads((RESULTS / "accuracy_gpu4_h100_graphs" / "2x1-mb4-tensor-2" / "results.json").read_text())
    assert results["run"]["graphed_stages"] == [0, 1] and results["comparison"]["measured_s"] > 10 * \
        results["comparison"]["predicted_s"]
    workers = {w["stage"]: w for w in results["straggler"]["workers"]}
    assert max(workers[1]["measured_compute_s"]) > 10 * workers[1]["predicted_compute_s"]
    assert max(workers[0]["measured_compute_s"]) < 1.05 * workers[0]["predicted_compute_s"]
    assert [stage_graphed(Graphed.TENSOR, 2, receives=stage > 0) for stage in (0, 1)] == [True, False]
