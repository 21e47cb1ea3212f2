import json
from dataclasses import replace

import pytest

from planner.prediction.predict import predict
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.plan.document import plan_from_document, plan_to_document, read_plan, write_plan
from planner.plan.plan import validate_plan
from planner.search.front import SearchOptions, search

from conftest import small_topology


@pytest.fixture
def planned(write_yaml):
    job = load_job(write_yaml(small_topology()))
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=10, stages=2, replicas=2))
    return job, result.plan


def test_round_trip_through_yaml_and_json(planned, tmp_path):
    job, plan = planned
    document = plan_to_document(plan, model=job.model, training=job.training)
    for name in ("plan.yaml", "plan.json"):
        write_plan(document, tmp_path / name)
        back, raw = read_plan(tmp_path / name)
        assert back.assignment == plan.assignment and back.layer_bounds == plan.layer_bounds
        assert back.micro_batches == plan.micro_batches and back.ring_orders == plan.ring_orders
        validate_plan(back, job.topology, job.model, job.training)
        assert raw["prediction"]["iteration_s"] == pytest.approx(plan.prediction.iteration_s)


def test_plan_serialises_with_names(planned):
    job, plan = planned
    document = plan_to_document(plan)
    assert all(isinstance(d, str) for stage in document["stages"] for d in stage["devices"])
    assert document["stages"][0]["layers"][0] == 0 and document["stages"][-1]["layers"][1] == job.model.layers


@pytest.mark.parametrize("change, fragment", [
    (lambda p: replace(p, layer_bounds=(0, 4, 4)), "at least one layer"),
    (lambda p: replace(p, layer_bounds=(0, 2, 3)), "cover layers"),
    (lambda p: replace(p, micro_batches=tuple(m + 1 for m in p.micro_batches)), "global batch"),
    (lambda p: replace(p, assignment=tuple((row[0],) * len(row) for row in p.assignment)), "more than once"),
    (lambda p: replace(p, assignment=tuple(("ghost",) + row[1:] for row in p.assignment)), "not in topology"),
    (lambda p: replace(p, topology_sha256="0" * 64), "another topology"),
    (lambda p: replace(p, schedule="zigzag"), "schedule"),
])
def test_validate_plan_catches_every_broken_invariant(planned, change, fragment):
    job, plan = planned
    with pytest.raises(InputError, match=fragment):
        validate_plan(change(plan), job.topology, job.model, job.training)


def test_memory_that_does_not_fit_is_invalid(planned):
    job, plan = planned
    prediction, _ = predict(plan, job.topology, job.model, job.training)
    huge = replace(prediction, memory_bytes={d: 1e15 for d in prediction.memory_bytes})
    with pytest.raises(InputError, match="needs"):
        validate_plan(plan.with_prediction(huge), job.topology, job.model, job.training)


def test_write_is_atomic_and_refuses_unknown_extensions(planned, tmp_path, monkeypatch):
    job, plan = planned
    target = tmp_path / "plan.yaml"
    target.write_text("old: true\n")
    with pytest.raises(InputError, match="extension"):
        write_plan(plan_to_document(plan), tmp_path / "plan.txt")
    import planner.io as module

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(module.os, "replace", broken)
    with pytest.raises(OSError):
        write_plan(plan_to_document(plan), target)
    assert target.read_text() == "old: true\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml", "topology.yaml"]


def test_broken_plan_file_is_an_input_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format_version": 1, "stages": [], "replicas": []}))
    with pytest.raises(InputError, match="topology"):
        read_plan(path)
    with pytest.raises(InputError, match="format_version"):
        plan_from_document({"format_version": 99})


def test_written_files_take_the_umask_like_any_other(tmp_path):
    """The atomic writer's temporary (0600 from mkstemp) is given the mode open() would give: a
    plan on a shared cluster is readable by whoever the umask lets read it."""
    import os

    from planner.io import write_document

    old = os.umask(0o022)
    try:
        write_document({"a": 1}, tmp_path / "p.yaml")
        os.umask(0o077)
        write_document({"a": 1}, tmp_path / "private.yaml")
    finally:
        os.umask(old)
    assert (tmp_path / "p.yaml").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.yaml").stat().st_mode & 0o777 == 0o600
