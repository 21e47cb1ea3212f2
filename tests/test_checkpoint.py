"""Checkpoint and resume under another plan: the same losses and weights as an uninterrupted run;
a checkpoint of another model is refused in one line naming the field."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.errors import InputError  # noqa: E402
from planner.inputs.model import model_preset  # noqa: E402
from planner.runtime.reference import train_single_process  # noqa: E402
from planner.runtime.launch import LaunchOptions, launch  # noqa: E402
from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan  # noqa: E402

pytestmark = pytest.mark.runtime

_LR = 0.02
# (plan A, plan B): other stages, other replicas, other layer split, sharded state on one side only.
PLANS = {
    "2x2-sharded": dict(assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 2, 4], micro_batches=[2, 2],
                        micro_batch_size=2, schedule="1f1b", shard_optimizer=True),
    "1x3-unsharded": dict(assignment=[["a0", "b0", "a1"]], layer_bounds=[0, 1, 3, 4], micro_batches=[4],
                          micro_batch_size=2, schedule="gpipe", shard_optimizer=False),
    "3x1-sharded": dict(assignment=[["a0"], ["b0"], ["a1"]], layer_bounds=[0, 4], micro_batches=[2, 1, 1],
                        micro_batch_size=2, schedule="1f1b", shard_optimizer=True),
    "1x2-interleaved": dict(assignment=[["a0", "b0"]], layer_bounds=[0, 1, 2, 3, 4], micro_batches=[4],
                            micro_batch_size=2, schedule="1f1b", shard_optimizer=False, virtual_stages=2),
}


def _weights(folder: Path) -> dict:
    merged = {}
    for path in sorted((folder / "state").glob("stage*.pt")):
        merged.update(torch.load(path))
    merged.pop("head.weight", None) if "embed.weight" in merged else None
    return merged


def _run(plan, out: Path, iterations: int, **options) -> dict:
    return launch(plan, LaunchOptions(backend="gloo", iterations=iterations, warmup=0, out_dir=str(out),
                                      learning_rate=_LR, save_state=True, **options), log=lambda line: None)


def _assert_same_weights(got: dict, expected: dict) -> None:
    """Equal within 1e-5, except the key biases: their gradient is zero up to rounding (softmax ignores
    a score added to every key alike), and Adam divides that rounding by its own root mean square, so
    another reduction order moves them by up to 3e-5 (a lost optimizer state would move every weight)."""
    assert set(got) == set(expected)
    for name, value in expected.items():
        if name.endswith("qkv.bias"):
            third = value.numel() // 3
            keys = slice(third, 2 * third)
            assert torch.allclose(got[name][keys], value[keys], atol=1e-4), name
            got[name][keys] = value[keys]
        assert torch.allclose(got[name], value, atol=1e-5), name


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, first, second", [("adam", "2x2-sharded", "1x3-unsharded"),
                                                      ("sgd", "1x3-unsharded", "3x1-sharded"),
                                                      ("sgd", "1x2-interleaved", "1x3-unsharded")])
def test_resume_under_another_plan_continues_the_same_training(tmp_path, optimizer, first, second):
    """Plan A for 2 iterations with a checkpoint, plan B (other stages, replicas, split) resumed for 2:
    the losses and weights of plan A run 4 iterations uninterrupted (with SGD, of the single-process
    reference, which plan A equals: test_runtime)."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan_a = write_test_plan(tmp_path, topology, **PLANS[first], optimizer=optimizer, name="a.yaml")
    plan_b = write_test_plan(tmp_path, topology, **PLANS[second], optimizer=optimizer, name="b.yaml")
    if optimizer == "adam":
        whole = _run(plan_a, tmp_path / "whole", 4)
        losses, expected = whole["measured"]["loss"], _weights(tmp_path / "whole")
    else:
        losses, expected = train_single_process(model_preset("tiny"), global_batch=8, iterations=4,
                                                learning_rate=_LR, optimizer="sgd")
    checkpoints = tmp_path / "checkpoints"
    before = _run(plan_a, tmp_path / "before", 2, checkpoint_every=2, checkpoint_dir=str(checkpoints))
    after = _run(plan_b, tmp_path / "after", 2, resume=str(checkpoints))
    assert before["measured"]["loss"] + after["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    assert after["run"]["first_iteration"] == 2 and after["run"]["resumed_from"]["iteration"] == 2
    assert [c["iteration"] for c in before["run"]["checkpoints"]] == [2]
    _assert_same_weights(_weights(tmp_path / "after"), expected)
    saved = json.loads((checkpoints / "iteration-00000002" / "checkpoint.json").read_text())
    assert saved["iteration"] == 2 and saved["training"]["optimizer"] == optimizer


def _checkpoint_of(tmp_path, model=None, **changes) -> Path:
    """A plan and a checkpoint folder as a run of it writes one (``checkpoint_meta``; empty stage
    files: the refusals come before any tensor is read), with ``section__field`` values changed."""
    from planner.runtime.checkpoint import CHECKPOINT_FORMAT, checkpoint_meta
    from planner.runtime.inputs import load_run_inputs

    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, **PLANS["1x3-unsharded"])
    inputs = load_run_inputs(plan)
    folder = tmp_path / "checkpoints" / "iteration-00000001"
    folder.mkdir(parents=True)
    document = {"format": CHECKPOINT_FORMAT, "iteration": 1,
                **checkpoint_meta(seed=0, model=model or inputs.model, training=inputs.training, plan=inputs.plan)}
    for key, value in changes.items():
        section, field = key.split("__")
        document[section][field] = value
    (folder / "checkpoint.json").write_text(json.dumps(document))
    for stage in range(3):
        torch.save({}, folder / f"stage{stage}.pt")
    return plan


