"""Cost in dollars: prices in the catalog and the topology, the price of an iteration by hand, the
cost and budget objectives, the time / $ front and the K best distinct plans."""

import numpy as np
import pytest
import yaml

from conftest import small_topology
from planner.cli import main
from planner.errors import InputError
from planner.inputs.catalog import PRICE_PER_HOUR_USD, load_catalog
from planner.inputs.job import load_job
from planner.inputs.topology import parse_topology
from planner.plan.document import plan_from_document
from planner.plan.plan import Plan
from planner.prediction.predict import predict
from planner.search.dollars import egress_bytes, plan_dollars, usd_per_iteration
from planner.search.front import SearchOptions, search
from planner.search.objective import DollarCost, TimeUnderBudget, make_objective
from planner.search.pareto import pareto_front, top_plans

PRICED = {"devices": [{"name": "fast", "count": 2, "type": "A100-80GB", "region": "east", "price_per_hour_usd": 3.6},
                      {"name": "slow", "count": 2, "type": "T4", "region": "west", "price_per_hour_usd": 0.36}],
          "network": {**small_topology()["network"], "egress_usd_per_gb": 10.0}}


def test_every_catalog_type_has_a_price_with_its_source():
    assert set(PRICE_PER_HOUR_USD) == set(load_catalog())
    assert all(kind.price_per_hour_usd == PRICE_PER_HOUR_USD[name] > 0 for name, kind in load_catalog().items())
    source = (__import__("planner.inputs.catalog", fromlist=["x"]).__file__)
    text = open(source).read()
    for name in PRICE_PER_HOUR_USD:  # each default cites a provider and a date on its line
        line = next(line for line in text.splitlines() if line.strip().startswith(f'"{name}":'))
        assert "#" in line and any(p in line for p in ("Lambda", "AWS", "RunPod")) and "20" in line, line


def test_topology_prices_override_the_catalog_and_egress_is_per_region_pair():
    topology = parse_topology(PRICED)
    assert [d.price_per_hour_usd for d in topology.devices] == [3.6, 3.6, 0.36, 0.36]
    assert topology.egress_usd_per_gb.tolist() == [[0.0, 10.0], [10.0, 0.0]]
    default = parse_topology({**PRICED, "network": small_topology()["network"],
                              "devices": [{"name": "a", "type": "T4", "region": "east"},
                                          {"name": "b", "region": "west", "peak_flops": "10TFLOPS", "memory": "8GB"}]})
    assert default.devices[0].price_per_hour_usd == PRICE_PER_HOUR_USD["T4"]
    assert default.devices[1].price_per_hour_usd is None  # a custom device has no price until the file gives one
    assert default.egress_usd_per_gb.tolist() == [[0.0, 0.02], [0.02, 0.0]]
    pairs = parse_topology({**PRICED, "network": {**small_topology()["network"], "egress_usd_per_gb": {
        "default": 0.05, "pairs": [{"from": "west", "to": "east", "usd_per_gb": 0.0}]}}})
    assert pairs.egress_usd_per_gb.tolist() == [[0.0, 0.05], [0.0, 0.0]]  # regions sorted: east, west


