"""When there is no plan, or devices are left idle, the words name the real cause and the fix."""

import dataclasses

import pytest

from planner.cli import main
from planner.inputs.job import load_job
from planner.report.text import render_plan
from planner.search.front import SearchOptions, search
from planner.search.no_plan import stage_memory_floor

from conftest import small_topology


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("args, fragment", [
    (["--stages", "100"], "field '--stages': 100 stages for a model of 4 layers (a stage holds at least one layer): "
                          "use --stages 4 or fewer"),
    (["--replicas", "1000"], "field '--replicas': 1000 replicas need at least 1000 devices (one stage each) and the "
                             "topology has 4: use --replicas 4 or fewer"),
    (["--stages", "2", "--replicas", "6"], "field '--replicas': 2 stages x 6 replicas need 12 devices and the "
                                          "topology has 4: use --replicas 2 or fewer"),
    (["--replicas", "4", "--global-batch", "2"], "field '--replicas': the global batch of 2 at micro-batch size 1 "
                                                 "gives 2 micro-batches and each of the 4 replicas needs one"),
])
def test_impossible_pins_name_the_pin_not_memory(write_yaml, capsys, args, fragment):
    path = write_yaml(small_topology())
    assert main([str(path), *args]) == 2
    err = _error(capsys)
    assert err.startswith(f"plan: error: {path}: ") and fragment in err and "memory" not in err


def test_a_stage_too_big_for_every_device_names_the_device_and_the_stage_count(write_yaml, capsys):
    doc = small_topology(model="gpt3-6.7b")
    doc["training"].update(recompute=True, global_batch=8)
    path = write_yaml(doc)
    assert main([str(path), "--stages", "1", "--replicas", "1"]) == 2
    err = _error(capsys)
    assert err.startswith(f"plan: error: {path}: field '--stages': no plan fits in memory: with 1 stage(s)")
    assert "more than the largest device, fast-0 (A100-80GB), holds" in err and err.endswith("use --stages 2 or more")
    assert "recompute: true" not in err  # it is on already


def test_recompute_is_the_fix_only_when_it_is_off(write_yaml, capsys):
    doc = small_topology(model="gpt3-6.7b")  # its state (100 GiB) fits the 4 devices together (188 GiB)
    doc["training"].update(global_batch=16, micro_batch_size=4)
    path = write_yaml(doc)
    assert main([str(path), "--time-limit", "5"]) == 2
    assert _error(capsys) == (f"plan: error: {path}: field 'training.recompute': no plan fits in memory: 4 stage(s) "
                              "x 1 replica(s) must use slow-0 (T4, 15 GiB usable), and a stage of 8 layers needs at "
                              f"least {_gib(doc, 4, 1, 4)} at micro-batch size 4 (recompute off); split evenly, "
                              f"stage 0 needs {_even(doc, 4, 1, 4)} with the micro-batches it keeps in flight: set "
                              "recompute: true")
    doc["training"]["recompute"] = True
    assert main([str(write_yaml(doc)), "--time-limit", "5"]) == 0  # and with it the model fits
    capsys.readouterr()
    # GPT-3 13B's state alone (192 GiB) exceeds the 4 devices together: recomputation is no fix
    doc = small_topology(model="gpt3-13b")
    doc["training"]["global_batch"] = 16
    for recompute in (False, True):
        doc["training"]["recompute"] = recompute
        assert main([str(write_yaml(doc)), "--time-limit", "5"]) == 2
        err = _error(capsys)
        assert "field 'model'" in err and "more than all 4 devices hold together" in err and "recompute:" not in err
        assert err.endswith("add devices with more memory or plan a smaller model")


def _even(doc, stages: int, replicas: int, micro_batch_size: int) -> str:
    """Stage 0 of an even split at 1F1B's in-flight count (``stages`` micro-batches), by hand."""
    import math

    from planner.inputs.units import format_bytes
    from planner.prediction.stage_model import layer_costs, stage_memory_bytes

    job = _job(doc)
    costs = layer_costs(job.model, job.training, micro_batch_size, stages, replicas)
    return format_bytes(stage_memory_bytes(costs, math.ceil(job.model.layers / stages), 0, stages))


def test_the_named_shape_is_measured_by_its_own_replicas_and_its_split(capsys):
    """Six 24 GiB GPUs, GPT-3 6.7B at micro-batch 4: 6 x 1 must hold unsharded state (19-20 GiB a
    stage at least, not 8.25 as over the most replicas any shape tried), and stage 0 of an even
    split keeps 6 micro-batches in flight: 24-25 GiB, the number that does not fit."""
    from tests.conftest import ROOT

    import math

    from planner.inputs.job import load_job
    from planner.inputs.units import format_bytes
    from planner.prediction.stage_model import layer_costs, stage_memory_bytes

    path = ROOT / "topologies" / "emulated" / "home-mini.yaml"
    assert main([str(path), "--model", "gpt3-6.7b"]) == 2
    err = _error(capsys)
    job = load_job(path, model="gpt3-6.7b")
    floor = stage_memory_floor(job.model, job.training, 4, 6, 1)
    stage0 = stage_memory_bytes(layer_costs(job.model, job.training, 4, 6, 1), math.ceil(job.model.layers / 6), 0, 6)
    assert 19 * 2**30 < floor < 20 * 2**30 < 24 * 2**30 < stage0 < 25 * 2**30  # and 8.25 GiB over the most replicas
    assert "6 stage(s) x 1 replica(s) must use berlin-4090-0 (RTX-4090, 23 GiB usable)" in err
    assert f"needs at least {format_bytes(floor)}" in err and f"split evenly, stage 0 needs {format_bytes(stage0)}" in err


