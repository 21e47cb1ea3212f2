"""An emulated straggler (``plan launch --emulate --slow DEVICE:FACTOR[@ITERATION]``): the run
names it, measures what it cost against the iterations before it, predicts that cost with the
simulator, and says how to re-plan around it."""

import pytest

from planner.errors import InputError
from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan

torch = pytest.importorskip("torch")

from planner.runtime.launch import LaunchOptions, launch, parse_slowdown  # noqa: E402

pytestmark = pytest.mark.runtime


def _plan(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    return write_test_plan(tmp_path, topology, assignment=[["a0", "b2"]], layer_bounds=[0, 2, 4], micro_batches=[4],
                           micro_batch_size=4, schedule="1f1b")


def test_a_slowed_device_is_named_and_its_cost_measured_as_the_simulator_predicts(tmp_path):
    plan = _plan(tmp_path)
    lines = []
    results = launch(plan, LaunchOptions(backend="gloo", iterations=4, warmup=1, out_dir=str(tmp_path / "run"),
                                         emulate=True, time_scale=20.0, slow="b2:3@4"), log=lines.append)
    record = results["emulation"]["straggler"]
    assert record["device"] == "b2" and record["factor"] == 3.0 and record["from_iteration"] == 4
    before, after = record["measured_before_s"], record["measured_after_s"]  # iterations 2-3 against 4-5
    assert before == pytest.approx(record["predicted_s"], rel=0.25)
    assert record["predicted_with_straggler_s"] > 1.5 * record["predicted_s"]
    assert after == pytest.approx(record["predicted_with_straggler_s"], rel=0.25)
    assert record["cost_s"] == pytest.approx(after - before)
    summary = next(line for line in lines if line.startswith("straggler: b2"))
    assert "3x slower from iteration 4" in summary and "--from" in summary and "efficiency:" in summary
    assert not results["emulation"]["compute_overrun"]["warning"] or "overran" in results["emulation"][
        "compute_overrun"]["warning"]


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