@pytest.mark.parametrize("devices_price, egress, field, words", [
    ("3.6$", 0.02, "devices[0].price_per_hour_usd", "without the unit"),
    (-1, 0.02, "devices[0].price_per_hour_usd", "from 0 to"),
    (1.0, "9c", "network.egress_usd_per_gb", "expected a number of US dollars per GB"),
    (1.0, {"pairs": [{"regions": ["east", "mars"], "usd_per_gb": 1}]}, "network.egress_usd_per_gb.pairs[0].regions",
     "region 'mars' has no device"),
    (1.0, {"default": 1, "per_pair": []}, "network.egress_usd_per_gb", "unknown key 'per_pair'"),
])
def test_bad_prices_are_one_line_naming_the_field(devices_price, egress, field, words, write_yaml, capsys):
    doc = small_topology()
    doc["devices"] = [dict(doc["devices"][0], price_per_hour_usd=devices_price), doc["devices"][1]]
    doc["network"] = {**doc["network"], "egress_usd_per_gb": egress}
    with pytest.raises(InputError) as error:
        parse_topology(doc)
    assert error.value.field == field and words in str(error.value)
    assert main([str(write_yaml(doc)), "--time-limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err


def test_price_of_an_iteration_by_hand():
    assert usd_per_iteration(10.0, 3.6, np.array([[0, 2e9], [0, 0]]), np.array([[0, 0.05], [0, 0]])) \
        == pytest.approx(10 * 3.6 / 3600 + 2 * 0.05)  # $0.01 of device time + $0.10 of egress
    topology, model, training = load_job_from(PRICED)
    # Two stages across the regions, one replica of 16 micro-batches of one sequence: each crosses
    # east -> west as activations (sequence 32 x hidden 64 x 2 bytes = 4,096 B) and back as gradients.
    plan = Plan(layer_bounds=(0, 2, 4), assignment=(("fast-0", "slow-0"),), micro_batches=(16,), micro_batch_size=1,
                schedule="1f1b", topology_sha256=topology.sha256)
    plan = plan.with_prediction(predict(plan, topology, model, training)[0])
    assert egress_bytes(plan, topology, model, training).tolist() == [[0.0, 16 * 4096.0], [16 * 4096.0, 0.0]]
    dollars = plan_dollars(plan, topology, model, training)
    t = plan.prediction.iteration_s
    assert dollars.usd_per_iteration == pytest.approx(t * (3.6 + 0.36) / 3600 + 2 * 16 * 4096 / 1e9 * 10.0)
    assert dollars.egress_usd == pytest.approx(2 * 16 * 4096 / 1e9 * 10.0)
    assert dollars.usd_per_million_tokens == pytest.approx(dollars.usd_per_iteration / (16 * 32) * 1e6)
    # Idle devices cost nothing unless the whole cluster is charged.
    idle = plan_dollars(plan, topology, model, training, charge_idle=True)
    assert idle.usd_per_iteration - dollars.usd_per_iteration == pytest.approx(t * (3.6 + 0.36) / 3600)
    # One stage over two replicas in two regions: a ring of two sends its whole gradients each way.
    data = Plan(layer_bounds=(0, 4), assignment=(("fast-0",), ("slow-0",)), micro_batches=(8, 8), micro_batch_size=1,
                schedule="1f1b", topology_sha256=topology.sha256)
    moved = egress_bytes(data, topology, model, training)
    from planner.prediction.stage_model import layer_costs, stage_profile
    gradients = stage_profile(layer_costs(model, training, 1, 1, 2), (0, 4)).gradient_bytes[0]
    assert moved[0, 1] == moved[1, 0] == pytest.approx(gradients) and moved[0, 0] == 0


def load_job_from(document):
    job = load_job_document(document)
    return job.topology, job.model, job.training


def load_job_document(document):
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.yaml"
        path.write_text(yaml.safe_dump({**small_topology(), **document}))
        return load_job(str(path))


@pytest.fixture(scope="module")
def pooled():
    """One cost search and one time search of the priced small topology (the pool comes back)."""
    job = load_job_document(PRICED)
    options = SearchOptions(time_limit_s=4.0, exact=False)
    time_result = search(job.topology, job.model, job.training, options)
    cost_result = search(job.topology, job.model, job.training, options, objective=make_objective("cost"))
    return job, time_result, cost_result


def test_cost_objective_picks_the_cheapest_plan_of_its_pool_and_its_bound_holds(pooled):
    job, time_result, cost_result = pooled
    pool = cost_result.pool
    assert len(pool) >= 3 and len({e.key() for e in pool}) == len(pool)
    cheapest = min(e.dollars.usd_per_iteration for e in pool)
    assert cost_result.objective == "cost"
    assert cost_result.objective_s == pytest.approx(cheapest, rel=1e-6)
    assert 0 < cost_result.lower_bound_s <= cost_result.objective_s
    time_dollars = plan_dollars(time_result.plan, job.topology, job.model, time_result.training)
    assert cost_result.objective_s <= time_dollars.usd_per_iteration
    assert cost_result.predicted_s >= time_result.predicted_s * (1 - 1e-9)
    # Here the fastest plan uses the $3.60 A100s; the cheapest leaves devices idle.
    assert cost_result.objective_s < time_dollars.usd_per_iteration


def test_pareto_front_is_non_dominated_and_holds_the_time_optimal_plan(pooled):
    job, time_result, cost_result = pooled
    pool = cost_result.pool
    front = pareto_front(pool)
    assert len(front) >= 2
    for entry in front:
        assert not any(o.iteration_s <= entry.iteration_s and o.dollars.usd_per_iteration <= entry.dollars.usd_per_iteration
                       and (o.iteration_s, o.dollars.usd_per_iteration) != (entry.iteration_s,
                                                                            entry.dollars.usd_per_iteration)
                       for o in pool)
    times = [e.iteration_s for e in front]
    assert times == sorted(times) and times[0] == min(e.iteration_s for e in pool)
    # The pool holds the placement search's plan, so the front starts no slower than the time objective.
    assert times[0] <= time_result.predicted_s * (1 + 1e-9)
    assert front[-1].dollars.usd_per_iteration == pytest.approx(cost_result.objective_s, rel=1e-6)


def test_top_k_lists_distinct_plans_best_first(pooled):
    _, _, cost_result = pooled
    best = top_plans(cost_result.pool, 3, DollarCost())
    assert len(best) == 3 and len({e.key() for e in best}) == 3
    prices = [e.dollars.usd_per_iteration for e in best]
    assert prices == sorted(prices)


def test_time_under_budget_meets_the_budget_or_says_none_does(pooled):
    job, time_result, cost_result = pooled
    pool = cost_result.pool
    low = min(e.dollars.usd_per_iteration for e in pool)
    high = max(e.dollars.usd_per_iteration for e in pool)
    budget = (low + high) / 2
    chosen = TimeUnderBudget(budget).choose(pool)
    assert chosen.dollars.usd_per_iteration <= budget
    assert chosen.iteration_s == min(e.iteration_s for e in pool if e.dollars.usd_per_iteration <= budget)
    with pytest.raises(InputError, match="no plan found costs at most") as error:
        TimeUnderBudget(low / 2).choose(pool)
    assert error.value.field == "--budget-usd-per-iteration"


def test_cli_cost_pareto_top_and_budget(tmp_path, write_yaml, capsys, monkeypatch):
    path = write_yaml({**small_topology(), **PRICED})
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "p.yaml"
    assert main([str(path), "--objective", "cost", "--pareto", "--top", "2", "--time-limit", "4", "--no-exact",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Cost: $" in text and "per million tokens" in text and "Time / $ front" in text and "The 2 best" in text
    written = sorted(tmp_path.glob("p-pareto-*.yaml"))
    assert written and all(f"p-pareto-{k}.yaml" in text for k in range(1, len(written) + 1))
    plans = [plan_from_document(yaml.safe_load(p.read_text())) for p in written]
    documents = [yaml.safe_load(p.read_text()) for p in written]
    times = [d["prediction"]["iteration_s"] for d in documents]
    assert len(plans) == len(written) and times == sorted(times)
    prices = [d["search"]["usd_per_iteration"] for d in documents]  # the front: dearer as it gets faster
    assert prices == sorted(prices, reverse=True) and documents[0]["search"]["front"]["rank"] == 1
    assert main([str(path), "--objective", "time-under-budget", "--budget-usd-per-iteration", "1e-12",
                 "--time-limit", "4", "--no-exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no plan found costs at most" in err and "--budget-usd-per-iteration" in err
    for args in (["--objective", "time-under-budget"], ["--budget-usd-per-iteration", "1"],
                 ["--budget-usd-per-iteration", "-1", "--objective", "time-under-budget"], ["--top", "0"],
                 ["--objective", "dtfm", "--pareto"]):
        assert main([str(path), "--time-limit", "2", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_a_device_without_a_price_is_named_by_the_cost_objective(write_yaml, capsys):
    doc = small_topology()
    doc["devices"] = [doc["devices"][0], {"name": "custom", "peak_flops": "20TFLOPS", "memory": "16GB",
                                          "region": "west"}]
    assert main([str(write_yaml(doc)), "--objective", "cost", "--time-limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "custom" in err and "price_per_hour_usd" in err
    assert main([str(write_yaml(doc)), "--time-limit", "2", "--no-exact"]) == 0  # time needs no price
    assert "Cost:" not in capsys.readouterr().out


def test_report_says_idle_devices_are_left_out_for_their_price(pooled):
    from planner.report.text import render_plan

    job, time_result, cost_result = pooled
    assert cost_result.plan.idle  # the cheapest plan leaves the $3.60 A100s or the T4s out
    text = render_plan(cost_result.plan, job.topology, job.model, cost_result.training, result=cost_result)
    assert "using them would not lower the dollars per iteration" in text
    assert "Lower bound on the cost objective ($" in text


def test_egress_table_adds_up_to_the_cost_models_bytes_per_iteration():
    """A second derivation: every byte of the region table (inside regions too) is one the cost
    model's ``communication_bytes`` counts, for pipeline hops and ring syncs across both regions."""
    from planner.prediction.predict import communication_bytes

    topology, model, training = load_job_from(PRICED)
    plan = Plan(layer_bounds=(0, 1, 4), assignment=(("fast-0", "slow-0"), ("slow-1", "fast-1")),
                micro_batches=(9, 7), micro_batch_size=1, schedule="1f1b", ring_orders=((0, 1), (1, 0)),
                topology_sha256=topology.sha256)
    table = egress_bytes(plan, topology, model, training)
    assert table.sum() == pytest.approx(communication_bytes(plan, model, training)["bytes_per_iteration"])
    assert table[0, 1] > 0 and table[1, 0] > 0


def test_the_report_says_cp_sat_disagrees_only_beside_a_time_plan_and_beyond_one_percent(pooled):
    """CP-SAT minimises the search's time estimate: 0.5% under the simulated plan is its rounding, 5%
    is a disagreement worth a line, and beside a plan chosen for dollars nothing compares."""
    from dataclasses import replace

    from planner.report.text import render_plan

    job, time_result, cost_result = pooled
    said = "the two disagree here"
    for result, below, expected in ((time_result, 0.005, False), (time_result, 0.05, True),
                                    (cost_result, 0.05, False)):
        shape = {"stages": 1, "replicas": 1, "micro_batch_size": 1, "schedule": "1f1b", "status": "OPTIMAL",
                 "estimate_s": result.plan.prediction.iteration_s * (1 - below), "wall_s": 0.1}
        shown = replace(result, exact_shapes=[shape])
        text = render_plan(result.plan, job.topology, job.model, result.training, result=shown)
        assert (said in text) == expected, (result.objective, below)
