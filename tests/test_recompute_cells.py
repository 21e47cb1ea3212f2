"""Recomputation per worker (``planner.plan.recompute``): selective recomputation's costs, plans whose
workers run different modes (prediction, plan file, report), and ``recompute: auto`` giving each
worker the lightest mode under which it fits."""

from dataclasses import replace

import numpy as np
import pytest

from cost_models import flops, memory
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.plan.document import plan_from_document, plan_to_document
from planner.plan.plan import validate_plan
from planner.plan.recompute import plan_modes, training_value, uniform_modes
from planner.prediction.predict import build_pipeline_job, predict
from planner.prediction.stage_model import layer_costs
from planner.report.text import render_plan
from planner.search.bounds import lower_bound_s
from planner.search.front import PER_WORKER, SearchOptions, search
from planner.search.recompute_cells import lightest_modes, resplit

from conftest import small_topology

# One A100-40GB and a host of four T4s training GPT-3 XL at micro-batch 8 (no flash attention): with
# each worker at its lightest fitting mode (the A100 recomputing its attention cores) the plan runs
# more than 15% faster than with full recomputation everywhere (budget 1, seed 0; asserted below).
MIXED = small_topology(
    devices=[{"name": "fast", "count": 1, "type": "A100-40GB", "region": "east"},
             {"name": "slow", "count": 4, "type": "T4", "region": "east", "host": "h"}],
    network={"host": {"latency": "5us", "bandwidth": "100Gbps"}, "region": {"latency": "1ms", "bandwidth": "10Gbps"},
             "global": {"latency": "20ms", "bandwidth": "1Gbps"}},
    model="gpt3-xl",
    training={"global_batch": 64, "micro_batch_size": 8, "recompute": "auto", "schedule": "1f1b", "precision": "auto"})


@pytest.fixture
def mixed_job(write_yaml):
    return load_job(write_yaml(MIXED))


@pytest.fixture(scope="module")
def mixed_result(tmp_path_factory):
    import yaml
    path = tmp_path_factory.mktemp("mixed") / "topology.yaml"
    path.write_text(yaml.safe_dump(MIXED, sort_keys=False))
    job = load_job(path)
    return job, search(job.topology, job.model, job.training, SearchOptions(seed=0, time_limit_s=120, budget_s=1))


def test_selective_recomputation_drops_the_scores_for_the_attention_cores_flops():
    s, b, h, a = 2048, 4, 2048, 16
    none = memory.layer_activation_bytes(s, b, h, a)
    selective = memory.layer_activation_bytes(s, b, h, a, recompute="selective")
    full = memory.layer_activation_bytes(s, b, h, a, recompute=True)
    # Korthikanti et al. 2022, Table 2 less the dropout masks: sbh (8 + 24) with the core recomputed
    assert selective == memory.layer_activation_bytes(s, b, h, a, flash_attention=True) == s * b * h * 32
    assert none == s * b * h * (32 + 2 * a * s / h) and full == 2 * s * b * h
    forward = flops.layer_forward_flops(b, s, h, 4 * h)
    assert flops.recomputed_layer_flops(forward, flops.attention_core_forward_flops(b, s, h), "selective") \
        == 3 * forward + 4 * b * s * s * h
    assert 3 * forward < 3 * forward + 4 * b * s * s * h < 4 * forward


def test_selective_layer_costs_keep_the_scores_apart_in_backward(mixed_job):
    model, training = mixed_job.model, mixed_job.training
    costs = {mode: layer_costs(model, replace(training, recompute=mode, precision="fp16"), 8, 2)
             for mode in (False, "selective", True)}
    assert costs[False].layer_flops < costs["selective"].layer_flops < costs[True].layer_flops
    assert costs[True].layer_kept_bytes < costs["selective"].layer_kept_bytes < costs[False].layer_kept_bytes
    # the recomputed softmax output of one block is held in backward: what the plain block keeps beyond
    scores = costs[False].layer_kept_bytes - costs["selective"].layer_kept_bytes
    assert costs["selective"].transient_bytes == pytest.approx(costs[False].transient_bytes + scores)
    assert (costs["selective"].tensor_allreduces_forward, costs["selective"].tensor_allreduces_backward) == (2, 2)
    flash = replace(training, recompute="selective", precision="fp16", flash_attention=True)
    assert layer_costs(model, flash, 8, 2).layer_kept_bytes == \
        layer_costs(model, replace(flash, recompute=False), 8, 2).layer_kept_bytes