def _gib(doc, stages: int, replicas: int, micro_batch_size: int = 1) -> str:
    from planner.inputs.units import format_bytes

    return format_bytes(stage_memory_floor(_job(doc).model, _job(doc).training, micro_batch_size, stages, replicas))


def _job(doc):
    import tempfile
    from pathlib import Path

    import yaml

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_job(path)


def test_stage_memory_floor_is_below_every_fitting_stage_and_falls_with_more_stages():
    job = _job(small_topology(model="gpt3-6.7b"))
    floors = [stage_memory_floor(job.model, job.training, 1, s) for s in (1, 2, 4, 8)]
    assert floors == sorted(floors, reverse=True) and floors[0] > 80e9 > floors[1]
    sharded = [stage_memory_floor(job.model, job.training, 1, s, 4) for s in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(sharded, floors))  # the state sharded over 4 replicas needs less


def test_idle_devices_left_by_the_pins_are_said_to_be(write_yaml):
    job = load_job(write_yaml(small_topology()))
    pinned = search(job.topology, job.model, job.training, SearchOptions(stages=1, replicas=2, exact=False, time_limit_s=2))
    text = render_plan(pinned.plan, job.topology, job.model, job.training, result=pinned)
    assert "Idle devices (--stages 1 x --replicas 2 pin 2 of 4 devices): " in text
    assert "would not speed up" not in text
    one = search(job.topology, job.model, job.training, SearchOptions(stages=1, exact=False, time_limit_s=2))
    if one.plan.idle:
        assert "Idle devices (with --stages 1 pinned, using them would not speed up the iteration)" in render_plan(
            one.plan, job.topology, job.model, job.training, result=one)


def test_cpsat_estimate_below_the_chosen_plan_says_the_simulator_picked_it(write_yaml):
    job = load_job(write_yaml(small_topology()))
    result = search(job.topology, job.model, job.training, SearchOptions(exact=False, time_limit_s=2))
    chosen = result.plan.prediction.iteration_s
    shape = {"stages": 1, "replicas": 2, "micro_batch_size": 1, "schedule": "1f1b", "status": "optimal",
             "bound_s": 0.5 * chosen, "wall_s": 0.1}
    above = dataclasses.replace(result, exact_shapes=[{**shape, "estimate_s": 1.5 * chosen}])
    assert "the event simulator picked" not in render_plan(result.plan, job.topology, job.model, job.training,
                                                           result=above)
    below = dataclasses.replace(result, exact_shapes=[{**shape, "estimate_s": 0.9 * chosen}])
    text = render_plan(result.plan, job.topology, job.model, job.training, result=below)
    assert "CP-SAT minimises the search's estimate" in text and "the event simulator picked the plan above" in text
    # a shape CP-SAT found no placement for in its time is not said to fit nothing
    unknown = dataclasses.replace(result, exact_shapes=[{**shape, "status": "unknown", "estimate_s": None}])
    text = render_plan(result.plan, job.topology, job.model, job.training, result=unknown)
    assert "1f1b: unknown, no placement found in its time (0.10 s)" in text and "none fits" not in text


def test_a_network_too_slow_for_any_plan_is_named(write_yaml, capsys, monkeypatch):
    from planner.search import front

    real = front.predict

    def endless(plan, *args, **kwargs):
        prediction, rest = real(plan, *args, **kwargs)
        return dataclasses.replace(prediction, iteration_s=float("inf")), rest

    monkeypatch.setattr(front, "predict", endless)
    path = write_yaml(small_topology())
    assert main([str(path), "--no-exact", "--time-limit", "2"]) == 2
    err = _error(capsys)
    assert err.startswith(f"plan: error: {path}: field 'network': no plan finishes an iteration in finite time")
    assert "raise its bandwidth" in err and "memory" not in err


def test_a_model_larger_than_every_device_together_says_so(write_yaml, capsys):
    """Nine T4s hold 135 GiB; GPT-3 13B's weights, gradients and Adam state take 16 B x 12.9e9 =
    192 GiB: the line names that total, not one device's stage (which would look as if it fit)."""
    path = write_yaml({"name": "t4s", "devices": [{"name": "t", "count": 9, "type": "T4"}],
                       "network": {"region": {"latency": "0.1ms", "bandwidth": "10Gbps"}},
                       "model": "gpt3-13b", "training": {"global_batch": 32, "micro_batch_size": 1}})
    assert main([str(path), "--time-limit", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'model'" in err, err
    assert "take 192 GiB, more than all 9 devices hold together (135 GiB usable)" in err, err


def test_a_model_larger_than_every_device_together_is_refused_before_any_search(write_yaml, capsys, monkeypatch):
    """Arithmetic, not search: the line comes before any degree pair is tried, whatever the time
    limit (a search cut by its limit would otherwise say to raise the limit or the budget)."""
    from planner.search import front

    path = write_yaml({"name": "t4s", "devices": [{"name": "t", "count": 9, "type": "T4"}],
                       "network": {"region": {"latency": "0.1ms", "bandwidth": "10Gbps"}},
                       "model": "gpt3-13b", "training": {"global_batch": 32, "micro_batch_size": 1,
                                                          "recompute": "auto", "precision": "auto"}})
    monkeypatch.setattr(front, "_placement_search", lambda *a, **k: pytest.fail("searched"))
    assert main([str(path), "--time-limit", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'model'" in err and "more than all 9 devices hold together" in err, err
