"""Activation recompute as a search decision (``training.recompute: auto``)."""

from dataclasses import replace

import pytest

from planner.errors import InputError
from planner.inputs.job import load_job
from planner.search.front import SearchOptions, search

from conftest import small_topology

T4S = [{"name": "t", "count": 4, "type": "T4", "region": "east"}]
A100S = [{"name": "fast", "count": 2, "type": "A100-80GB", "region": "east"}]


def _job(write_yaml, devices, model, global_batch):
    return load_job(write_yaml(small_topology(devices=devices, model=model, training={
        "global_batch": global_batch, "micro_batch_size": 4, "recompute": "auto"})))


def test_recompute_is_chosen_where_memory_binds(write_yaml):
    job = _job(write_yaml, T4S, "gpt3-xl", 64)
    with pytest.raises(InputError, match="no plan fits"):
        search(job.topology, job.model, replace(job.training, recompute=False), SearchOptions(time_limit_s=4))
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=8))
    assert result.training.recompute is True and result.plan.prediction.fits
    assert result.plan.search["recompute_tried"] == {"true": pytest.approx(result.objective_s)}


def test_recompute_is_left_off_where_everything_fits_and_the_plan_is_faster(write_yaml):
    job = _job(write_yaml, A100S, "tiny", 16)
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=4))
    forced = search(job.topology, job.model, replace(job.training, recompute=True), SearchOptions(time_limit_s=2))
    assert result.training.recompute is False
    assert result.objective_s < forced.objective_s
    assert result.lower_bound_s <= result.objective_s


def test_a_plan_file_says_which_was_chosen_and_auto_cannot_launch(write_yaml, tmp_path):
    import yaml

    from planner.cli import main

    out = tmp_path / "plan.yaml"
    topology = write_yaml(small_topology(devices=A100S, training={"global_batch": 16, "recompute": "auto"}))
    assert main([str(topology), "-o", str(out), "--time-limit", "4"]) == 0
    document = yaml.safe_load(out.read_text())
    assert document["training"]["recompute"] is False
    document["training"]["recompute"] = "auto"
    out.write_text(yaml.safe_dump(document))
    pytest.importorskip("torch")
    from planner.runtime.inputs import load_run_inputs

    with pytest.raises(InputError, match="training.recompute"):
        load_run_inputs(out)
