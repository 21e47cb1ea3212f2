"""1F1B's warm-up depth (``cost_models.schedule.one_f_one_b_warmup``): more micro-batches in flight so
that messages over slow links overlap compute. The op lists, the memory model against them, the
simulator and the estimate over a slow line, the search's ``auto``, the lower bound below random
deepened plans, the plan file and its refusals, and the runtime against single-process training."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_models import memory
from cost_models.schedule import Op, stage_ops
from planner.errors import InputError
from planner.inputs.job import load_job
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.plan.plan import Plan, validate_plan
from planner.prediction.predict import predict
from tests.op_lists import held_peak
from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_op_lists_warm_up_k_per_stage_downstream_and_run_every_micro_batch_once(depth):
    S, M = 4, 11
    for stage in range(S):
        ops = stage_ops("1f1b", stage, S, M, warmup_depth=depth)
        forwards = [mb for kind, mb, _ in ops if kind == "fwd"]
        backwards = [mb for kind, mb, _ in ops if kind == "bwd"]
        assert forwards == list(range(M)) and backwards == list(range(M))
        warmup = min(depth * (S - stage - 1), M)
        kinds = [kind for kind, *_ in ops if kind in ("fwd", "bwd")]
        assert kinds.index("bwd") == min(warmup + 1, M)  # the warm-up, then the first steady forward
        assert held_peak(ops) == min(warmup + 1, M) == memory.peak_in_flight("1f1b", stage, S, M, warmup_depth=depth)
        assert ops[-2:] == [Op("sync", -1), Op("step", -1)]
    assert stage_ops("1f1b", 1, 3, 7, warmup_depth=1) == stage_ops("1f1b", 1, 3, 7)


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_zero_bubble_op_lists_warm_up_k_per_stage_downstream_and_hold_k_weight_gradients_per_stage_up(depth):
    """ZB-H1 at depth k: stage s runs ``k (S - s - 1)`` warm-up forwards and holds its first ``k s``
    weight gradients back, so every stage keeps at most ``k (S - 1) + 1`` micro-batches (ZB-H2's
    ``2 S - 1`` at k = 2, Qi et al. 2024, sec. 3.1); depth 1 is ZB-H1 as it was."""
    S, M = 4, 11
    for stage in range(S):
        ops = stage_ops("zb-h1", stage, S, M, warmup_depth=depth)
        backward = "bwd" if stage == 0 else "bwd_input"
        kinds = [kind for kind, *_ in ops if kind in ("fwd", backward, "bwd_weight")]
        for kind in ("fwd", backward) + (("bwd_weight",) if stage else ()):
            assert [mb for k, mb, _ in ops if k == kind] == list(range(M)), (kind, stage)
        warmup = min(depth * (S - stage - 1), M)
        assert kinds.index(backward) == min(warmup + 1, M)
        if stage:  # k s weight gradients held back, fewer where the drain comes first (M - warm-up steady steps)
            assert kinds[:kinds.index("bwd_weight")].count(backward) == min(depth * stage + 1, M - warmup + 1, M)
        peak = min(depth * (S - 1) + 1, M) if stage else min(warmup + 1, M)
        assert held_peak(ops, released=("bwd_weight",) if stage else ("bwd",)) == peak
        assert memory.peak_in_flight("zb-h1", stage, S, M, warmup_depth=depth) == peak
    assert stage_ops("zb-h1", 2, 4, 7, warmup_depth=1) == stage_ops("zb-h1", 2, 4, 7)


def test_the_closed_form_memory_matches_the_walked_op_lists():
    """In-flight micro-batches and held messages at every depth, stage, micro-batch count and round
    size: the closed form (``memory._rounds_peak``) against the walk of the op list (``memory._walk``)."""
    for S in range(2, 6):
        for M in range(1, 14):
            for depth in (1, 2, 3, 7):
                for per_round in (0, 3, 4):
                    for stage in range(S):
                        for schedule in ("1f1b", "zb-h1"):
                            walked = memory._walk(schedule, stage, S, M, per_round, 1, (), depth)[:3]
                            closed = memory._rounds_peak(schedule, stage, S, M, per_round, 1, depth)
                            assert walked == tuple(float(x) for x in closed), (schedule, S, M, depth, per_round, stage)


def test_a_bad_depth_is_one_line():
    with pytest.raises(InputError, match="training.warmup_depth.*whole number from 1 to 64"):
        parse_training({"global_batch": 8, "warmup_depth": 0})
    with pytest.raises(InputError, match="training.warmup_depth.*whole number"):
        parse_training({"global_batch": 8, "warmup_depth": "deep"})
    with pytest.raises(InputError, match="schedule is gpipe: set schedule 1f1b, zb-h1 or auto"):
        parse_training({"global_batch": 8, "warmup_depth": 3, "schedule": "gpipe"})
    with pytest.raises(InputError, match="virtual_stages is 2"):
        parse_training({"global_batch": 8, "warmup_depth": 3, "virtual_stages": 2, "schedule": "1f1b"})
    with pytest.raises(ValueError, match="deepens 1F1B or ZB-H1"):
        stage_ops("gpipe", 0, 2, 4, warmup_depth=2)
    assert parse_training({"global_batch": 8, "warmup_depth": 2, "schedule": "zb-h1"}).warmup_depth == 2


def test_the_cli_refuses_a_bad_depth_in_one_line(capsys):
    code, _, err = run_cli([TOPOLOGIES / "hetero" / "home-consumer-gpus.yaml", "--warmup-depth", "two"], capsys)
    assert code == 2 and "--warmup-depth" in err and len(err.strip().splitlines()) == 1


def _slow_line(tmp_path):
    """Three fast devices in three homes over a 100 Mbit/s, 20 ms line each way."""
    document = {"name": "slow-line", "devices": [{"name": f"d{i}", "type": "A100-80GB", "region": f"home{i}"}
                                                  for i in range(3)],
                "network": {"region": {"latency": "1ms", "bandwidth": "100Gbps"},
                            "global": {"latency": "20ms", "bandwidth": "100Mbps"}}}
    return parse_topology(document, name="slow-line")


def _line_plan(depth: int) -> Plan:
    return Plan(layer_bounds=(0, 2, 4, 6), assignment=(("d0", "d1", "d2"),), micro_batches=(16,),
                micro_batch_size=1, schedule="1f1b", warmup_depth=depth)


def test_a_deeper_warm_up_hides_a_slow_line_in_the_simulator_and_the_estimate(tmp_path):
    """Three stages over 100 Mbit/s lines, each message longer than a stage's compute: at depth 1
    the pipeline stalls on its round trips; at depth 4 it keeps more micro-batches in flight and runs
    faster, for more activations on the first stage. The estimate (``score_split``) at each depth
    stays within 15% of the simulation and orders the two the same way."""
    from planner.search.evaluate import make_context, score_split

    topology = _slow_line(tmp_path)
    model = replace(model_preset("small"), layers=6)
    training = parse_training({"global_batch": 16, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                               "schedule": "1f1b"})
    ctx = make_context(topology, model, training)
    assign = np.array([[0, 1, 2]])
    results = {}
    for depth in (1, 4):
        prediction = predict(_line_plan(depth), topology, model, training)[0]
        estimate = score_split(ctx, assign, (2, 2, 2), (16,), 1, "1f1b", warmup_depth=depth)
        assert estimate == pytest.approx(prediction.iteration_s, rel=0.15), depth
        results[depth] = (prediction, estimate)
    (shallow, shallow_estimate), (deep, deep_estimate) = results[1], results[4]
    assert deep.iteration_s < 0.8 * shallow.iteration_s
    assert deep_estimate < shallow_estimate
    assert deep.memory_bytes["d0"] > shallow.memory_bytes["d0"]
    assert deep.memory_bytes["d2"] == pytest.approx(shallow.memory_bytes["d2"])  # the last stage keeps one


def test_the_bound_of_a_deeper_zb_h1_warm_up_lies_below_it_over_a_slow_line():
    """ZB-H1 over three stages on 100 Mbit/s lines: at depth 4 its round trips overlap compute and it
    runs in less than half depth 1's time; the pair's bound at the training's depth lies below each
    (windows of ``k (S - 1) + 1`` in the bound's chains and round trips, as the plan keeps in flight)."""
    from planner.search.bounds import _pair_bounds_s

    topology, model = _slow_line(None), replace(model_preset("small"), layers=6)
    seconds = {}
    for depth in (1, 4):
        training = parse_training({"global_batch": 16, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                                   "schedule": "zb-h1", "warmup_depth": depth})
        prediction = predict(replace(_line_plan(depth), schedule="zb-h1"), topology, model, training)[0]
        assert prediction.fits
        seconds[depth] = prediction.iteration_s
        assert _pair_bounds_s(topology, model, training)[3][0] <= prediction.iteration_s * (1 + 1e-9), depth
    assert seconds[4] < 0.5 * seconds[1]


def test_a_plan_file_carries_its_depth_and_is_checked(tmp_path):
    from planner.plan.document import plan_from_document, plan_to_document

    topology = _slow_line(tmp_path)
    model = replace(model_preset("small"), layers=6)
    training = parse_training({"global_batch": 16, "micro_batch_size": 1, "schedule": "1f1b", "warmup_depth": 3})
    plan = replace(_line_plan(3), topology_sha256=topology.sha256, topology_name=topology.name)
    document = plan_to_document(plan, model=model, training=training)
    assert document["warmup_depth"] == 3 and plan_from_document(document).warmup_depth == 3
    validate_plan(plan, topology, model, training)
    with pytest.raises(InputError, match="warmup_depth.*is 2 but training.warmup_depth is 3"):
        validate_plan(replace(plan, warmup_depth=2), topology, model, training)
    with pytest.raises(InputError, match="warmup_depth.*not schedule gpipe"):
        validate_plan(replace(plan, schedule="gpipe"), topology, model,
                      replace(training, schedule="auto"))
    with pytest.raises(InputError, match="warmup_depth.*must be at least 1"):
        plan_from_document({**document, "warmup_depth": 0})


def test_auto_picks_a_deeper_warm_up_where_the_line_is_slow(tmp_path, capsys):
    """The search under ``warmup_depth: auto`` on the slow line returns a deeper 1F1B plan, faster
    than the best it finds at depth 1, says so in the schedule line and writes it to the plan."""
    import yaml

    document = {"name": "slow-line", "devices": [{"name": f"d{i}", "type": "A100-80GB", "region": f"home{i}"}
                                                  for i in range(3)],
                "network": {"region": {"latency": "1ms", "bandwidth": "100Gbps"},
                            "global": {"latency": "20ms", "bandwidth": "100Mbps"}},
                "model": {"preset": "small", "layers": 6},
                "training": {"global_batch": 16, "micro_batch_size": 1, "precision": "bf16", "schedule": "1f1b"}}
    path = tmp_path / "line.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    args = [path, "--stages", "3", "--budget", "2", "--seed", "0", "--no-exact"]
    code, plain, _ = run_cli(args + ["-o", tmp_path / "plain.yaml"], capsys)
    assert code == 0
    code, deep, _ = run_cli(args + ["--warmup-depth", "auto", "-o", tmp_path / "deep.yaml"], capsys)
    assert code == 0 and "with warm-up depth" in deep

    def seconds(text):
        return float(next(line for line in text.splitlines()
                          if line.startswith("Predicted iteration time")).split(":")[1].split()[0])

    assert seconds(deep) < 0.8 * seconds(plain)
    written = yaml.safe_load((tmp_path / "deep.yaml").read_text())
    assert written["warmup_depth"] > 1 and written["training"]["warmup_depth"] == written["warmup_depth"]
    # A re-plan after a device left picks the depth again (the file holds the depth chosen, not auto).
    code, out, err = run_cli([path, "--from", tmp_path / "deep.yaml", "--lost", "d2", "--budget", "1", "--seed", "0",
                              "-o", tmp_path / "re.yaml"], capsys)
    assert code == 0, err
    again = yaml.safe_load((tmp_path / "re.yaml").read_text())
    assert again["training"]["warmup_depth"] == again.get("warmup_depth", 1)


def test_a_re_plan_searches_the_depth_again_and_interleaving_resets_it():
    from planner.plan.plan import interleave_plan
    from planner.search.replan import _depth_searched_again

    training = parse_training({"global_batch": 16, "schedule": "auto", "warmup_depth": 3})
    assert _depth_searched_again(_line_plan(3), training).warmup_depth == "auto"
    assert _depth_searched_again(replace(_line_plan(3), schedule="zb-h1"), training).warmup_depth == "auto"
    assert _depth_searched_again(replace(_line_plan(1), schedule="gpipe"),
                                 parse_training({"global_batch": 16})).warmup_depth == 1
    assert interleave_plan(_line_plan(3), 2).warmup_depth == 1


def test_zb_h1_asked_by_name_gets_its_depth_searched_and_checked(tmp_path, capsys):
    """``--schedule zb-h1 --warmup-depth auto`` on 2 H100s returns ZB-H1 at depth 2, faster than at
    depth 1 (the first stage's wait for its first backward filled), with both depths simulated; a
    plan file whose ZB-H1 depth differs from its training's is refused in one line."""
    from planner.plan.document import plan_from_document

    topology = TOPOLOGIES / "local" / "h100-x2.yaml"
    args = [topology, "--schedule", "zb-h1", "--stages", "2", "--replicas", "1", "--micro-batch-size", "2",
            "--seed", "0", "--no-exact"]
    times = {}
    for depth in ("1", "auto"):
        code, out, err = run_cli(args + ["--warmup-depth", depth, "-o", tmp_path / f"{depth}.yaml"], capsys)
        assert code == 0, err
        times[depth] = __import__("yaml").safe_load((tmp_path / f"{depth}.yaml").read_text())
    deep, shallow = plan_from_document(times["auto"]), plan_from_document(times["1"])
    assert (deep.schedule, deep.warmup_depth, shallow.warmup_depth) == ("zb-h1", 2, 1)
    assert times["auto"]["prediction"]["iteration_s"] < 0.98 * times["1"]["prediction"]["iteration_s"]
    assert {f.get("warmup_depth", 1) for f in times["auto"]["search"]["finalists"]} == {1, 2}
    job = load_job(topology)
    training = replace(job.training, schedule="zb-h1", micro_batch_size=2, warmup_depth=1)
    with pytest.raises(InputError, match="warmup_depth.*is 2 but training.warmup_depth is 1"):
        validate_plan(replace(deep, topology_sha256=job.topology.sha256), job.topology, job.model, training)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_the_bound_stays_below_random_deepened_plans(schedule):
    """Random 1F1B (or ZB-H1) plans of two stages or more at depths 2-8 on random clustered topologies
    never simulate below their pair's bound, with the training's depth fixed to theirs or left to auto."""
    from planner.search.bounds import _pair_bounds_s
    from tests.test_bounds_clusters import _fitting_pipelines

    def training_of(rng):
        depth = int(rng.choice([2, 3, 4, 8]))
        return parse_training({"global_batch": int(rng.choice([8, 16])), "micro_batch_size": int(rng.choice([1, 2])),
                               "schedule": schedule, "precision": "fp16", "warmup_depth": depth,
                               "micro_batches_per_round": int(rng.choice([0, 0, 3])),
                               "recompute": bool(rng.random() < 0.5)})

    rng = np.random.default_rng(5)
    checked = 0
    for topology, model, training, plan, prediction in _fitting_pipelines(rng, 60, ["small", "gpt3-xl"], training_of):
        depth = training.warmup_depth
        s, d = plan.stages, plan.replicas - 1
        assert plan.warmup_depth == depth
        for asked in (depth, "auto"):
            bound = _pair_bounds_s(topology, model, replace(training, warmup_depth=asked))[s][d]
            assert bound <= prediction.iteration_s * (1 + 1e-9), (bound, prediction.iteration_s, s, d + 1, asked)
        checked += 1
    assert checked >= 15


@pytest.mark.runtime
@pytest.mark.parametrize("schedule, depth", [("1f1b", 3), ("zb-h1", 3)])
@pytest.mark.slow
def test_training_at_a_deeper_warm_up_equals_single_process(tmp_path, schedule, depth):
    """Three stages at depth 3 (stage 0 runs 6 warm-up forwards; under ZB-H1 stage s holds 3 s weight
    gradients back) on gloo: the same losses and parameters as one process, and the trace shows the
    warm-up."""
    pytest.importorskip("torch")
    from planner.runtime.launch import LaunchOptions, launch
    from tests.test_runtime import _assert_matches_single_process

    kwargs = dict(assignment=[["a0", "a1", "b0"]], layer_bounds=[0, 1, 2, 4], micro_batches=[8],
                  micro_batch_size=1, schedule=schedule)
    plan = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), **kwargs, warmup_depth=depth)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    _assert_matches_single_process(results, out, kwargs, iterations=3, lr=0.05)
    first = [(op["kind"], op["microbatch"]) for op in results["measured"]["trace"]
             if op["rank"] == 0 and op["kind"] in ("fwd", "bwd")]  # the median iteration's
    assert first.index(("bwd", 0)) == 7  # 6 warm-up forwards and the first steady one


