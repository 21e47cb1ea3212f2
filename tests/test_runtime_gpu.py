"""The runtime on CUDA GPUs with NCCL (skipped without at least 2 GPUs)."""

import pytest

torch = pytest.importorskip("torch")

from planner.inputs.model import model_preset  # noqa: E402
from planner.runtime.launch import LaunchOptions, launch  # noqa: E402
from planner.runtime.reference import train_single_process  # noqa: E402
from tests.runtime_helpers import cpu_topology, write_test_plan  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs 2 CUDA GPUs")]


@pytest.mark.parametrize("compile", ["off", "on"])
@pytest.mark.parametrize("shape", ["pipeline", "data-parallel"])
def test_nccl_training_equals_single_process(tmp_path, shape, compile):
    assignment = [["a0", "a1"]] if shape == "pipeline" else [["a0"], ["a1"]]
    bounds = [0, 1, 4] if shape == "pipeline" else [0, 4]
    micro_batches = [4] if shape == "pipeline" else [3, 1]
    topology = cpu_topology(tmp_path / "topology.yaml")  # fp32 plan: no autocast, so CPU and GPU agree
    plan = write_test_plan(tmp_path, topology, assignment=assignment, layer_bounds=bounds,
                           micro_batches=micro_batches, micro_batch_size=2, schedule="1f1b")
    results = launch(plan, LaunchOptions(iterations=3, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05,
                                         backend="nccl", compile=compile), log=lambda line: None)
    assert results["run"]["backend"] == "nccl" and results["run"]["compiled"] == (compile == "on")
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=3, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)
    assert all(b and b > 0 for b in results["measured"]["peak_memory_bytes"].values())


@pytest.mark.parametrize("shape", ["pipeline", "replicas", "tensor-group"])
def test_nccl_training_with_cuda_graphs_equals_single_process(tmp_path, shape):
    """Blocks replayed as CUDA graphs: every stage's under ``--compile graphs`` (2 stages, 4 micro-batches
    in flight; 2 replicas, uneven, their gradients summed from the graphs' outputs), a tensor group's
    under ``auto`` (its all-reduces inside the graphs)."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    if shape == "pipeline":
        plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1"]], layer_bounds=[0, 1, 4], micro_batches=[4],
                               micro_batch_size=2, schedule="1f1b")
    elif shape == "replicas":
        plan = write_test_plan(tmp_path, topology, assignment=[["a0"], ["a1"]], layer_bounds=[0, 4],
                               micro_batches=[3, 1], micro_batch_size=2, schedule="1f1b")
    else:
        plan = write_test_plan(tmp_path, topology, assignment=[["a0"]], tensor_groups=[["a0", "a1"]],
                               layer_bounds=[0, 4], micro_batches=[4], micro_batch_size=2, schedule="1f1b")
    compile = "auto" if shape == "tensor-group" else "graphs"
    results = launch(plan, LaunchOptions(iterations=4, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05,
                                         backend="nccl", compile=compile), log=lambda line: None)
    assert results["run"]["graphs"] == ("tensor" if shape == "tensor-group" else "all")
    assert results["run"]["graphed_stages"] == ([0, 1] if shape == "pipeline" else [0])
    assert results["run"]["graph_skips"] == 0  # every graphed block ran as its graph
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=4, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)


@pytest.mark.parametrize("shape", ["pipeline", "tensor-group"])
def test_nccl_zero_bubble_training_equals_single_process(tmp_path, shape):
    """ZB-H1 on 2 GPUs, each block compiled whole with its products split (``--compile auto``): 2
    stages (the second defers its weight gradients), or one stage on a tensor group of 2 (the
    group's all-reduces in the same graphs; a first stage's backwards run whole, the weight
    gradients added inside them)."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    layout = {"pipeline": {"assignment": [["a0", "a1"]], "layer_bounds": [0, 2, 4]},
              "tensor-group": {"assignment": [["a0"]], "tensor_groups": [["a0", "a1"]], "layer_bounds": [0, 4]}}[shape]
    plan = write_test_plan(tmp_path, topology, micro_batches=[4], micro_batch_size=2, schedule="zb-h1", **layout)
    results = launch(plan, LaunchOptions(iterations=3, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05,
                                         backend="nccl"), log=lambda line: None)
    assert results["run"]["compiled"] is True and not results["run"].get("graphed_stages")
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=3, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_nccl_deeper_warm_up_training_equals_single_process(tmp_path, schedule):
    """2 stages at warm-up depth 4 on 2 GPUs: the first stage sends 5 forwards before its first
    gradient comes back, over NCCL; under ZB-H1 (compiled, its products split) the second stage holds
    4 weight gradients back."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1"]], layer_bounds=[0, 2, 4],
                           micro_batches=[8], micro_batch_size=1, schedule=schedule, warmup_depth=4)
    results = launch(plan, LaunchOptions(iterations=3, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05,
                                         backend="nccl"), log=lambda line: None)
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=3, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)


def test_nccl_interleaved_training_with_compiled_chunks_equals_single_process(tmp_path):
    """2 stages x 2 chunks on 2 GPUs, each chunk's blocks compiled (auto on GPUs): the messages wrap
    from the last stage to the first over NCCL."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1"]], layer_bounds=[0, 1, 2, 3, 4],
                           micro_batches=[4], micro_batch_size=2, schedule="1f1b", virtual_stages=2)
    results = launch(plan, LaunchOptions(iterations=3, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05,
                                         backend="nccl"), log=lambda line: None)
    assert results["run"]["compiled"] is True
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=3, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)


