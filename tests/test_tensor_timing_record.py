"""Iteration time of tensor-group plans on real GPUs against the recorded runs: the 4x H200 runs of
``benchmarks/results/accuracy_gpu4_h200_tensor`` (calibrated on the host that ran them; the group's
block timed at micro-batches 1, 2, 4 and 8 per degree) re-predicted as they were recorded, and
without the timed blocks (the share of the compute plus the all-reduces, and the floor) for
comparison. No GPU needed: the plans, calibration and measurements are committed."""

import json
import shutil
from dataclasses import replace

import pytest
import yaml

from conftest import ROOT
from planner.prediction.predict import predict
from planner.runtime.inputs import load_run_inputs

RUNS = ROOT / "benchmarks" / "results" / "accuracy_gpu4_h200_tensor"
# The one host-bound case: a member's share of a block at micro-batch 4 over a group of 4 is shorter
# than its host takes to issue it; the same plan measured 0.543, 0.606 and 0.668 s in three runs on
# two hosts (``accuracy_gpu4_h200_tensor_repeat``), the timing it is predicted from swings with them.
HOST_BOUND = {"1x1-mb4-tensor-4"}


def _recorded():
    rows = json.loads((RUNS.parent / "accuracy_gpu4_h200_tensor.json").read_text())["rows"]
    return [r for r in rows if (RUNS / r["label"] / "results.json").is_file()]


def _inputs(label: str, tmp_path):
    results = json.loads((RUNS / label / "results.json").read_text())
    plan = tmp_path / f"{label}.yaml"
    plan.write_text(yaml.safe_dump(results["plan"]))
    shutil.copy(RUNS / "calibration.yaml", tmp_path / "calibration.yaml")
    return load_run_inputs(plan, ROOT / results["plan"]["topology"]["path"]), results["run"]["compiled"]


@pytest.mark.parametrize("row", _recorded(), ids=lambda r: r["label"])
def test_recorded_tensor_runs_are_predicted_from_the_timed_blocks(row, tmp_path):
    inputs, compiled = _inputs(row["label"], tmp_path)
    assert any(d.tensor_block_s for d in inputs.topology.devices)  # the calibration timed the groups
    now = predict(inputs.plan, inputs.topology, inputs.model, inputs.training, compiled=compiled)[0].iteration_s
    assert now == pytest.approx(row["predicted_s"], rel=1e-6)  # as recorded
    error = now / row["measured_s"] - 1
    untimed = replace(inputs.topology, devices=tuple(replace(d, tensor_block_s=()) for d in inputs.topology.devices))
    before = predict(inputs.plan, untimed, inputs.model, inputs.training, compiled=compiled)[0].iteration_s
    if row["label"] in HOST_BOUND:
        assert abs(error) < 0.25
    else:
        assert abs(error) <= 0.05
        assert abs(error) < abs(before / row["measured_s"] - 1)  # the share + all-reduces model was further off