def test_the_report_says_what_a_deeper_warm_up_would_buy(tmp_path):
    """The slow line's depth-1 plan: 'What binds' simulates it again at deeper depths and names the
    best one with its time, which the simulator gives for that depth."""
    from planner.report.why import binding_constraints

    topology = _slow_line(tmp_path)
    model = replace(model_preset("small"), layers=6)
    training = parse_training({"global_batch": 16, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                               "schedule": "1f1b"})
    plan = _line_plan(1)
    plan = plan.with_prediction(predict(plan, topology, model, training)[0])
    lines = [b for b in binding_constraints(plan, topology, model, training) if b.kind == "warm-up"]
    assert len(lines) == 1 and lines[0].change < -0.2
    depth = int(lines[0].text.split("at depth ")[1].split()[0])
    deeper = predict(replace(plan, warmup_depth=depth, prediction=None), topology, model, training)[0]
    assert f"-> {deeper.iteration_s:.4g} s" in lines[0].text
    deep_plan = replace(plan, warmup_depth=8, prediction=None)
    deep_plan = deep_plan.with_prediction(predict(deep_plan, topology, model, training)[0])
    assert not [b for b in binding_constraints(deep_plan, topology, model, training) if b.kind == "warm-up"]


def test_the_bound_of_a_deeper_warm_up_lies_below_its_plan_where_depth_one_s_does_not(tmp_path):
    """On the slow line, depth 1's bound (round trips S micro-batches apart) lies above the depth-4
    plan's simulated time; with the training's depth 4, or auto, the chains skip ``k (S - 1) + 1``
    micro-batches and the bound lies below it."""
    from planner.search.bounds import _pair_bounds_s

    topology = _slow_line(tmp_path)
    model = replace(model_preset("small"), layers=6)

    def bound(depth):
        training = parse_training({"global_batch": 16, "micro_batch_size": 1, "precision": "bf16",
                                   "optimizer": "adam", "schedule": "1f1b", "warmup_depth": depth})
        return _pair_bounds_s(topology, model, training)[3][0]

    training = parse_training({"global_batch": 16, "micro_batch_size": 1, "precision": "bf16", "optimizer": "adam",
                               "schedule": "1f1b"})
    deep = predict(_line_plan(4), topology, model, training)[0].iteration_s
    assert bound(1) > deep >= bound(4) >= bound("auto")
