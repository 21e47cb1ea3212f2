"""Calibration files: round trip through the planner and the launcher, measured links in a topology,
refusals, and a real ``plan calibrate`` on this machine's CPU."""

import json

import numpy as np
import pytest
import yaml

from planner.inputs.calibration import apply_calibration, read_calibration
from planner.cli import main
from planner.errors import InputError
from planner.inputs.job import load_job
from tests.conftest import small_topology


def _calibration(path, *, efficiency=0.2, latency_us=50.0, bandwidth=2e9, names=("fast-0", "slow-0"), kind="T4"):
    n = len(names)
    document = {
        "format": "hetplan-calibration/1", "measured_at_utc": "2026-11-26T00:00:00+00:00", "host": "test",
        "how": "written by the test", "torch": "none", "backend": "gloo",
        "device_types": {kind: {"efficiency": efficiency, "memory_bandwidth_bytes_per_s": 1e11,
                                "measured": {"note": "synthetic"}}},
        "network": {"devices": list(names),
                    "latency_s": (latency_us * 1e-6 * (1 - np.eye(n))).tolist(),
                    "bandwidth_bytes_per_s": (bandwidth * (1 - np.eye(n))).tolist(),
                    "message_overhead_s": latency_us * 1e-6, "probe": {}},
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_fit_recovers_latency_and_bandwidth():
    pytest.importorskip("torch")
    from planner.runtime.calibrate import fit_latency_bandwidth

    sizes = [1e3, 1e5, 1e6, 1e7]
    latency, bandwidth = fit_latency_bandwidth(sizes, [2 * 30e-6 + n / 5e9 for n in sizes])
    assert latency == pytest.approx(30e-6, rel=1e-6) and bandwidth == pytest.approx(5e9, rel=1e-6)


def test_calibration_changes_the_devices_it_measured_only(tmp_path, write_yaml):
    job = load_job(write_yaml(small_topology()))
    calibration = read_calibration(_calibration(tmp_path / "cal.yaml", efficiency=0.2))
    calibrated = apply_calibration(job.topology, calibration)
    for before, after in zip(job.topology.devices, calibrated.devices):
        if before.type_name == "T4":
            assert after.efficiency == 0.2 and after.memory_bandwidth_bytes_per_s == 1e11
        else:
            assert after == before


def test_plan_records_its_calibration_and_launch_uses_or_refuses_it(tmp_path, write_yaml, capsys):
    topology = write_yaml(small_topology())
    cal = _calibration(tmp_path / "cal.yaml", efficiency=0.05, kind="A100-80GB")
    plain, calibrated = tmp_path / "plain.json", tmp_path / "calibrated.json"
    assert main([str(topology), "-o", str(plain), "--time-limit", "5"]) == 0
    assert main([str(topology), "-o", str(calibrated), "--time-limit", "5", "--calibration", str(cal)]) == 0
    out = capsys.readouterr().out
    assert f"Calibration: {cal}" in out
    a, b = json.loads(plain.read_text()), json.loads(calibrated.read_text())
    assert "calibration" not in a
    assert b["calibration"]["sha256"] == read_calibration(cal).sha256
    # the measured A100s are slower than the catalog says: the calibrated plan predicts a longer iteration
    assert b["prediction"]["iteration_s"] > a["prediction"]["iteration_s"]

    from planner.plan.document import read_plan
    from planner.runtime.inputs import load_run_inputs

    plan, _ = read_plan(calibrated)
    assert plan.calibration["path"] == str(cal)
    inputs = load_run_inputs(calibrated)
    assert {d.efficiency for d in inputs.topology.devices if d.type_name == "A100-80GB"} == {0.05}
    _calibration(cal, efficiency=0.06, kind="A100-80GB")  # measured again: the plan no longer matches
    with pytest.raises(InputError, match="changed since the plan was made"):
        load_run_inputs(calibrated)
    cal.unlink()
    with pytest.raises(InputError, match="which is not here"):
        load_run_inputs(calibrated)
    # Moved to another machine: the plan names a path that is not there, and the file lies beside it.
    moved = tmp_path / "moved"
    moved.mkdir()
    _calibration(moved / "cal.yaml", efficiency=0.06, kind="A100-80GB")
    document = json.loads(calibrated.read_text())
    document["calibration"]["sha256"] = read_calibration(moved / "cal.yaml").sha256
    document["topology"]["path"] = str(topology)
    (moved / "plan.json").write_text(json.dumps(document))
    inputs = load_run_inputs(moved / "plan.json")
    assert {d.efficiency for d in inputs.topology.devices if d.type_name == "A100-80GB"} == {0.06}


def test_topology_takes_measured_links_from_a_calibration(tmp_path, write_yaml):
    cal = _calibration(tmp_path / "cal.yaml", latency_us=123.0, bandwidth=3e9)
    document = small_topology()
    document["network"]["calibration"] = "cal.yaml"  # relative to the topology file
    path = write_yaml(document)
    topology = load_job(path).topology
    i, j = topology.index("fast-0"), topology.index("slow-0")
    assert topology.latency_s[i, j] == pytest.approx(123e-6) and topology.bandwidth_bytes_per_s[j, i] == 3e9
    k = topology.index("fast-1")
    assert topology.bandwidth_bytes_per_s[i, k] == pytest.approx(10e9 / 8)  # the typed region level stays
    before = topology.sha256
    _calibration(cal, latency_us=124.0, bandwidth=3e9)
    assert load_job(path).topology.sha256 != before  # new measurements, new topology


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="other/1"), "field 'format'"),
    (lambda d: d["network"].update(latency_s=[[0, 1]]), "network.latency_s"),
    (lambda d: d["network"].update(bandwidth_bytes_per_s=[[0, -1], [1, 0]]), "positive"),
    (lambda d: d["device_types"]["T4"].update(efficiency=1.5), "device_types.T4"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["network"].update(message_overhead_s=-1e-6), "network.message_overhead_s"),
])
def test_bad_calibration_file_is_one_line(tmp_path, write_yaml, capsys, change, message):
    cal = _calibration(tmp_path / "cal.yaml")
    document = yaml.safe_load(cal.read_text())
    change(document)
    cal.write_text(yaml.safe_dump(document))
    code = main([str(write_yaml(small_topology())), "--calibration", str(cal)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "cal.yaml" in err and len(err.strip().splitlines()) == 1


def test_a_zero_message_overhead_reads_back(tmp_path):
    """On a loaded host the fitted latency can be 0; the file plan calibrate wrote must still load."""
    assert read_calibration(_calibration(tmp_path / "cal.yaml", latency_us=0.0)).network["message_overhead_s"] == 0.0


def test_topology_calibration_naming_no_device_is_refused(tmp_path, write_yaml, capsys):
    _calibration(tmp_path / "cal.yaml", names=("x", "y"))
    document = small_topology()
    document["network"]["calibration"] = "cal.yaml"
    code = main([str(write_yaml(document))])
    err = capsys.readouterr().err
    assert code == 2 and "none of this topology's devices" in err


@pytest.mark.runtime
def test_plan_calibrate_measures_this_cpu_and_the_file_plans(tmp_path, capsys):
    pytest.importorskip("torch")
    from tests.runtime_helpers import cpu_topology

    topology = cpu_topology(tmp_path / "topology.yaml")
    document = yaml.safe_load(topology.read_text())
    document.update(model="tiny", training={"global_batch": 8, "micro_batch_size": 2, "precision": "fp32"})
    topology.write_text(yaml.safe_dump(document))
    out = tmp_path / "calibration.yaml"
    assert main(["calibrate", str(topology), "-o", str(out), "--names", "a0,b0", "--repeats", "3"]) == 0
    calibration = read_calibration(out)
    kind = calibration.device_types["CPU-core"]
    assert 0 < kind["efficiency"] <= 1 and kind["memory_bandwidth_bytes_per_s"] > 1e8
    network = calibration.network
    assert network["devices"] == ["a0", "b0"]
    assert network["bandwidth_bytes_per_s"][0][1] > 1e7 and network["latency_s"][1][0] > 0
    capsys.readouterr()
    assert main([str(topology), "--calibration", str(out), "--time-limit", "5"]) == 0
    assert "Calibration:" in capsys.readouterr().out


def test_head_efficiency_slows_only_the_last_stage_by_its_flops(tmp_path, write_yaml):
    from planner.prediction.predict import build_pipeline_job
    from planner.prediction.stage_model import layer_costs, stage_profile
    from planner.plan.plan import Plan

    job = load_job(write_yaml(small_topology()))
    plan = Plan(layer_bounds=(0, 2, 4), assignment=(("fast-0", "fast-1"),), micro_batches=(16,), micro_batch_size=1,
                schedule="1f1b")
    before = build_pipeline_job(plan, job.topology, job.model, job.training)
    cal = _calibration(tmp_path / "cal.yaml", kind="A100-80GB", efficiency=0.5)
    document = yaml.safe_load(cal.read_text())
    document["device_types"]["A100-80GB"]["head_efficiency"] = 0.25  # the head runs at half the blocks' rate
    cal.write_text(yaml.safe_dump(document))
    calibrated = apply_calibration(job.topology, read_calibration(cal))
    assert calibrated.devices[calibrated.index("fast-1")].head_slowdown == 2.0
    after = build_pipeline_job(plan, calibrated, job.model, job.training)
    profile = stage_profile(layer_costs(job.model, job.training, 1, 2), plan.layer_bounds)
    speed = calibrated.devices[0].effective_flops(job.training.precision)
    head = profile.head_forward_flops[-1]
    assert after.forward_s[0, 0] == pytest.approx(profile.forward_flops[0] / speed)
    assert after.forward_s[0, 1] == pytest.approx((profile.forward_flops[1] + head) / speed)
    assert after.backward_s[0, 1] == pytest.approx((profile.backward_flops[1] + 2 * head) / speed)
    assert before.forward_s[0, 1] < after.forward_s[0, 1]
