"""Stragglers found from what the ranks measured (``planner.runtime.straggler``): each worker's
forward and backward time against the plan's prediction of them, compared with the other workers'.
``plan launch --emulate --slow DEVICE:FACTOR[@ITERATION]`` makes one; the report names it from the
measurements, says what it cost and how to re-plan around it; a run with nothing slow names nobody,
and a device slower than its plan says is named without ``--slow``."""

import numpy as np
import pytest

from planner.errors import InputError
from planner.runtime.straggler import MIN_SLOW_ITERATIONS, STRAGGLER_RATIO, find_straggler
from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan

torch = pytest.importorskip("torch")

from planner.runtime.launch import LaunchOptions, launch, parse_slowdown  # noqa: E402

pytestmark = pytest.mark.runtime


def _plan(tmp_path, **topology):
    topology = cpu_topology(tmp_path / "topology.yaml", **topology)
    return write_test_plan(tmp_path, topology, assignment=[["a0", "b2"]], layer_bounds=[0, 2, 4], micro_batches=[4],
                           micro_batch_size=4, schedule="1f1b")


def _noisy(rng, workers: int, iterations: int, predicted) -> np.ndarray:
    """Measured compute as predicted, with +-10% noise per worker and iteration."""
    return np.asarray(predicted, dtype=float)[:, None] * rng.uniform(0.9, 1.1, size=(workers, iterations))


def test_a_worker_slow_from_an_iteration_on_is_found_with_its_factor():
    rng = np.random.default_rng(0)
    predicted = np.array([0.4, 0.5, 0.45, 0.6])  # stages differ: each worker against its own prediction
    measured = _noisy(rng, 4, 8, predicted)
    measured[2, 3:] *= 2.0
    found = find_straggler(measured, predicted)
    assert (found.worker, found.first, found.last) == (2, 3, 7)
    assert found.factor == pytest.approx(2.0, rel=0.15)


def test_nothing_is_named_for_noise_a_one_iteration_pause_or_a_prediction_off_for_every_worker():
    rng = np.random.default_rng(1)
    predicted = np.array([0.4, 0.5, 0.45])
    measured = _noisy(rng, 3, 8, predicted)
    assert find_straggler(measured, predicted) is None
    paused = measured.copy()
    paused[1, 5] *= 5.0  # one iteration alone: a pause of the host, not a slow device
    assert MIN_SLOW_ITERATIONS >= 2 and find_straggler(paused, predicted) is None
    assert find_straggler(measured * 1.8, predicted) is None  # every worker 1.8x the plan: the prediction, not one device
    exact = np.repeat(predicted[:, None], 6, axis=1)
    exact[0, 2:] *= 0.96 * STRAGGLER_RATIO  # just under the threshold: not named; just over: named
    assert find_straggler(exact, predicted) is None
    exact[0, 2:] *= 1.05 / 0.96
    assert find_straggler(exact, predicted).worker == 0


def test_a_worker_slower_than_its_plan_from_the_start_is_found_and_one_worker_cannot_be():
    measured = np.array([[0.40, 0.41, 0.40], [0.40, 0.40, 0.39]])
    predicted = np.array([0.40, 0.10])  # the plan thought the second 4x faster
    found = find_straggler(measured, predicted)
    assert (found.worker, found.first, found.last) == (1, 0, 2) and found.factor == pytest.approx(4.0, rel=0.05)
    assert find_straggler(measured[:1], predicted[:1]) is None


def _reports(job, workers: dict, iterations: int, scale: float, slow: dict, step_wait_s: float) -> list:
    """Rank reports as the workers send them: per iteration, each op for each micro-batch lasting the
    plan's time (times ``slow[rank]`` from iteration ``slow[rank][1]`` on, 0-based), a receive, and
    a step that also waits ``step_wait_s`` (a sharded optimizer's all-gather)."""
    from cost_models.simulator import op_compute_s

    reports = []
    for rank, (replica, stage, member) in workers.items():
        traces = []
        for k in range(iterations):
            factor = slow[rank][0] if rank in slow and k >= slow[rank][1] else 1.0
            clock, trace = 0.0, []
            ops = [("recv_fwd", 0)] + [(kind, mb) for kind in ("fwd", "bwd") for mb in range(4)] + [("step", -1)]
            for kind, mb in ops:
                seconds = op_compute_s(job, kind, replica, stage) * scale * factor if kind != "recv_fwd" else 0.01
                seconds += step_wait_s if kind == "step" else 0.0
                trace.append((kind, mb, clock, clock + seconds, 0, 1e-4))
                clock += seconds
            traces.append(trace)
        reports.append({"rank": rank, "replica": replica, "stage": stage, "member": member, "traces": traces})
    return reports


