"""The search's time limit is a limit: every phase ends within it, on deterministic work budgets."""

import json
import time

import numpy as np
import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.plan.document import read_plan
from planner.plan.plan import CostModel, validate_plan
from planner.prediction.predict import predict
from planner.search.deadline import (CONSTRUCT_END, CONSTRUCT_UNITS_PER_S, CONSTRUCT_UNPLANNED_END, FINALISTS_END,
                                     FINALISTS_MIN, Budget)
from planner.search.front import SearchOptions, search
from planner.search.no_plan import OutOfBudget

from conftest import ROOT, small_topology

CASE5 = ROOT / "topologies" / "dtfm" / "case5-worldwide.yaml"
OVERRUN_S = 1.0  # one indivisible unit (a case-5 simulation is ~0.3 s) with room for a loaded machine
SMALL_MEMORY = ROOT / "topologies" / "hetero" / "a100-t4-small-memory.yaml"
# A search where no plan fits without recomputation or tensor groups (below) took 0.44-0.62 s at a
# 0.05 s limit (each grouping's first degree pair that may fit, constructed in full, and one
# simulation), 12-34 s when construction ran on until a plan fit; 3 s leaves a loaded 2-core
# machine five times the measured time.
UNPLANNED_OVERRUN_S = 3.0


def test_phase_ends_and_work_budgets_scale_with_the_limit():
    short, long = Budget(limit_s=2.0, started=100.0, clock=lambda: 100.0), Budget(limit_s=8.0, started=0.0)
    assert short.end("construct") == pytest.approx(100.0 + CONSTRUCT_END * 2.0)
    assert short.end("finalists") == pytest.approx(100.0 + FINALISTS_END * 2.0)
    assert short.share_s("finalists") == pytest.approx(FINALISTS_MIN * 2.0)
    order = [short.end(p) for p in ("construct", "local", "genetic", "exact", "finalists")]
    assert order == sorted(order) and order[-1] < 102.0
    assert long.estimates("local", 10**9) == pytest.approx(4 * short.estimates("local", 10**9), abs=4)
    assert long.construct_units() == pytest.approx(4 * short.construct_units())
    assert short.estimates("local", 5) == 5  # the cap
    short.reserve_finalists(32, 128, 8192)  # a simulation heavier than the limit: the largest share
    assert short.share_s("finalists") == pytest.approx(0.6 * 2.0)
    assert not short.out_of_time("local") and short.clock_cut == []
    short.clock = lambda: 101.9
    assert short.out_of_time("local") and short.clock_cut == ["local"]
    short.stop()
    assert short.end("finalists") == 100.0


def test_construction_without_a_plan_takes_more_of_the_limit_and_the_phases_after_it_what_is_left():
    budget = Budget(limit_s=2.0, work_s=4.0, started=0.0, clock=lambda: 0.0)
    assert budget.construct_units(planned=False) == pytest.approx(CONSTRUCT_UNITS_PER_S * CONSTRUCT_UNPLANNED_END * 4.0)
    budget.construct_ended(0.1 * budget.construct_units())  # the first plan inside the share: nothing moves
    assert budget.end("construct") == pytest.approx(CONSTRUCT_END * 2.0)
    budget.construct_ended(CONSTRUCT_UNITS_PER_S * 0.5 * 4.0)  # found at half the work budget
    assert budget.end("construct") == pytest.approx(1.0) and budget.work_share_s("construct") == pytest.approx(2.0)
    budget.reserve_finalists(32, 128, 8192)  # the finalists' largest share would overlap construction: capped
    assert budget.end("finalists") - budget.share_s("finalists") == pytest.approx(1.0)
    assert budget.end("local") == pytest.approx(1.0) and budget.estimates("local", 10**9) == 1
    budget.construct_ended(CONSTRUCT_UNITS_PER_S * 10.0 * 4.0)  # past the end without a plan: capped there
    assert budget.end("construct") == pytest.approx(CONSTRUCT_UNPLANNED_END * 2.0)
    budget.clock = lambda: CONSTRUCT_UNPLANNED_END * 2.0
    assert budget.out_of_time_unplanned() and budget.clock_cut == ["construct"]


def _only_16gb(write_yaml, **training):
    """a100-t4-small-memory with its A100s V100-16GB (the fuzz test's mutation 792): every device
    holds 16 GB and gpt3-6.7b fits only in tensor groups (or with recomputation)."""
    document = yaml.safe_load(SMALL_MEMORY.read_text())
    document["devices"][0]["type"] = "V100-16GB"
    document["training"].update(training)
    return load_job(write_yaml(document))