@pytest.mark.parametrize("changes, field", [({"model__hidden": 128}, "model.hidden"),
                                            ({"model__tied_embeddings": False}, "model.tied_embeddings"),
                                            ({"training__global_batch": 16}, "training.global_batch"),
                                            ({"training__optimizer": "adam"}, "training.optimizer")])
def test_checkpoint_of_another_model_or_training_is_refused_naming_the_field(tmp_path, capsys, changes, field):
    plan = _checkpoint_of(tmp_path, **changes)
    code, out, err = run_cli(["launch", plan, "--backend", "gloo", "--iterations", "1", "--out", tmp_path / "again",
                              "--resume", tmp_path / "checkpoints"], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"field '{field}'" in err and "checkpoint.json" in err and str(list(changes.values())[0]) in err
    assert not (tmp_path / "again").exists()


def test_emulated_checkpoint_is_refused_by_a_run_on_the_real_model(tmp_path):
    from planner.runtime.inputs import emulated_model

    plan = _checkpoint_of(tmp_path, model=emulated_model(model_preset("tiny")))
    with pytest.raises(InputError, match="model.hidden"):
        _run(plan, tmp_path / "again", 1, resume=str(tmp_path / "checkpoints"))
    # the same checkpoint is accepted up to the seed by an emulated run; the seed must agree
    with pytest.raises(InputError, match="--seed 0"):
        launch(plan, LaunchOptions(emulate=True, seed=3, out_dir=str(tmp_path / "again"),
                                   resume=str(tmp_path / "checkpoints")), log=lambda line: None)


@pytest.mark.parametrize("argv, field", [
    (["--checkpoint-every", "2"], "--checkpoint-dir"),
    (["--checkpoint-dir", "CK"], "--checkpoint-every"),
    (["--checkpoint-every", "-1", "--checkpoint-dir", "CK"], "--checkpoint-every"),
    (["--resume", "NOWHERE"], "--resume"),
    (["--resume", "EMPTY"], "--resume"),
    (["--elastic"], "--elastic"),
])
def test_checkpoint_options_are_checked_before_anything_starts(tmp_path, capsys, argv, field):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, **PLANS["1x3-unsharded"])
    (tmp_path / "EMPTY").mkdir()
    argv = [str(tmp_path / a) if a in ("CK", "NOWHERE", "EMPTY") else a for a in argv]
    code, out, err = run_cli(["launch", plan, "--backend", "gloo", "--out", tmp_path / "run"] + argv, capsys)
    assert code == 2 and err.count("\n") == 1 and f"field '{field}'" in err, err
    assert not (tmp_path / "run").exists()