def test_a_tensor_group_is_named_as_a_whole_and_a_calibrated_plan_is_told_to_lower_the_peak(tmp_path):
    from dataclasses import replace

    from planner.prediction.predict import build_pipeline_job
    from planner.runtime.inputs import load_run_inputs
    from planner.runtime.straggler import straggler_report

    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b2"]], tensor_groups=[["a0", "a1"]],
                           layer_bounds=[0, 2, 4], micro_batches=[4], micro_batch_size=4, schedule="1f1b")
    inputs = load_run_inputs(plan)
    job = build_pipeline_job(inputs.plan, inputs.topology, inputs.model, inputs.training)
    # a1 (member 1 of stage 0's group) computes 2x from the third measured iteration; b2's step waits long
    reports = _reports(job, {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 1, 0)}, 5, 10.0, {1: (2.0, 2)}, step_wait_s=5.0)
    times = [1.0, 1.0, 1.5, 1.5, 1.5]
    record = straggler_report(inputs, job, reports, times, 10.0, 2, 0.9)
    assert [w["worker"] for w in record["workers"]] == ["a0", "b2"]  # one worker per group, the step left out
    assert record["device"] == "a0" and record["members"] == ["a0", "a1"] and record["from_iteration"] == 5
    assert record["factor"] == pytest.approx(2.0) and record["cost_s"] == pytest.approx(0.5)
    assert record["lost_s"] == pytest.approx(1.5) and record["replan_efficiency"] == pytest.approx(
        {"a0": 0.15, "a1": 0.15})
    assert "tensor group a0, a1" in record["summary"] and "efficiency: 0.15 on a0, efficiency: 0.15 on a1" in record[
        "summary"]
    calibrated = replace(inputs, plan=replace(inputs.plan, calibration={"path": "cal.yaml", "sha256": "0"}))
    record = straggler_report(calibrated, job, reports, times, 10.0, 2, 0.9)
    assert record["replan_peak_flops"] == pytest.approx({"a0": 25e9, "a1": 25e9})
    assert "peak_flops: 25GFLOP/s on a0" in record["summary"]


@pytest.mark.slow
def test_an_emulated_straggler_is_named_from_the_measurements_with_what_it_cost(tmp_path):
    plan = _plan(tmp_path)
    lines = []
    results = launch(plan, LaunchOptions(backend="gloo", iterations=4, warmup=1, out_dir=str(tmp_path / "run"),
                                         emulate=True, time_scale=20.0, slow="b2:3@4"), log=lines.append)
    record = results["straggler"]
    workers = {w["worker"]: w for w in record["workers"]}
    # measured iterations 2-5: b2's forward and backward took 3x the plan's from iteration 4, a0's as planned
    assert [r >= STRAGGLER_RATIO for r in workers["b2"]["ratio_to_others"]] == [False, False, True, True]
    assert record["device"] == "b2" and record["from_iteration"] == 4 and record["to_iteration"] == 5
    assert record["factor"] == pytest.approx(3.0, rel=0.1)
    before, after = record["measured_before_s"], record["measured_after_s"]
    assert before == pytest.approx(record["predicted_s"], rel=0.25)
    assert record["predicted_with_straggler_s"] > 1.5 * record["predicted_s"]
    assert after == pytest.approx(record["predicted_with_straggler_s"], rel=0.25)
    assert record["cost_s"] == pytest.approx(after - before)
    assert record["replan_efficiency"]["b2"] == pytest.approx(0.3 / record["factor"])
    assert results["emulation"]["slowdown"] == {"device": "b2", "factor": 3.0, "from_iteration": 4, "detected": True,
                                                "after_last_iteration": False}
    summary = next(line for line in lines if line.startswith("straggler: b2"))
    # the efficiency the summary suggests is the record's (0.3 / a measured factor near 3: 0.1 or 0.0999)
    assert "from iteration 4 to 5" in summary and "--from" in summary
    assert f"efficiency: {record['replan_efficiency']['b2']:.3g} on b2" in summary, summary
    assert not results["emulation"]["compute_overrun"]["warning"] or "overran" in results["emulation"][
        "compute_overrun"]["warning"]