def test_a_search_where_no_plan_fits_without_tensor_groups_ends_at_its_limit(write_yaml):
    """Every grouping's construction ends at the limit whether or not a plan fits: a plan or one
    refusal line, within the limit plus ``UNPLANNED_OVERRUN_S``."""
    job = _only_16gb(write_yaml)
    options = SearchOptions(seed=0, time_limit_s=0.05, max_evaluations=20, simulate_top=1, exact=False)
    started = time.perf_counter()
    try:
        result = search(job.topology, job.model, job.training, options)
        validate_plan(result.plan, job.topology, job.model, result.training)
    except InputError as error:
        assert "\n" not in str(error) and "--time-limit" in str(error)
    assert time.perf_counter() - started < options.time_limit_s + UNPLANNED_OVERRUN_S


def test_the_work_budget_ends_construction_without_a_plan_in_one_refusal_line(write_yaml):
    """Without recomputation or tensor groups nothing fits; a budget too small to try every degree
    pair refuses naming --budget (it cannot tell that no pair fits), not after trying them all."""
    job = _only_16gb(write_yaml, recompute=False)
    options = SearchOptions(seed=0, time_limit_s=60.0, budget_s=0.05, tensor_degrees=(1,), exact=False)
    started = time.perf_counter()
    with pytest.raises(OutOfBudget) as error:
        search(job.topology, job.model, job.training, options)
    assert time.perf_counter() - started < UNPLANNED_OVERRUN_S
    assert "\n" not in str(error.value) and "raise --budget" in str(error.value)
    assert "(1 degree pair(s) constructed, 147 not reached)" in str(error.value)


def test_a_budget_the_time_limit_set_names_the_time_limit(write_yaml):
    """Without --budget the time limit sets the work budget: the refusal names --time-limit, also
    from a share of the options (the search's phases work on shares of the budget)."""
    from dataclasses import replace

    job = _only_16gb(write_yaml, recompute=False)
    shared = replace(SearchOptions(seed=0, time_limit_s=0.05, tensor_degrees=(1,), exact=False).share(1.0),
                     time_limit_s=60.0)  # the budget (0.05 s of work) ends construction, not the clock
    assert shared.budget_s == pytest.approx(0.05)
    with pytest.raises(OutOfBudget) as error:
        search(job.topology, job.model, job.training, shared)
    assert error.value.field == "--time-limit" and "raise --time-limit (or set --budget)" in str(error.value)