def _two_by_two(job, table, split=12):
    """A 2-stage x 2-replica plan on the mixed topology (no tensor groups) running ``table``, stage 0
    holding ``split`` layers."""
    from planner.plan.plan import Plan
    return Plan(layer_bounds=(0, split, 24), assignment=(("slow-0", "fast"), ("slow-1", "slow-2")),
                micro_batches=(4, 4), micro_batch_size=8, schedule="1f1b", recompute=table)


def test_a_mixed_plan_times_and_sizes_each_worker_by_its_own_mode(mixed_job):
    topology, model = mixed_job.topology, mixed_job.model
    training = replace(mixed_job.training, recompute=True, precision="fp16")
    table = (("full", "none"), ("selective", "full"))
    plan = _two_by_two(mixed_job, table)
    job = build_pipeline_job(plan, topology, model, training)
    prediction = predict(plan, topology, model, training)[0]
    for mode in ("none", "selective", "full"):
        uniform = replace(training, recompute=training_value(mode))
        alone = build_pipeline_job(replace(plan, recompute=()), topology, model, uniform)
        sized = predict(replace(plan, recompute=()), topology, model, uniform)[0]
        cells = np.array(table) == mode
        np.testing.assert_array_equal(job.forward_s[cells], alone.forward_s[cells])
        np.testing.assert_array_equal(job.backward_s[cells], alone.backward_s[cells])
        for r, s in zip(*np.nonzero(cells)):
            device = plan.assignment[r][s]
            assert prediction.memory_bytes[device] == sized.memory_bytes[device]
    fastest = predict(replace(plan, recompute=()), topology, model, replace(training, recompute=False))[0]
    slowest = predict(replace(plan, recompute=()), topology, model, training)[0]
    assert fastest.iteration_s < prediction.iteration_s < slowest.iteration_s


def test_the_lightest_modes_fit_and_no_lighter_one_does(mixed_job):
    topology, model = mixed_job.topology, mixed_job.model
    training = replace(mixed_job.training, recompute=True, precision="fp16")
    plan = _two_by_two(mixed_job, (), split=10)
    table = lightest_modes(plan, topology, model, training)
    order = ("none", "selective", "full")
    assert table == (("full", "selective"), ("full", "full"))
    for r, row in enumerate(table):
        for s, mode in enumerate(row):
            for tried in order[:order.index(mode) + 1]:
                changed = [list(x) for x in table]
                changed[r][s] = tried
                sized = predict(replace(plan, recompute=tuple(map(tuple, changed))), topology, model, training)[0]
                device = plan.assignment[r][s]
                assert (sized.memory_bytes[device] <= sized.capacity_bytes[device]) == (tried == mode)
    # with flash attention no block keeps the scores: the A100 needs no recomputation
    flash = replace(training, flash_attention=True)
    assert lightest_modes(plan, topology, model, flash) == (("full", "none"), ("full", "full"))
    assert lightest_modes(_two_by_two(mixed_job, (), split=8), topology, model, training) is None  # T4s overfull


