"""Why each idle device is idle and what binds: each reason computed by re-evaluating the plan."""

from dataclasses import replace

import numpy as np
import pytest

from conftest import ROOT, small_topology
from planner.cli import main
from planner.inputs.job import load_job
from planner.plan.plan import Plan
from planner.prediction.predict import predict
from planner.report.why import LINK_FACTOR, _faster_links, binding_constraints, idle_reasons

# One A100 that runs the plan; an A100 behind a 1 Mbit/s line; a slow custom device on a fast link;
# a device whose usable memory (100 kB) holds no stage of the tiny model.
WHY = {
    "name": "why",
    "devices": [{"name": "a", "type": "A100-80GB", "region": "here"},
                {"name": "far", "type": "A100-80GB", "region": "away"},
                {"name": "weak", "peak_flops": "0.05TFLOPS", "memory": "16GB", "region": "here"},
                {"name": "tiny-memory", "type": "T4", "memory": "2GB", "memory_reserved": "1.9999GB",
                 "region": "here"}],
    "network": {"region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                "global": {"latency": "30ms", "bandwidth": "1Mbps"}},
    "model": "tiny",
    "training": {"global_batch": 16, "micro_batch_size": 1, "schedule": "1f1b", "precision": "fp32"},
}


def _job(write_yaml, document):
    return load_job(str(write_yaml(document)))


def _plan(job, rows, bounds=(0, 4)):
    topology = job.topology
    plan = Plan(layer_bounds=bounds, assignment=tuple(tuple(r) for r in rows),
                micro_batches=tuple([16 // len(rows)] * len(rows)), micro_batch_size=1, schedule="1f1b",
                topology_sha256=topology.sha256,
                idle=tuple(n for n in topology.names if n not in {d for r in rows for d in r}))
    return plan.with_prediction(predict(plan, topology, job.model, job.training)[0])


def test_idle_reasons_memory_slow_link_and_compute_share(write_yaml):
    job = _job(write_yaml, WHY)
    plan = _plan(job, [["a"]])
    reasons = {r.devices[0]: r for r in idle_reasons(plan, job.topology, job.model, job.training)}
    assert set(reasons) == {"far", "weak", "tiny-memory"}
    assert reasons["tiny-memory"].kind == "memory" and "smallest stage" in reasons["tiny-memory"].text
    far = reasons["far"]
    assert far.kind == "slow link" and far.delta_s > 0 and far.link_cost_s > far.delta_s
    assert "0.001 Gbit/s to a" in far.text  # the 1 Mbit/s line, named
    weak = reasons["weak"]
    assert weak.kind == "compute share too small" and weak.delta_s > 0
    # The numbers are the simulator's: the added device's best placement, simulated.
    with_far = _plan(job, [["a", "far"]], bounds=(0, 2, 4))
    assert far.delta_s <= with_far.prediction.iteration_s - plan.prediction.iteration_s + 1e-9


def test_binding_link_is_the_slowest_and_its_gain_is_simulated(write_yaml):
    job = _job(write_yaml, WHY)
    plan = _plan(job, [["a", "far"]], bounds=(0, 2, 4))
    binding = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}
    link = binding["link"]
    assert "a -> far" in link.text or "far -> a" in link.text
    a, far = job.topology.index("a"), job.topology.index("far")
    faster = predict(plan, _faster_links(job.topology, [(a, far)], LINK_FACTOR), job.model, job.training)[0].iteration_s
    expected = (faster - plan.prediction.iteration_s) / plan.prediction.iteration_s
    assert link.change == pytest.approx(expected) and link.change < -0.5  # 1 -> 10 Mbit/s: most of the time goes
    assert f"cut the iteration {100 * abs(expected):.1f}%" in link.text
    assert {"bubble", "gradient sync"} <= set(binding)


def test_binding_links_that_only_move_the_iteration_together(write_yaml):
    """Four A100s in four regions joined at 1 Mbit/s, one stage each: every hop of the gradient ring
    crosses an equally slow link, so no link alone moves the iteration (the ring waits for its
    slowest hop), and the report tries the four together: their 10x, simulated, is the cut it says."""
    document = {"name": "ring", "devices": [{"name": f"r{k}", "type": "A100-80GB", "region": f"region{k}"}
                                            for k in range(4)],
                "network": {"region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                            "global": {"latency": "30ms", "bandwidth": "1Mbps"}},
                "model": "tiny", "training": WHY["training"]}
    job = _job(write_yaml, document)
    plan = _plan(job, [["r0"], ["r1"], ["r2"], ["r3"]])
    link = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}["link"]
    assert abs(link.change) < 0.01 and "alone it moves little, but the plan's 4 links within 10%" in link.text
    ring = [job.topology.index(name) for name in plan.ring(0)]
    pairs = sorted((min(a, b), max(a, b)) for a, b in zip(ring, ring[1:] + ring[:1]))
    together = predict(plan, _faster_links(job.topology, pairs, LINK_FACTOR), job.model, job.training)[0].iteration_s
    cut = (plan.prediction.iteration_s - together) / plan.prediction.iteration_s
    assert cut > 0.5 and f"cut the iteration {100 * cut:.1f}%" in link.text


def test_binding_memory_names_the_fullest_device(write_yaml):
    # 1 GiB reserved plus 3.96 MB usable: the tiny model's one stage (3.77 MB) fills it to 99.98%.
    doc = {**small_topology(), "devices": [{"name": "t", "type": "T4", "region": "east", "memory": "1077700000B",
                                            "memory_reserved": "1GiB"},
                                           {"name": "u", "type": "T4", "region": "east"}]}
    doc["training"] = {**doc["training"], "precision": "fp16"}
    job = _job(write_yaml, doc)
    plan = _plan(job, [["t"]])
    assert plan.prediction.fits
    binding = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}
    assert binding["memory"].text.startswith("memory: t holds") and "(100%)" in binding["memory"].text
    roomy = _plan(job, [["u"]])
    assert "memory" not in {b.kind for b in binding_constraints(roomy, job.topology, job.model, job.training)}


def test_report_says_why_on_the_home_swarm(capsys):
    path = ROOT / "topologies" / "hetero" / "home-consumer-gpus.yaml"
    assert main([str(path), "--time-limit", "6", "--stages", "1", "--replicas", "1"]) == 0
    out = capsys.readouterr().out
    why = out[out.index("Why idle"):]
    assert why.count("slow link") >= 3 and "Gbit/s to berlin-4090-0" in why
    assert "What binds" in why and "bubble:" in why


def test_idle_devices_without_the_plans_format_are_weighed_at_theirs(write_yaml):
    # The plan trains in bf16 on the A100; the T4 has no bf16 and is weighed at fp16 instead of failing.
    doc = {**small_topology(), "devices": [{"name": "a", "type": "A100-80GB", "region": "east"},
                                           {"name": "t", "type": "T4", "region": "east"}]}
    job = _job(write_yaml, doc)  # precision auto, which a plan on the A100 alone resolves to bf16
    plan = _plan(job, [["a"]])
    job = replace(job, training=replace(job.training, precision="bf16"))
    reasons = idle_reasons(plan, job.topology, job.model, job.training)
    assert [r.devices for r in reasons] == [("t",)] and reasons[0].kind != "not evaluated"
    assert binding_constraints(plan, job.topology, job.model, job.training)


def test_the_report_stops_re_evaluating_at_its_deadline(write_yaml):
    job = _job(write_yaml, WHY)
    plan = _plan(job, [["a"]])
    reasons = idle_reasons(plan, job.topology, job.model, job.training, deadline=0.0)  # long passed
    assert {r.kind for r in reasons} <= {"not evaluated", "memory"}  # the memory floor costs no simulation
    assert any("time ran out" in r.text for r in reasons)


def test_a_fast_idle_device_is_not_called_too_small():
    """The lab cluster's desktop RTX 4090 computes at about the used devices' speed but is left out:
    a stage more costs more than it computes, which is the shape it joins or (the search's plan of
    8 stages, its 9th) its 1 Gbit/s link, not its compute share."""
    from conftest import ROOT
    from planner.inputs.job import load_job
    from planner.search.front import SearchOptions, search

    job = load_job(ROOT / "topologies" / "hetero" / "lab-mixed-a40-l4.yaml")
    result = search(job.topology, job.model, job.training, SearchOptions(seed=0, budget_s=3, time_limit_s=120))
    reasons = {r.devices[0]: r for r in idle_reasons(result.plan, job.topology, job.model, result.training)}
    assert "desktop-4090" in reasons, reasons
    reason = reasons["desktop-4090"]
    assert reason.kind in ("shape", "slow link") and reason.delta_s > 0, reason
    assert "fill and drain" in reason.text or "on a free network it would cut" in reason.text, reason


def test_a_plan_left_at_the_estimate_is_not_compared_with_simulations(write_yaml):
    """A plan whose time is the search's estimate (the limit cut its simulation): the report
    neither sets simulated link gains nor idle devices' simulated deltas against that estimate."""
    job = _job(write_yaml, WHY)
    simulated = _plan(job, [["a", "far"]], bounds=(0, 2, 4))
    plan = replace(simulated, prediction=replace(simulated.prediction, cost_model="estimate"))
    binding = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}
    assert np.isnan(binding["link"].change) and "search's estimate" in binding["link"].text
    reasons = idle_reasons(plan, job.topology, job.model, job.training)
    assert reasons and all(np.isnan(r.delta_s) for r in reasons)