def test_the_command_without_budget_refuses_naming_the_time_limit(write_yaml, capsys):
    """The command always hands the search a budget (the limit's share where --budget is not given):
    the refusal still names the option the user set."""
    document = yaml.safe_load(SMALL_MEMORY.read_text())
    document["devices"][0]["type"] = "V100-16GB"
    document["training"]["recompute"] = False
    path = write_yaml(document)
    assert main([str(path), "--time-limit", "0.3", "--tensor-degrees", "1", "--no-exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field '--time-limit'" in err and "raise --time-limit" in err, err


def test_the_command_refuses_in_one_line_when_the_budget_ends_before_a_plan_fits(write_yaml, capsys):
    document = yaml.safe_load(SMALL_MEMORY.read_text())
    document["devices"][0]["type"] = "V100-16GB"
    document["training"]["recompute"] = False
    path = write_yaml(document)
    assert main([str(path), "--time-limit", "60", "--budget", "0.05", "--tensor-degrees", "1", "--no-exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "raise --budget" in err and "Traceback" not in err


def test_same_budget_same_plan_when_only_tensor_groups_fit(write_yaml):
    """Construction without a plan ends on its work budget: two limits, one plan."""
    job = _only_16gb(write_yaml, recompute=False)
    runs = [search(job.topology, job.model, job.training,
                   SearchOptions(seed=0, time_limit_s=limit, budget_s=0.2, max_evaluations=20, exact=False))
            for limit in (20.0, 60.0)]
    assert [r.plan.search["clock_cut"] for r in runs] == [[], []] and runs[0].plan.tensor_groups
    assert _plan_key(runs[0]) == _plan_key(runs[1]) and runs[0].evaluations == runs[1].evaluations


@pytest.mark.parametrize("limit", [1.0, 2.0])
def test_case5_search_ends_within_its_limit(limit, tmp_path, capsys):
    out = tmp_path / "plan.json"
    started = time.perf_counter()
    assert main([str(CASE5), "--time-limit", str(limit), "-o", str(out)]) == 0
    wall = time.perf_counter() - started
    plan, _ = read_plan(out)
    assert plan.search["wall_s"] <= limit + OVERRUN_S
    # simulated, or (a loaded machine at 1 s) the simulation cut and said so: the plan keeps its estimate
    assert plan.search["simulated"] >= 1 or "simulation" in plan.search["clock_cut"]
    assert wall <= limit + OVERRUN_S + 1.0  # + reading the topology and writing the plan
    job = load_job(CASE5)
    validate_plan(plan, job.topology, job.model, job.training)


def _plan_key(result) -> tuple:
    p = result.plan
    return p.assignment, p.layer_bounds, p.micro_batches, p.micro_batch_size, p.schedule


def test_same_plan_on_a_machine_twice_as_slow_when_the_clock_cuts_nothing(write_yaml, monkeypatch):
    """The work budgets, not the clock, end every phase: a clock that runs twice as fast (a machine
    at half speed) changes nothing while the phases fit their shares."""
    job = load_job(write_yaml(small_topology()))
    options = SearchOptions(seed=3, time_limit_s=20.0, exact=False, max_evaluations=300)
    normal = search(job.topology, job.model, job.training, options)
    assert normal.plan.search["clock_cut"] == [] and normal.wall_s < 10.0
    real = time.perf_counter
    origin = real()
    monkeypatch.setattr(time, "perf_counter", lambda: origin + 2.0 * (real() - origin))
    slow = search(job.topology, job.model, job.training, options)
    monkeypatch.undo()
    assert slow.plan.search["clock_cut"] == [] and _plan_key(slow) == _plan_key(normal)
    assert slow.evaluations == normal.evaluations


def test_a_limit_too_short_for_any_phase_still_gives_a_valid_plan(write_yaml):
    job = load_job(write_yaml(small_topology()))
    started = time.perf_counter()
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=1e-3))
    assert time.perf_counter() - started < 2.0
    assert result.plan.search["simulated"] >= 1 and "local" in result.plan.search["clock_cut"]
    validate_plan(result.plan, job.topology, job.model, job.training)


def test_same_budget_same_plan_under_different_time_limits(write_yaml):
    """``--budget`` is the reproducible knob, the time limit a cap: while the cap leaves every phase
    its work, two limits give the same plan, and a smaller budget does less work."""
    job = load_job(write_yaml(small_topology()))
    runs = [search(job.topology, job.model, job.training, SearchOptions(seed=5, time_limit_s=limit, budget_s=1.0))
            for limit in (8.0, 40.0)]
    assert [r.plan.search["clock_cut"] for r in runs] == [[], []]
    assert _plan_key(runs[0]) == _plan_key(runs[1]) and runs[0].evaluations == runs[1].evaluations
    less = search(job.topology, job.model, job.training, SearchOptions(seed=5, time_limit_s=40.0, budget_s=0.1))
    assert less.evaluations < runs[0].evaluations


def _generated(write_yaml, devices: int):
    from benchmarks.scale import generated_topology

    document = generated_topology(devices)
    document["network"]["nic"] = "100Gbps"
    document["model"] = "gpt3-6.7b"
    document["training"] = {"global_batch": 2 * devices, "micro_batch_size": 1, "precision": "auto",
                            "recompute": True, "flash_attention": True}
    return write_yaml(document)


@pytest.mark.slow
def test_the_command_ends_within_its_limit_at_a_thousand_devices(write_yaml, tmp_path, capsys):
    """Reading, search, why-idle report and output together: within the limit plus max(2 s, 5%)."""
    path, out, limit = _generated(write_yaml, 1024), tmp_path / "plan.json", 6.0
    started = time.perf_counter()
    assert main([str(path), "--time-limit", str(limit), "-o", str(out)]) == 0
    assert time.perf_counter() - started <= limit + max(2.0, 0.05 * limit)
    assert "What binds" in capsys.readouterr().out
    _simulated_or_said_cut(out)


def _simulated_or_said_cut(out) -> None:
    """The plan in ``out`` was simulated, or (a loaded machine) its simulation was cut by the limit and
    the plan says it keeps the search's estimate."""
    plan, timed_by = read_plan(out)[0], json.loads(out.read_text())["prediction"]["cost_model"]
    if plan.search["simulated"] == 0:
        assert timed_by == CostModel.ESTIMATE and "simulation" in plan.search["clock_cut"]
    else:
        assert timed_by == CostModel.SIMULATOR


def test_cli_budget_must_be_a_positive_number(write_yaml, capsys):
    assert main([str(write_yaml(small_topology())), "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err


def test_cli_budget_with_the_dtfm_objective_is_refused(write_yaml, capsys):
    assert main([str(write_yaml(small_topology())), "--budget", "1", "--objective", "dtfm"]) == 2
    assert "--budget" in capsys.readouterr().err


def _auto_sync_topology(**training) -> dict:
    """``small_topology`` with ``sync: auto`` and four replicas pinned: every algorithm may run."""
    document = small_topology()
    document["training"] = {**document["training"], "sync": "auto", **training}
    return document


def test_auto_sync_is_chosen_within_the_budget_and_the_same_budget_gives_the_same_plan(write_yaml):
    """``sync: auto``: the best plan is simulated with every algorithm inside the finalists' share
    (the fastest wins), and two time limits with the same budget and seed give the same plan."""
    job = load_job(write_yaml(_auto_sync_topology()))
    runs = [search(job.topology, job.model, job.training,
                   SearchOptions(seed=2, time_limit_s=limit, budget_s=1.0, replicas=4, stages=1))
            for limit in (8.0, 40.0)]
    assert [r.plan.search["clock_cut"] for r in runs] == [[], []]
    tried = runs[0].plan.search["sync_tried"]
    assert set(tried) == {"ring", "hierarchical", "parameter-server", "sharded"}
    assert "sync_untried" not in runs[0].plan.search
    assert runs[0].plan.sync == min(tried, key=tried.get) and runs[0].predicted_s == pytest.approx(min(tried.values()))
    assert _plan_key(runs[0]) == _plan_key(runs[1]) and runs[0].plan.sync == runs[1].plan.sync
    assert runs[0].plan.search["sync_tried"] == runs[1].plan.search["sync_tried"]
    assert runs[0].training.sync == str(runs[0].plan.sync)
    validate_plan(runs[0].plan, job.topology, job.model, runs[0].training)


def test_auto_sync_out_of_time_keeps_the_estimates_choice_and_simulates_once(write_yaml, monkeypatch):
    """With no time left, ``sync: auto`` is not simulated per algorithm after the search: the one
    plan simulated syncs by the algorithm the estimate prefers."""
    import planner.prediction.predict as predict_module
    from planner.search import front, sync_choice

    job = load_job(write_yaml(_auto_sync_topology()))
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].sync)
        return predict_module.predict(*args, **kwargs)

    monkeypatch.setattr(front, "predict", counted)
    monkeypatch.setattr(sync_choice, "predict", counted)
    result = search(job.topology, job.model, job.training,
                    SearchOptions(time_limit_s=1e-3, replicas=4, stages=1, exact=False))
    record = result.plan.search
    assert len(calls) == 1 and record["simulated"] == 1 and "finalists" in record["clock_cut"]
    assert list(record["sync_tried"]) == [str(result.plan.sync)] and len(record["sync_untried"]) == 3
    validate_plan(result.plan, job.topology, job.model, result.training)


@pytest.mark.slow
def test_the_command_with_auto_sync_ends_within_its_limit_at_256_devices(write_yaml, tmp_path, capsys):
    """``--sync auto`` on 256 generated devices (a sharded sync's simulation there takes ~0.7 s):
    within the limit plus max(2 s, 5%), as without it. How far it gets depends on the machine: the
    plan is simulated, or its simulation was cut and it keeps the estimate, and says so."""
    path, out, limit = _generated(write_yaml, 256), tmp_path / "plan.json", 3.0
    started = time.perf_counter()
    assert main([str(path), "--time-limit", str(limit), "--sync", "auto", "-o", str(out)]) == 0
    assert time.perf_counter() - started <= limit + max(2.0, 0.05 * limit)
    assert str(read_plan(out)[0].sync) in read_plan(out)[0].search["sync_tried"]
    _simulated_or_said_cut(out)


def test_the_grouped_search_gets_the_budget_the_search_without_groups_left(write_yaml, monkeypatch):
    """Two groupings: the search without tensor groups on the whole work budget, as when groups are
    not tried (so trying them never returns a slower plan: the same seed and budget give it the
    same plan), the grouped one on all that the first did not use (``Budget.spent_s``)."""
    from planner.search import front
    from test_tensor_parallel import WIDE

    job = load_job(write_yaml(WIDE))
    seen, inner = [], front._grouped_placement_search

    def recorded(*args, **kwargs):
        plan, record = inner(*args, **kwargs)
        seen.append((args[3].work_s, record["work_used_s"], plan.prediction.iteration_s))
        return plan, record

    monkeypatch.setattr(front, "_grouped_placement_search", recorded)
    result = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=60.0, budget_s=4.0))
    (first_s, first_used_s, first_plan_s), (second_s, second_used_s, _) = seen
    assert first_s == pytest.approx(4.0) and 0.0 < first_used_s < first_s and 0.0 < second_used_s <= second_s
    assert second_s == pytest.approx(4.0 - first_used_s)
    assert result.plan.search["work_used_s"] == pytest.approx(first_used_s + second_used_s)
    assert (result.plan.stages, result.plan.replicas) == (2, 2) and result.predicted_s == pytest.approx(15.71, rel=1e-3)
    monkeypatch.undo()
    alone = search(job.topology, job.model, job.training,
                   SearchOptions(time_limit_s=60.0, budget_s=4.0, tensor_degrees=(1,)))
    assert alone.predicted_s == first_plan_s and _plan_key(alone) != _plan_key(result)