def test_auto_gives_each_worker_its_lightest_fitting_mode(mixed_result):
    job, result = mixed_result
    tried = result.plan.search["recompute_tried"]
    assert set(tried) == {"false", "true", PER_WORKER} or set(tried) == {"true", PER_WORKER}
    assert result.objective_s == pytest.approx(tried[PER_WORKER]) and tried[PER_WORKER] < 0.85 * tried["true"]
    assert result.plan.search["objective_s"] == result.objective_s
    assert result.plan.prediction.fits and len({m for row in result.plan.recompute for m in row}) > 1
    assert result.plan.recompute == lightest_modes(result.plan, job.topology, job.model, result.training)
    # the training names the heaviest mode a worker runs, the plan each worker's
    modes = {m for row in result.plan.recompute for m in row}
    heaviest = "full" if "full" in modes else "selective"
    assert result.training.recompute == training_value(heaviest)
    validate_plan(result.plan, job.topology, job.model, result.training)
    # the bound holds over plans whose workers run any mode: no higher than either fixed mode's
    auto = lower_bound_s(job.topology, job.model, job.training)
    assert result.lower_bound_s <= auto + 1e-12 <= result.objective_s
    for fixed in (False, True):
        assert auto <= lower_bound_s(job.topology, job.model, replace(job.training, recompute=fixed)) + 1e-12


def test_the_same_seed_and_budget_give_the_same_modes(mixed_result):
    job, result = mixed_result
    again = search(job.topology, job.model, job.training, SearchOptions(seed=0, time_limit_s=120, budget_s=1))
    assert again.plan.recompute == result.plan.recompute and again.plan.layer_bounds == result.plan.layer_bounds
    assert again.objective_s == result.objective_s


def test_resplit_never_ends_above_where_it_began_and_keeps_every_worker_fitting(mixed_job):
    topology, model = mixed_job.topology, mixed_job.model
    training = replace(mixed_job.training, recompute=True, precision="fp16")
    plan = _two_by_two(mixed_job, lightest_modes(_two_by_two(mixed_job, (), split=18), topology, model, training),
                       split=18)  # 18 layers on the T4s (full recomputation), 6 on the A100
    plan = plan.with_prediction(predict(plan, topology, model, training)[0])
    calls = []

    def score(candidate, trained):
        calls.append(candidate.layer_bounds)
        p = predict(candidate, topology, model, trained)[0]
        return p.iteration_s if p.fits else float("inf")
    moved, trained, value, cut = resplit(plan, training, topology, model, score)
    assert value < score(plan, training) and moved.layer_bounds != plan.layer_bounds and not cut
    assert moved.recompute == () or moved.recompute == lightest_modes(moved, topology, model, training)
    assert predict(moved, topology, model, trained)[0].fits
    assert resplit(plan, training, topology, model, score)[0].layer_bounds == moved.layer_bounds  # deterministic
    stopped = resplit(plan, training, topology, model, score, deadline=0.0)  # the clock's cap, recorded
    assert stopped[0] is plan and stopped[3]


def test_a_per_worker_phase_the_clock_cut_is_recorded(mixed_result):
    from planner.search.front import IterationTime, _relaxed

    job, result = mixed_result
    full = replace(result, plan=replace(result.plan, recompute=()),
                   training=replace(result.training, recompute=True))
    cut = _relaxed(full, job.topology, job.model, IterationTime(), deadline=0.0)
    assert cut.plan.recompute == () and "recompute per worker" in cut.plan.search["clock_cut"]


def test_gpipe_fits_each_worker_at_its_least_memory_under_auto(mixed_job):
    """Under auto the last stage's and the deepest stage's workers each take the mode that needs
    the least: at one micro-batch in flight full recomputation needs more than none (it keeps the
    block's input beside the recomputed set), so auto fits where full recomputation alone does not."""
    from planner.prediction.stage_model import stage_memory_bytes
    from planner.search.round_trip import gpipe_fits

    model = mixed_job.model
    training = replace(mixed_job.training, precision="fp16", micro_batches_per_round=1)
    stages, busiest = model.layers, np.array([1.0])  # one block a stage
    last = {mode: float(stage_memory_bytes(layer_costs(model, replace(training, recompute=mode), 1, stages, 1),
                                           1, stages - 1, 1.0, 1)) for mode in (False, "selective", True)}
    assert last[True] > last[False]
    only_auto = 0
    for capacity in np.linspace(0.5, 1.5, 201) * last[False]:
        auto = gpipe_fits(model, replace(training, recompute="auto"), stages, busiest, 1, 1, capacity)[0]
        alone = [gpipe_fits(model, replace(training, recompute=mode), stages, busiest, 1, 1, capacity)[0]
                 for mode in (False, "selective", True)]
        assert auto >= max(alone)
        only_auto += bool(auto and not alone[2])
    assert only_auto > 0  # between the last stage's need without recomputation and with full