def test_a_shape_the_pins_leave_out_is_blamed_on_the_pin_not_the_budget(capsys):
    """Pinned to 4 stages x 2 replicas, each idle group would help as a third replica: the report
    names the pin that left that shape out (and writes stages x replicas, as the Degrees line does)."""
    path = ROOT / "topologies" / "hetero" / "two-datacenters-a100-v100-t4.yaml"
    assert main([str(path), "--stages", "4", "--replicas", "2", "--budget", "2"]) == 0
    helps = [line for line in capsys.readouterr().out.splitlines() if "would help" in line]
    assert helps and all("(4 stages x 3 replicas)" in line and "--replicas 2 left this shape out" in line
                         and "budget missed it" not in line for line in helps), helps


def test_binding_schedule_is_the_same_plan_simulated_under_zb_h1(write_yaml):
    """A one-chunk 1F1B plan of two stages gets the schedule line: the same placement and splits
    simulated under ZB-H1, its change exact; where ZB-H1's kept inputs do not fit, the line says
    which device overflows; a ZB-H1 plan, a one-stage plan and an interleaved one get none."""
    from planner.plan.plan import interleave_plan

    job = _job(write_yaml, WHY)
    plan = _plan(job, [["a", "weak"]], bounds=(0, 3, 4))
    binding = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}
    split = predict(replace(plan, schedule="zb-h1", prediction=None), job.topology, job.model, job.training)[0]
    expected = (split.iteration_s - plan.prediction.iteration_s) / plan.prediction.iteration_s
    assert binding["schedule"].change == pytest.approx(expected) and expected < 0
    assert f"{plan.prediction.iteration_s:.4g} -> {split.iteration_s:.4g} s" in binding["schedule"].text
    for other in (replace(plan, schedule="zb-h1"), _plan(job, [["a"]]), interleave_plan(plan, 2)):
        kinds = {b.kind for b in binding_constraints(other.with_prediction(
            predict(other, job.topology, job.model, job.training)[0]), job.topology, job.model, job.training)}
        assert "schedule" not in kinds
    # ZB-H1 keeps each micro-batch's weight-gradient inputs on the second stage: a capacity between
    # its 1F1B peak and its ZB-H1 peak leaves the line saying so (peaks taken on a small device: a
    # large one's peak counts a workspace a small one has not).
    def on_weak(memory_bytes: int):
        devices = [d if d["name"] != "weak" else {**d, "memory": f"{memory_bytes}B", "memory_reserved": "1B"}
                   for d in WHY["devices"]]
        job = _job(write_yaml, {**WHY, "devices": devices})
        plan = _plan(job, [["a", "weak"]], bounds=(0, 3, 4))
        return job, plan, predict(replace(plan, schedule="zb-h1", prediction=None), job.topology, job.model,
                                  job.training)[0]

    _, small, split = on_weak(64 * 10 ** 6)
    one_f, zb = small.prediction.memory_bytes["weak"], split.memory_bytes["weak"]
    assert zb > one_f
    job, plan, split = on_weak(int((one_f + zb) / 2) + 1)
    assert plan.prediction.fits and not split.fits
    text = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training)}["schedule"].text
    assert "would not fit (weak would need" in text


def test_binding_schedule_says_when_the_report_ran_out_of_time(write_yaml):
    """With the deadline passed, the schedule line says ZB-H1 was not re-evaluated, as the link
    line does, instead of leaving it out."""
    import time

    job = _job(write_yaml, WHY)
    plan = _plan(job, [["a", "weak"]], bounds=(0, 3, 4))
    binding = {b.kind: b for b in binding_constraints(plan, job.topology, job.model, job.training,
                                                      deadline=time.perf_counter() - 1.0)}
    assert binding["schedule"].text.startswith("schedule: ZB-H1 not re-evaluated (the report's time ran out")
    assert "not re-evaluated" in binding["link"].text