@pytest.mark.slow
def test_a_run_with_nothing_slow_names_no_straggler(tmp_path):
    plan = _plan(tmp_path)
    lines = []
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(tmp_path / "run"),
                                         emulate=True, time_scale=20.0), log=lines.append)
    record = results["straggler"]
    assert record["device"] is None and record["summary"].startswith("no straggler")
    assert all(max(w["ratio_to_others"]) < STRAGGLER_RATIO for w in record["workers"])
    assert not any("straggler" in line for line in lines) and "slowdown" not in results["emulation"]


def test_a_device_slower_than_the_plan_says_is_named_without_slow(tmp_path):
    """Not emulated: both ranks compute on this CPU, but the topology the plan was made on says b2
    is 8 times faster, so its measured compute against the plan's stands out from the first
    measured iteration."""
    plan = _plan(tmp_path, slow_peak="400GFLOPS")
    lines = []
    results = launch(plan, LaunchOptions(backend="gloo", iterations=4, warmup=1, out_dir=str(tmp_path / "run")),
                     log=lines.append)
    record = results["straggler"]
    assert record["device"] == "b2" and record["factor"] > 2.0, record["summary"]
    assert record["first_measured"] and record["from_iteration"] == 2 and record["measured_before_s"] is None
    # no iteration before it: the iteration without it is estimated by the simulator's ratio
    assert record["without_straggler_s"] == pytest.approx(
        record["measured_after_s"] * record["predicted_s"] / record["predicted_with_straggler_s"])
    assert record["cost_s"] > 0
    assert "emulation" not in results
    assert any(line.startswith("straggler: b2") and "the first measured" in line for line in lines)


@pytest.mark.parametrize("text", ["b2", "b2:x", "b2:0", "b2:2@0", ":2"])
def test_a_bad_slowdown_is_one_line(text):
    with pytest.raises(InputError) as error:
        parse_slowdown(text)
    assert "--slow" in str(error.value)


def test_the_cli_refuses_a_device_the_plan_does_not_use_and_slow_without_emulate(tmp_path, capsys):
    plan = _plan(tmp_path)
    code, out, err = run_cli(["launch", plan, "--emulate", "--slow", "a1:2", "--out", tmp_path / "r1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "field '--slow'" in err and "a1 is not a device" in err, err
    code, out, err = run_cli(["launch", plan, "--slow", "b2:2", "--out", tmp_path / "r2"], capsys)
    assert code == 2 and "add --emulate" in err, err
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_a_straggler_named_while_the_host_overran_the_plan_is_told_to_rerun_first():
    """An emulated run whose host ran past the plan's compute times can name a worker slow for the
    host's load: the launch says to rerun at the suggested time scale before re-planning; without
    the overrun, or with an emulated straggler, it says the summary only."""
    from planner.runtime.launch import _say_straggler

    found = {"device": "paris-4090", "summary": "paris-4090 computed 1.6x slower ..."}
    overrun = {"warning": "this host overran the plan's compute times: ...", "suggested_time_scale": 0.117}
    for emulation, told in (({"compute_overrun": overrun}, True), ({"compute_overrun": {"warning": ""}}, False),
                            ({"compute_overrun": overrun, "slowdown": {"device": "paris-4090", "detected": True}},
                             False)):
        lines = []
        _say_straggler({"straggler": found, "emulation": emulation}, lines.append)
        assert lines[0] == found["summary"]
        assert any("rerun with --time-scale 0.117 before re-planning around paris-4090" in line
                   for line in lines) == told