def test_the_plan_file_keeps_each_workers_mode_and_refuses_a_heavier_one(mixed_result):
    job, result = mixed_result
    document = plan_to_document(result.plan, model=job.model, training=result.training)
    assert [r["recompute"] for r in document["replicas"]] == [list(row) for row in result.plan.recompute]
    back = plan_from_document(document)
    assert back.recompute == result.plan.recompute
    validate_plan(back, job.topology, job.model, result.training)
    lighter = replace(result.training, recompute=False)
    with pytest.raises(InputError, match="more than training.recompute false allows") as refused:
        validate_plan(back, job.topology, job.model, lighter)
    assert refused.value.field.startswith("replicas[")
    for bad, match in (((("partial",) * back.stages,) * back.replicas, "is not one of"),
                       ((("none",),) * back.replicas if back.stages > 1 else (("none", "none"),), "one mode per worker")):
        with pytest.raises(InputError, match=match):
            validate_plan(replace(back, recompute=bad), job.topology, job.model, result.training)
    assert plan_modes(replace(back, recompute=()), result.training) == \
        uniform_modes(result.training.recompute, back.replicas, back.stages)


def test_the_report_says_what_each_worker_recomputes_and_what_that_saved(mixed_result):
    job, result = mixed_result
    text = render_plan(result.plan, job.topology, job.model, result.training, result=result)
    assert "Recomputation: per worker, the lightest under which it fits (" in text
    assert f"{PER_WORKER} {result.objective_s:.4g} s" in text
    header = next(line for line in text.splitlines() if line.startswith("device "))
    assert header.split()[-3:] == ["recompute", "without", "it"]
    assert any(line.split()[:1] == ["fast"] and "selective" in line for line in text.splitlines())


def test_auto_recomputation_with_auto_compression_bounds_the_per_worker_plan(write_yaml):
    """The per-worker plan's bound takes its own resolved training (compression chosen), not the
    asked one, whose ``auto`` compression no cost model can price."""
    job = load_job(write_yaml({**MIXED, "training": {**MIXED["training"], "compress_messages": "auto"}}))
    result = search(job.topology, job.model, job.training, SearchOptions(seed=0, time_limit_s=120, budget_s=1))
    assert PER_WORKER in result.plan.search["recompute_tried"] and result.plan.recompute
    assert 0 < result.lower_bound_s <= result.objective_s
    assert result.lower_bound_s <= lower_bound_s(job.topology, job.model, replace(
        result.training, recompute="auto")) + 1e-12


def test_selective_recomputations_backward_share_counts_the_attention_core(mixed_job):
    from planner.search.evaluate import backward_share

    costs = {mode: layer_costs(mixed_job.model, replace(mixed_job.training, recompute=mode, precision="fp16"), 8, 2)
             for mode in (False, "selective", True)}
    assert backward_share(costs[False]) == 2.0 / 3.0 and backward_share(costs[True]) == 0.75
    forward, core = costs["selective"].layer_forward_flops, costs["selective"].layer_flops - 3 * \
        costs["selective"].layer_forward_flops
    assert backward_share(costs["selective"]) == pytest.approx((2 * forward + core) / (3 * forward + core))
    assert 2.0 / 3.0 < backward_share(costs["selective"]) < 0.75