def _kill_when(checkpoint: Path, rank: int, timeout_s: float = 300.0) -> None:
    """SIGKILL the local rank ``rank`` (a child of this process) once ``checkpoint`` is complete."""
    import multiprocessing
    import os
    import signal
    import time

    deadline = time.monotonic() + timeout_s
    while not (checkpoint / "checkpoint.json").exists():
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    (victim,) = [p for p in multiprocessing.active_children() if p.name == f"rank{rank}"]
    os.kill(victim.pid, signal.SIGKILL)


@pytest.mark.slow
def test_elastic_launch_replans_without_a_killed_worker_and_continues_the_loss(tmp_path):
    """Four emulated ranks (a0 b0 / a1 b1); rank 3 (b1) is killed after the checkpoint of iteration 2:
    the launch re-plans on the topology without b1, resumes from the last checkpoint and finishes the
    6 iterations; the losses after it are those of uninterrupted training of the executed model."""
    import threading

    from planner.runtime.inputs import emulated_model, load_run_inputs
    from planner.runtime.launch import auto_time_scale
    from tests.runtime_helpers import two_by_two_plan

    plan = two_by_two_plan(tmp_path)
    scale = auto_time_scale(load_run_inputs(plan)) * 0.1  # about 0.2 s per iteration
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "run"
    options = LaunchOptions(emulate=True, time_scale=scale, iterations=6, warmup=0, out_dir=str(out),
                            learning_rate=_LR, checkpoint_every=2, checkpoint_dir=str(checkpoints), elastic=True,
                            replan_budget_s=2.0)
    finished = {}
    runner = threading.Thread(target=lambda: finished.update(results=launch(plan, options, log=lambda line: None)))
    runner.start()
    _kill_when(checkpoints / "iteration-00000002", rank=3)
    runner.join(timeout=600)
    results = finished["results"]
    (event,) = results["elastic"]["events"]
    assert event["device"] == "b1" and event["failed_rank"] == 3 and "SIGKILL" in event["failure"]
    resumed_at = event["checkpoint_iteration"]
    assert resumed_at in (2, 4) and event["lost_s"] >= 0 and event["restarted_after_s"] > 0
    new_plan = results["plan"]
    used = {d for stage in new_plan["stages"] for d in stage["devices"]}
    assert "b1" not in used and event["new_plan"]["assignment"] == [r["devices"] for r in new_plan["replicas"]]
    assert Path(event["plan"]).exists() and results["run"]["plan_path"] == event["plan"]
    assert results["run"]["first_iteration"] == resumed_at
    reference, _ = train_single_process(emulated_model(model_preset("tiny")), global_batch=8, iterations=6,
                                        learning_rate=_LR, optimizer="sgd")
    assert results["measured"]["loss"] == pytest.approx(reference[resumed_at:], rel=1e-5)


def test_run_summary_says_where_the_run_resumed_and_what_it_saved():
    from planner.cli import _run_summary

    measured = {"median_s": 0.1, "p10_s": 0.1, "p90_s": 0.1, "iteration_s": [0.1], "tokens_per_s": 1.0, "mfu": 0.1,
                "loss": [4.8], "peak_memory_bytes": {}}
    run = {"emulated": False, "time_scale": 1.0, "first_iteration": 2,
           "resumed_from": {"path": "ck/iteration-00000002", "iteration": 2},
           "checkpoints": [{"iteration": 3, "path": "ck2/iteration-00000003", "seconds": 0.02}]}
    text = _run_summary({"measured": measured, "comparison": {"predicted_s": 0.1, "measured_s": 0.1}, "run": run,
                         "predicted": {"memory_bytes": {}}}, "out")
    assert "resumed from ck/iteration-00000002 at iteration 2" in text
    assert "checkpoints: 1 written, the last before iteration 3 in ck2/iteration-00000003" in text