def test_bf16_training_with_master_weights_tracks_fp32(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1"]], layer_bounds=[0, 2, 4],
                           micro_batches=[4], micro_batch_size=2, schedule="1f1b", optimizer="adam")
    text = plan.read_text().replace("precision: fp32", "precision: bf16")
    plan.write_text(text)
    results = launch(plan, LaunchOptions(iterations=5, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=1e-2,
                                         backend="nccl"), log=lambda line: None)
    assert results["run"]["precision"] == "bf16"
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=5, learning_rate=1e-2,
                                     optimizer="adam")
    # bf16 rounding: the first loss (before any update) agrees closely, then the curves stay near
    assert results["measured"]["loss"][0] == pytest.approx(losses[0], rel=0.01)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=0.1)


def test_fp16_training_with_loss_scaling_tracks_fp32(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1"]], layer_bounds=[0, 2, 4],
                           micro_batches=[4], micro_batch_size=2, schedule="1f1b", optimizer="adam")
    plan.write_text(plan.read_text().replace("precision: fp32", "precision: fp16"))
    results = launch(plan, LaunchOptions(iterations=5, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=1e-2,
                                         backend="nccl"), log=lambda line: None)
    run = results["run"]
    assert run["precision"] == "fp16" and run["loss_scale"] >= 1.0 and run["skipped_steps"] == 0
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=5, learning_rate=1e-2,
                                     optimizer="adam")
    assert results["measured"]["loss"][0] == pytest.approx(losses[0], rel=0.01)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=0.1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tensor_parallel_degree_2_with_nccl_tracks_single_process(tmp_path, precision):
    """One stage on a tensor group of the 2 GPUs (Megatron splits, NCCL all-reduces): fp32 equals
    single-process training; bf16 with fp32 master weights stays near it."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0"]], tensor_groups=[["a0", "a1"]], layer_bounds=[0, 4],
                           micro_batches=[4], micro_batch_size=2, schedule="1f1b", optimizer="adam")
    plan.write_text(plan.read_text().replace("precision: fp32", f"precision: {precision}"))
    results = launch(plan, LaunchOptions(iterations=5, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=1e-2,
                                         backend="nccl"), log=lambda line: None)
    run = results["run"]
    assert run["backend"] == "nccl" and run["precision"] == precision and run["world"] == 2
    assert set(results["measured"]["peak_memory_bytes"]) == {"a0", "a1"}
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=5, learning_rate=1e-2,
                                     optimizer="adam")
    if precision == "fp32":
        assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-4)
    else:
        assert results["measured"]["loss"][0] == pytest.approx(losses[0], rel=0.01)
        assert results["measured"]["loss"] == pytest.approx(losses, rel=0.1)
