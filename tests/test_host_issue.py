"""The host's issue time: a calibration's seconds per block reach the devices, the simulator lets a
host run ahead of its device and charges it where it is slower, the search's estimate agrees on one
device, and a bad entry is one line."""

from dataclasses import replace

import numpy as np
import pytest
import yaml

from cost_models.simulator import simulate
from planner.cli import main
from planner.inputs.calibration import apply_calibration, read_calibration
from planner.inputs.host_issue import HostIssue
from planner.inputs.job import load_job
from tests.conftest import small_topology
from tests.test_simulator import _job


def test_a_block_s_host_seconds_per_mode():
    issue = HostIssue(forward_s=1.0, forward_backward_s=3.0, recomputed_s=4.5, split_s=6.0)
    assert issue.block_s(False) == (1.0, 2.0)
    assert issue.block_s(True) == (1.0, 3.5)  # the recomputed forward is issued again in the backward
    assert issue.block_s(False, True) == (2.0, 4.0)  # the split block's forward at the plain block's share
    assert issue.block_s(True, True) == pytest.approx((2.0, 7.0))  # 6 x 4.5 / 3 in all
    assert HostIssue().block_s(True, True) == (0.0, 0.0)


def test_a_host_faster_than_its_device_changes_nothing():
    plain = simulate(_job("1f1b", R=2, S=3, M=6, latency=0.1, bandwidth=2.0, sync=1.5))
    job = _job("1f1b", R=2, S=3, M=6, latency=0.1, bandwidth=2.0, sync=1.5)
    hosted = simulate(replace(job, host_forward_s=np.full((2, 3), 0.9), host_backward_s=np.full((2, 3), 1.9)))
    assert hosted.iteration_s == plain.iteration_s and hosted.records == plain.records


def test_a_host_slower_than_its_device_sets_the_pace():
    """One stage: every op ends when its host has issued it, so the iteration is the host's total."""
    job = _job("1f1b", S=1, M=5)
    hosted = simulate(replace(job, host_forward_s=np.full((1, 1), 1.5), host_backward_s=np.full((1, 1), 2.5)))
    assert hosted.iteration_s == pytest.approx(5 * (1.5 + 2.5))


def test_a_host_runs_ahead_while_its_device_waits():
    """Two stages, one micro-batch: the last stage's device waits 1 s for the activation, its host
    issues the forward meanwhile, so a 1.5 s issue of a 1 s forward costs nothing; a 2.5 s one ends
    the forward 0.5 s late (one op after another, as a device that waits for its host would, costs 0.5 more)."""
    base = simulate(_job("gpipe", S=2, M=1)).iteration_s
    assert base == pytest.approx(6.0)
    for issue, late in ((1.5, 0.0), (2.5, 0.5)):
        host = np.zeros((1, 2))
        host[0, 1] = issue
        job = replace(_job("gpipe", S=2, M=1), host_forward_s=host, host_backward_s=np.zeros((1, 2)))
        assert simulate(job).iteration_s == pytest.approx(base + late)


def _calibration(path, host_issue_s=None):
    from planner.inputs.catalog import device_type

    entry = {"efficiency": 0.5, "memory_bandwidth_bytes_per_s": device_type("A100-80GB").memory_bandwidth_bytes_per_s}
    if host_issue_s is not None:
        entry["host_issue_s"] = host_issue_s
    path.write_text(yaml.safe_dump({"format": "hetplan-calibration/1", "measured_at_utc": "2026-11-27T00:00:00+00:00",
                                    "device_types": {"A100-80GB": entry}}))
    return path


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_a_measured_host_issue_above_the_device_times_the_plan_by_its_host(tmp_path, write_yaml, schedule):
    """A host that takes 0.1 s per block (the device: milliseconds) makes a one-device plan take
    micro-batches x blocks x the host's seconds plus the optimizer step; ZB-H1 plans take the split
    block's issue time, others the plain block's. The search's estimate agrees."""
    from planner.plan.plan import Plan
    from planner.prediction.predict import predict
    from planner.search.evaluate import make_context, score_split

    job = load_job(write_yaml(small_topology()))
    training = replace(job.training, recompute=False, global_batch=8, precision="fp16", schedule=schedule)
    L = job.model.layers
    plan = Plan(layer_bounds=(0, L), assignment=(("fast-0",),), micro_batches=(8,), micro_batch_size=1,
                schedule=schedule)
    seconds = {"forward": 0.03, "forward_backward": 0.1, "recomputed": 0.12, "split": 0.15}
    plain = apply_calibration(job.topology, read_calibration(_calibration(tmp_path / "a.yaml")))
    hosted = apply_calibration(job.topology, read_calibration(_calibration(tmp_path / "b.yaml", seconds)))
    fast = hosted.devices[hosted.index("fast-0")]
    assert fast.host_issue == HostIssue(forward_s=0.03, forward_backward_s=0.1, recomputed_s=0.12, split_s=0.15)
    before, timeline = predict(plan, plain, job.model, training)
    after = predict(plan, hosted, job.model, training)[0].iteration_s
    step = timeline.breakdown_s["optimizer_s"]
    per_block = seconds["split" if schedule == "zb-h1" else "forward_backward"]
    assert after == pytest.approx(8 * L * per_block + step, rel=1e-9) and after > 10 * before.iteration_s
    ctx = make_context(hosted, job.model, training)
    assert score_split(ctx, np.array([[hosted.index("fast-0")]]), (L,), (8,), 1, schedule) == pytest.approx(after,
                                                                                                           rel=1e-9)


@pytest.mark.parametrize("change, field", [
    ({"forward": 0.2, "forward_backward": 0.1, "recomputed": 0.1, "split": 0.1}, "host_issue_s.forward"),
    ({"forward": 0.01, "forward_backward": "fast", "recomputed": 0.1, "split": 0.1}, "host_issue_s.forward_backward"),
    ({"forward": 0.01, "forward_backward": 0.1, "recomputed": 0.1}, "host_issue_s.split"),
    ({"forward": 0.01, "forward_backward": 0.1, "recomputed": 0.1, "split": 0.1, "extra": 1}, "host_issue_s"),
])
def test_a_bad_host_issue_entry_is_one_line(tmp_path, write_yaml, capsys, change, field):
    cal = _calibration(tmp_path / "cal.yaml", change)
    code = main([str(write_yaml(small_topology())), "--calibration", str(cal)])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "cal.yaml" in err and len(err.strip().splitlines()) == 1