def test_a_grouping_that_finds_no_plan_counts_the_work_it_used(write_yaml, monkeypatch):
    """The search without groups refuses (nothing fits without recomputation or tensor groups)
    after the work its construction used, which the record counts, not its whole budget."""
    from planner.search import front

    job = _only_16gb(write_yaml, recompute=False)
    spent, inner = [], front._grouped_placement_search

    def recorded(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(kwargs["budget"].spent_s)

    monkeypatch.setattr(front, "_grouped_placement_search", recorded)
    result = search(job.topology, job.model, job.training,
                    SearchOptions(time_limit_s=60.0, budget_s=0.2, max_evaluations=20, exact=False))
    assert result.plan.tensor_groups and len(spent) >= 2 and spent[0] > 0.0
    assert result.plan.search["work_used_s"] == pytest.approx(sum(spent))


def _many_micro_batches(write_yaml):
    """``small_topology`` with 16,384 micro-batches: pinned to 4 x 1, a plan whose simulation
    (``simulation_units`` 65,540, 2.6 s at the rate) takes longer than a 2 s limit."""
    document = small_topology()
    document["training"] = {**document["training"], "global_batch": 16384}
    return write_yaml(document)


def test_a_simulation_longer_than_the_time_left_is_cut_and_the_plan_keeps_its_estimate(write_yaml, tmp_path,
                                                                                         capsys, monkeypatch):
    """The plan's one simulation, sized before it starts, cannot end within the limit: it is not
    started, the plan keeps the search's estimate, the report says which phases the clock cut, and
    the command ends within the limit plus 10% (it ran 0.9 s; simulating took 3-9 s more)."""
    from planner.search import front

    path, out, limit = _many_micro_batches(write_yaml), tmp_path / "plan.json", 2.0
    started_simulations = []  # the search's: sized first, this one is never started
    monkeypatch.setattr(front, "predict", lambda *a, **k: started_simulations.append(a[0]) or predict(*a, **k))
    started = time.perf_counter()
    assert main([str(path), "--time-limit", str(limit), "--stages", "4", "--replicas", "1", "-o", str(out)]) == 0
    assert time.perf_counter() - started <= 1.1 * limit
    text = capsys.readouterr().out
    cut = next(line for line in text.splitlines() if line.startswith("Cut by the time limit: "))
    assert "simulation" in cut
    assert "the search's estimate: the time limit cut this plan's event simulation" in text
    plan, _ = read_plan(out)
    assert plan.search["simulated"] == 0 and "simulation" in plan.search["clock_cut"]
    assert started_simulations == []
    document = json.loads(out.read_text())
    assert document["prediction"]["cost_model"] == "estimate"
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, json.loads((ROOT / "planner" / "schema" / "plan.schema.json").read_text()))
    job = load_job(path)
    validate_plan(plan, job.topology, job.model, job.training)


def test_a_simulation_past_its_deadline_stops(write_yaml):
    """``predict``'s deadline stops the event loop (read every few thousand events) instead of
    running the iteration to its end."""
    from cost_models.simulator import SimulationCut
    from planner.prediction.predict import predict
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    document = small_topology()
    document["training"] = {**document["training"], "global_batch": 4096}
    job = load_job(write_yaml(document))
    ctx = make_context(job.topology, job.model, job.training)
    plan = candidate_to_plan(ctx, evaluate_placement(ctx, np.array([[2, 3, 0, 1]]), 1, "1f1b"))
    with pytest.raises(SimulationCut):
        predict(plan, job.topology, job.model, job.training, deadline=time.perf_counter())
    assert predict(plan, job.topology, job.model, job.training)[0].iteration_s > 0
