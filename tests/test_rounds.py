"""Accumulation rounds: a replica's micro-batches in rounds, each its own pipeline fill and drain,
in the op lists (simulator and runtime), the memory model, the search's estimate and the runtime."""

from pathlib import Path

import numpy as np
import pytest

from cost_models.schedule import Op, round_sizes, stage_ops
from planner.inputs.job import load_topology
from planner.inputs.model import model_preset, parse_training
from planner.plan.plan import Plan
from planner.prediction.predict import predict
from planner.search.evaluate import make_context, score_split
from tests.op_lists import held_peak
from tests.runtime_helpers import cpu_topology, write_test_plan


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_rounds_run_every_micro_batch_once_and_keep_at_most_a_round(schedule):
    assert round_sizes(10, 4) == [4, 4, 2] and round_sizes(8, 0) == [8] and round_sizes(3, 8) == [3]
    for stage in range(3):
        ops = stage_ops(schedule, stage, 3, 10, 4)
        assert [mb for kind, mb, _ in ops if kind == "fwd"] == list(range(10))
        assert sorted(mb for kind, mb, _ in ops if kind == "bwd") == list(range(10))
        assert ops[-2:] == [Op("sync", -1), Op("step", -1)] and sum(kind == "step" for kind, *_ in ops) == 1
        # every micro-batch of round k is backwarded before round k + 1's first forward
        order = [(kind, mb) for kind, mb, _ in ops if kind in ("fwd", "bwd")]
        assert order.index(("bwd", 3)) < order.index(("fwd", 4)) and order.index(("bwd", 7)) < order.index(("fwd", 8))
        assert held_peak(ops) <= (4 if schedule == "gpipe" else min(3 - stage, 4))
    assert stage_ops(schedule, 1, 3, 7) == stage_ops(schedule, 1, 3, 7, 0)


def test_rounds_cost_a_fill_each_and_cut_gpipe_memory(tmp_path):
    """4 micro-batches under GPipe in rounds of 2: the simulator and the estimate agree, each round
    pays its own fill (longer iteration) and the stages keep half the activations."""
    topology = load_topology(cpu_topology(tmp_path / "t.yaml"))
    model = model_preset("tiny")
    results = {}
    for per_round in (0, 2):
        training = parse_training({"global_batch": 8, "micro_batch_size": 1, "precision": "fp32", "optimizer": "sgd",
                                   "schedule": "gpipe", "micro_batches_per_round": per_round})
        plan = Plan(layer_bounds=(0, 2, 4), assignment=(("a0", "b0"), ("a1", "b1")), micro_batches=(4, 4),
                    micro_batch_size=1, schedule="gpipe", micro_batches_per_round=per_round)
        prediction = predict(plan, topology, model, training)[0]
        assign = np.array([[topology.index(d) for d in row] for row in plan.assignment])
        estimate = score_split(make_context(topology, model, training), assign, (2, 2), (4, 4), 1, plan.schedule)
        assert estimate == pytest.approx(prediction.iteration_s, rel=0.05), per_round
        results[per_round] = prediction
    assert results[2].iteration_s > results[0].iteration_s * 1.05
    assert results[2].breakdown_s["bubble_s"] > results[0].breakdown_s["bubble_s"]
    assert results[2].memory_bytes["a0"] < results[0].memory_bytes["a0"]


@pytest.mark.runtime
@pytest.mark.slow
def test_training_in_rounds_equals_single_process(tmp_path):
    pytest.importorskip("torch")
    from planner.runtime.launch import LaunchOptions, launch
    from tests.test_runtime import _assert_matches_single_process

    kwargs = dict(assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 1, 4], micro_batches=[3, 2],
                  micro_batch_size=2, schedule="1f1b")
    plan = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), **kwargs, micro_batches_per_round=2)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    _assert_matches_single_process(results, out, kwargs, iterations=3, lr=0.05)
    fwd = [op["microbatch"] for op in results["measured"]["trace"] if op["rank"] == 0 and op["kind"] == "fwd"]
    bwd = [op for op in results["measured"]["trace"] if op["rank"] == 0 and op["kind"] in ("fwd", "bwd")]
    assert fwd == [0, 1, 2] and [(op["kind"], op["microbatch"]) for op in bwd].index(("bwd", 1)) < \
        [(op["kind"], op["microbatch"]) for op in bwd].index(("fwd", 2))


@pytest.mark.parametrize("value", [-1, "four", True, 1.5])
def test_a_bad_round_size_is_one_line(value):
    from planner.errors import InputError

    with pytest.raises(InputError, match="micro_batches_per_round"):
        parse_training({"global_batch": 8, "micro_batches_per_round": value})


def test_a_gpipe_plan_that_does_not_fit_is_told_about_rounds(capsys):
    """DTFM case 5 at 4 x 16 under GPipe keeps 64 micro-batches' activations on a 16 GB V100: the
    error names the schedule and the rounds; in rounds of 16 the same shape fits."""
    from tests.runtime_helpers import run_cli

    case5 = Path(__file__).resolve().parent.parent / "topologies" / "dtfm" / "case5-worldwide.yaml"
    args = [case5, "--schedule", "gpipe", "--stages", "4", "--replicas", "16",
            "--time-limit", "2"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "--micro-batches-per-round" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run_cli(args + ["--micro-batches-per-round", "16"], capsys)
    assert code == 0 and "in accumulation rounds of 16 micro-batches" in out
