"""Precision per device type: bf16 only where every used device has it, fp16 otherwise."""

from dataclasses import replace

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from planner.inputs.catalog import device_type, peak_for
from planner.inputs.job import load_job
from planner.plan.plan import validate_plan
from planner.plan.precision import resolve_precision
from planner.search.front import SearchOptions, search

from conftest import small_topology


def test_peak_is_the_format_the_device_runs():
    t4, a100 = device_type("T4").peak_flops, device_type("A100-80GB").peak_flops
    assert peak_for(t4, "auto") == peak_for(t4, "fp16") == 65e12
    assert peak_for(a100, "auto") == peak_for(a100, "bf16") == 312e12
    with pytest.raises(ValueError, match="no bf16"):
        peak_for(t4, "bf16")  # no longer timed silently at fp16 speed


def test_bf16_on_a_topology_with_t4s_is_one_clear_line(write_yaml):
    path = write_yaml(small_topology(training={"global_batch": 16, "precision": "bf16"}))
    with pytest.raises(InputError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message and "training.precision" in message and "slow-0" in message
    assert "T4" in message and "'auto'" in message and "\n" not in message


@pytest.mark.parametrize("devices, expected", [
    ([{"name": "fast", "count": 2, "type": "A100-80GB", "region": "east"}], "bf16"),
    ([{"name": "slow", "count": 2, "type": "T4", "region": "west"}], "fp16"),
])
def test_auto_resolves_by_the_devices_the_plan_uses(write_yaml, devices, expected):
    job = load_job(write_yaml(small_topology(devices=devices)))
    assert job.training.precision == "auto"
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=5))
    assert result.training.precision == expected
    validate_plan(result.plan, job.topology, job.model, result.training)


def test_auto_stays_bf16_when_the_devices_without_it_stay_idle(write_yaml):
    job = load_job(write_yaml(small_topology()))
    fast = [d.name for d in job.topology.devices if d.type_name == "A100-80GB"]
    assert resolve_precision(job.topology, fast, "auto") == "bf16"
    assert resolve_precision(job.topology, fast + ["slow-0"], "auto") == "fp16"
    assert resolve_precision(job.topology, fast + ["slow-0"], "fp32") == "fp32"


def test_a_bf16_plan_on_a_t4_is_refused(write_yaml):
    job = load_job(write_yaml(small_topology()))
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=5, stages=1, replicas=4))
    assert result.training.precision == "fp16"
    with pytest.raises(InputError, match="no bf16: plan again with precision auto or fp16") as info:
        validate_plan(result.plan, job.topology, job.model, replace(result.training, precision="bf16"))
    assert info.value.field == "training.precision"


def test_the_plan_file_names_the_resolved_precision(write_yaml, tmp_path):
    out = tmp_path / "plan.yaml"
    assert main([str(write_yaml(small_topology())), "--stages", "1", "--replicas", "4", "-o", str(out),
                 "--time-limit", "5"]) == 0
    assert yaml.safe_load(out.read_text())["training"]["precision"] == "fp16"


def test_recompute_auto_on_a_bf16_plan_beside_idle_t4s(write_yaml):
    # 8 A100s on one host, 2 T4s in a far region: the plan leaves the T4s idle and resolves to bf16.
    # The recomputation search then re-simulated that plan over the whole topology (its speeds
    # looked up for every device, the T4s at bf16) and bounded it at bf16 over every device: both
    # raised "no bf16 on this device" where a plan and its bound were due.
    path = write_yaml({
        "name": "a100s-and-far-t4s",
        "devices": [{"name": "a100", "count": 8, "type": "A100-80GB", "gpus_per_host": 8, "host": "a100-node",
                     "region": "east"},
                    {"name": "t4", "count": 2, "type": "T4", "gpus_per_host": 2, "host": "t4-node", "region": "west"}],
        "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                    "region": {"latency": "0.05ms", "bandwidth": "100Gbps"},
                    "global": {"latency": "50ms", "bandwidth": "1Gbps"}},
        "model": "gpt3-xl",
        "training": {"global_batch": 64, "precision": "auto", "recompute": "auto"}})
    job = load_job(path)
    result = search(job.topology, job.model, job.training, SearchOptions(seed=0, time_limit_s=60, budget_s=0.5))
    assert result.training.precision == "bf16"
    assert all(name.startswith("a100") for name in result.plan.used_devices)
    assert 0.0 < result.lower_bound_s <= result.predicted_s
    validate_plan(result.plan, job.topology, job.model, result.training)
