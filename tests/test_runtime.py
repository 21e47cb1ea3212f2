"""The runtime against references: single-process training, torch.distributed.pipelining, the
planner's parameter count; the launcher's failure handling; emulation following the simulator."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.errors import InputError  # noqa: E402
from planner.inputs.model import model_preset  # noqa: E402
from planner.runtime.launch import LaunchFailure, LaunchOptions, launch  # noqa: E402
from planner.runtime.reference import run_pipelining, train_single_process  # noqa: E402
from tests.runtime_helpers import cpu_topology, write_test_plan  # noqa: E402

pytestmark = pytest.mark.runtime


def _weights(folder: Path, stages: int) -> dict:
    merged = {}
    for s in range(stages):
        merged.update(torch.load(folder / "state" / f"stage{s}.pt"))
    return merged


def _assert_matches_single_process(results, out: Path, plan_kwargs: dict, iterations: int, lr: float):
    spec = model_preset("tiny")
    global_batch = plan_kwargs["micro_batch_size"] * sum(plan_kwargs["micro_batches"])
    losses, reference = train_single_process(spec, global_batch=global_batch, iterations=iterations, learning_rate=lr)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    weights = _weights(out, (len(plan_kwargs["layer_bounds"]) - 1) // plan_kwargs.get("virtual_stages", 1))
    if "head.weight" in weights:  # the last stage's copy of the tied embedding
        assert torch.allclose(weights.pop("head.weight"), reference["embed.weight"], atol=1e-5)
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    assert losses[-1] < losses[0]  # it trains


EQUIVALENCE_CASES = {
    "gpipe-uneven-layers-uneven-batch-scattered": dict(
        assignment=[["b1", "a0"], ["a1", "b0"]], layer_bounds=[0, 1, 4], micro_batches=[3, 1], micro_batch_size=2,
        schedule="gpipe"),
    "1f1b-three-stages-uneven-batch": dict(
        assignment=[["a0", "b0", "a1"], ["b1", "a2", "b2"]], layer_bounds=[0, 2, 3, 4], micro_batches=[2, 4],
        micro_batch_size=1, schedule="1f1b"),
    "zb-h1-three-stages-uneven-batch": dict(
        assignment=[["a0", "b0", "a1"], ["b1", "a2", "b2"]], layer_bounds=[0, 1, 3, 4], micro_batches=[3, 5],
        micro_batch_size=1, schedule="zb-h1"),
}


@pytest.mark.parametrize("shard, recompute", [  # each case once in the fast part, all three in the slow
    pytest.param(True, False, id="zero1"), pytest.param(False, False, id="all-reduce", marks=pytest.mark.slow),
    pytest.param(True, True, id="zero1-recompute", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", sorted(EQUIVALENCE_CASES))
def test_pipeline_and_data_parallel_training_equals_single_process(tmp_path, case, shard, recompute):
    kwargs = EQUIVALENCE_CASES[case]
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, **kwargs, shard_optimizer=shard, recompute=recompute)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    _assert_matches_single_process(results, out, kwargs, iterations=3, lr=0.05)
    assert results["run"]["world"] == sum(len(row) for row in kwargs["assignment"])
    assert results["run"]["optimizer_shards"] == (len(kwargs["assignment"]) if shard else 1)


def test_results_file_holds_measurement_prediction_and_trace(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[4], micro_batch_size=2, schedule="1f1b")
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(out)),
                     log=lambda line: None)
    measured = results["measured"]
    assert len(measured["iteration_s"]) == 3 and measured["min_s"] <= measured["median_s"] <= measured["max_s"]
    assert results["predicted"]["iteration_s"] > 0 and results["comparison"]["predicted_s"] > 0
    kinds = {(op["rank"], op["kind"]) for op in measured["trace"]}
    assert (0, "send_fwd") in kinds and (1, "recv_fwd") in kinds and (1, "bwd") in kinds
    # every op of the planner's op list appears once per rank, in the measured and the predicted trace
    for trace in (measured["trace"], results["predicted"]["trace"]):
        assert sum(1 for op in trace if op["rank"] == 0 and op["kind"] == "fwd") == 4
    trace = __import__("json").loads((out / "trace.json").read_text())
    assert any(e.get("ph") == "X" and e["pid"] == 1 for e in trace["traceEvents"])


def test_parameter_count_matches_the_cost_model():
    from planner.prediction.stage_model import layer_costs, stage_profile
    from planner.inputs.model import parse_training
    from planner.runtime.gpt import build_stage

    training = parse_training({"global_batch": 4, "precision": "fp32"})
    for spec in (model_preset("tiny"),
                 dataclasses.replace(model_preset("tiny"), gated_mlp=True, biases=False, learned_positions=False,
                                     tied_embeddings=False, ffn_hidden=96),
                 dataclasses.replace(model_preset("tiny"), head="classification", classes=5, tied_embeddings=False)):
        bounds = (0, 1, 3, spec.layers)
        profile = stage_profile(layer_costs(spec, training, 1, 3), bounds)
        for s in range(3):
            module = build_stage(spec, bounds[s], bounds[s + 1])
            assert sum(p.numel() for p in module.parameters()) == profile.parameters[s]


def test_stages_built_alone_compose_to_the_whole_model():
    from planner.runtime.gpt import build_stage

    spec = dataclasses.replace(model_preset("tiny"), learned_positions=False, gated_mlp=True, biases=False)
    tokens = torch.randint(0, spec.vocabulary, (2, spec.sequence))
    whole = build_stage(spec, 0, spec.layers)(tokens)
    parts = build_stage(spec, 2, 4)(build_stage(spec, 0, 2)(tokens))
    assert torch.allclose(whole, parts, atol=1e-6)


def test_padded_vocabulary_rows_start_at_zero_and_get_no_gradient():
    """A vocabulary of 100 trains 128 rows (a multiple of 128, as Megatron-LM pads); the 28 extra
    rows must not change training: zero at the start, never a gradient, no logits."""
    from planner.runtime.gpt import build_stage

    spec = dataclasses.replace(model_preset("tiny"), vocabulary=100, tied_embeddings=False)
    module = build_stage(spec, 0, spec.layers)
    assert module.embed.weight.shape[0] == module.head.weight.shape[0] == 128
    tokens = torch.randint(0, spec.vocabulary, (2, spec.sequence + 1))
    logits = module(tokens[:, :-1])
    assert logits.shape[-1] == 100
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for weight in (module.embed.weight, module.head.weight):
        assert not weight[100:].any() and not weight.grad[100:].any() and weight.grad[:100].any()


@pytest.mark.slow
def test_same_loss_as_torch_pipelining_on_one_split(tmp_path):
    # A vocabulary that is padded (100 -> 128) runs the padded-logits path of both runtimes.
    spec = dataclasses.replace(model_preset("tiny"), tied_embeddings=False, vocabulary=100)
    topology = cpu_topology(tmp_path / "topology.yaml")
    kwargs = dict(assignment=[["a0", "a1"]], layer_bounds=[0, 3, 4], micro_batches=[4], micro_batch_size=2,
                  schedule="gpipe")
    plan = write_test_plan(tmp_path, topology, model=spec, **kwargs)
    options = LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(tmp_path / "run"), learning_rate=0.05)
    ours = launch(plan, options, log=lambda line: None)["measured"]["loss"]
    theirs, _ = run_pipelining(spec, [0, 3, 4], micro_batch_size=2, micro_batches=4, schedule="gpipe",
                               iterations=2, learning_rate=0.05)
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_plan_for_another_topology_is_refused_before_start(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2], micro_batch_size=2, schedule="gpipe")
    other = cpu_topology(tmp_path / "other.yaml", cross_host="5Gbps")
    with pytest.raises(InputError, match="another topology"):
        launch(plan, LaunchOptions(backend="gloo", topology=str(other), out_dir=str(tmp_path / "run")),
               log=lambda line: None)
    assert not (tmp_path / "run").exists()


def _children(pid: int) -> list:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(x) for x in text]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_killed_rank_fails_the_launch_fast_with_its_name_and_no_orphans(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "a1", "b0"]], layer_bounds=[0, 1, 2, 4],
                           micro_batches=[4], micro_batch_size=1, schedule="1f1b")
    launcher = subprocess.Popen([sys.executable, "-m", "planner.cli", "launch", str(plan), "--iterations", "10000",
                                 "--emulate", "--time-scale", "5", "--backend", "gloo", "--out", str(tmp_path / "run")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = ""
        while "iteration 2/" not in line:
            line = launcher.stdout.readline()
            assert line or launcher.poll() is None, launcher.stderr.read()
        workers = sorted(p for p in _children(launcher.pid) if "spawn_main" in _cmdline(p)
                         and "resource_tracker" not in _cmdline(p))
        assert len(workers) == 3
        everything = set(_children(launcher.pid)) | set(workers)
        os.kill(workers[1], signal.SIGKILL)  # rank 1: started second
        killed_at = time.monotonic()
        code = launcher.wait(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
    error = launcher.stderr.read()
    assert code == 1, error
    assert "rank 1 (device a1, replica 0, stage 1) was killed by SIGKILL" in error
    assert "Traceback" not in error
    assert elapsed < 15
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in everything):
        time.sleep(0.1)
    alive = {p: _cmdline(p) for p in everything if Path(f"/proc/{p}").exists()}
    assert not alive


def test_a_raising_rank_is_named(tmp_path, monkeypatch):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2], micro_batch_size=2, schedule="gpipe")
    # Both ranks see the plan, but the topology vanishes once the launcher has checked it: every
    # rank raises while loading, and the launch reports one of them with its device and error.
    options = LaunchOptions(backend="gloo", iterations=1, warmup=0, out_dir=str(tmp_path / "run"))
    import planner.runtime.launch as launch_module

    original = launch_module._launch_local

    def remove_then_launch(inputs, opts, log):
        Path(inputs.topology_path).unlink()
        return original(inputs, opts, log)

    monkeypatch.setattr(launch_module, "_launch_local", remove_then_launch)
    with pytest.raises(LaunchFailure, match=r"rank \d \(device (a0|b0), replica 0, stage \d\) failed: InputError"):
        launch(plan, options, log=lambda line: None)


def _emulated_seconds(tmp_path, name, **topology_kwargs) -> tuple:
    folder = tmp_path / name
    folder.mkdir()
    topology = cpu_topology(folder / "topology.yaml", **topology_kwargs)
    plan = write_test_plan(folder, topology, assignment=[["a0", "b2"]], layer_bounds=[0, 2, 4],
                           micro_batches=[4], micro_batch_size=4, schedule="1f1b")
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(folder / "run"),
                                         emulate=True, time_scale=20.0), log=lambda line: None)
    return results["comparison"]["measured_s"], results["comparison"]["predicted_s"]


@pytest.mark.slow
def test_emulation_follows_bandwidth_and_device_speed_as_the_simulator_says(tmp_path):
    base = _emulated_seconds(tmp_path, "base")
    slow_link = _emulated_seconds(tmp_path, "slow-link", cross_host="20Mbps")
    slow_device = _emulated_seconds(tmp_path, "slow-device", slow_peak="10GFLOPS")
    for measured, predicted in (base, slow_link, slow_device):
        assert measured == pytest.approx(predicted, rel=0.25)
    for changed in (slow_link, slow_device):
        predicted_ratio = changed[1] / base[1]
        measured_ratio = changed[0] / base[0]
        assert predicted_ratio > 1.3
        assert measured_ratio == pytest.approx(predicted_ratio, rel=0.25)


def test_master_weights_step_like_fp32_adam_in_chunks(monkeypatch):
    import planner.runtime.precision as precision
    from planner.runtime.optimizer import make_optimizer

    monkeypatch.setattr(precision, "CHUNK_BYTES", 4 * 300)  # several chunks
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    half = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    with torch.no_grad():
        for r, h in zip(reference.parameters(), half.parameters()):
            r.copy_(h.float())
    fp32 = torch.optim.Adam(reference.parameters(), lr=1e-2)
    mixed = make_optimizer(half, "adam", 1e-2, torch.bfloat16, torch.device("cpu")).parts[0]
    assert len(mixed.chunks) > 1
    for _ in range(3):
        for r, h in zip(reference.parameters(), half.parameters()):
            grad = torch.randn(r.shape).to(torch.bfloat16)
            h.grad, r.grad = grad, grad.float()
        fp32.step()
        mixed.step()
        mixed.zero_grad()
        assert all(h.grad is None for h in half.parameters())
    for r, h, masters in zip(reference.parameters(), half.parameters(), [m for c in mixed.masters for m in c]):
        assert torch.allclose(masters, r, atol=1e-6)
        assert torch.equal(h, r.to(torch.bfloat16))


def test_gather_from_ranks_collects_each_rank_and_names_a_failing_one():
    from planner.runtime.spawn import RankFailure, gather_from_ranks
    from tests.runtime_helpers import rank_reporting_one_failure

    with pytest.raises(RankFailure, match=r"process 1 \(b\) failed: ValueError: boom"):
        gather_from_ranks(rank_reporting_one_failure, 3, names=["a", "b", "c"])
    assert gather_from_ranks(rank_reporting_one_failure, 1) == {0: 0}


def _job(forward, backward, step):
    import numpy as np
    from types import SimpleNamespace

    return SimpleNamespace(forward_s=np.array(forward), backward_s=np.array(backward), optimizer_s=np.array(step),
                           virtual_stages=1)


def test_compute_overrun_measures_ops_past_the_plans_scaled_durations():
    from planner.runtime.emulation import compute_overrun

    job = _job([[0.1, 0.2]], [[0.2, 0.4]], [[0.01, 0.01]])  # plan seconds, replica 0, stages 0 and 1
    scale = 2.0  # emulated seconds per plan second
    on_time = [dict(rank=0, replica=0, stage=0, kind="fwd", start_s=0.0, end_s=0.2001),
               dict(rank=1, replica=0, stage=1, kind="bwd", start_s=1.0, end_s=1.8),
               dict(rank=1, replica=0, stage=1, kind="recv_fwd", start_s=0.0, end_s=0.9)]  # waits are not compute
    calm = compute_overrun(on_time, job, scale, 2.0, names={})
    assert calm["warning"] == "" and calm["ops"] == 2 and calm["ops_over"] == 0
    late = on_time + [dict(rank=1, replica=0, stage=1, kind="fwd", start_s=2.0, end_s=2.0 + 0.4 + 0.3),
                      dict(rank=0, replica=0, stage=0, kind="step", start_s=3.0, end_s=3.0 + 0.02 + 0.05)]
    result = compute_overrun(late, job, scale, 2.0, names={1: "rank 1 (device b)"})
    assert result["per_rank"]["1"]["overrun_s"] == pytest.approx(0.3)
    assert result["per_rank"]["1"]["planned_s"] == pytest.approx(0.8 + 0.4)
    assert result["per_rank"]["0"]["overrun_s"] == pytest.approx(0.05 + 0.0001)
    assert result["worst_rank"] == 1 and result["worst_share_of_iteration"] == pytest.approx(0.15)
    assert "rank 1 (device b) took 0.300 s more" in result["warning"] and "--time-scale" in result["warning"]
    # at the suggested scale, rank 1's planned compute covers what this host took
    assert result["suggested_time_scale"] >= scale * (1.2 + 0.3) / 1.2


def test_emulated_run_past_the_plans_compute_times_warns_and_records_it(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (1e6, 1e6, 1e6))  # and a host busier than its cores
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2], micro_batch_size=1, schedule="1f1b")
    lines = []
    # 1e-4 emulated seconds per plan second: the plan's compute lasts microseconds, this host's milliseconds.
    results = launch(plan, LaunchOptions(emulate=True, time_scale=1e-4, iterations=2, warmup=0,
                                         out_dir=str(tmp_path / "run")), log=lines.append)
    overrun = results["emulation"]["compute_overrun"]
    assert overrun["ops_over"] > 0 and overrun["worst_share_of_iteration"] > 0.02
    assert overrun["suggested_time_scale"] > 1e-4
    warnings = [line for line in lines if line.startswith("warning: this host overran the plan's compute times")]
    assert len(warnings) == 1 and overrun["warning"] in warnings[0]
    assert sum(line.startswith("warning: this host's load (1000000.0 over the last minute)") for line in lines) == 1


def test_a_ranks_phase_is_the_innermost_known_function_on_its_stack():
    import sys as system

    from planner.runtime.supervise import PHASES, phase_of

    space = {"sys": system}
    exec(compile("def _recv():\n    return sys._getframe()\n", "engine.py", "exec"), space)
    exec(compile("def _run(inner):\n    return inner()\n", "worker.py", "exec"), space)
    exec(compile("def build_stage():\n    return sys._getframe()\n", "gpt.py", "exec"), space)
    assert PHASES[phase_of(space["_run"](space["_recv"]))][0] == "training: waiting for the previous or next stage"
    assert PHASES[phase_of(space["_run"](system._getframe))][0].startswith("training: synchronising")
    assert PHASES[phase_of(space["build_stage"]())][0] == "building its stage"
    assert PHASES[phase_of(system._getframe())][0] == "loading torch and the runtime"  # nothing known yet


def test_a_cpu_launch_says_what_it_costs_and_what_each_rank_does(tmp_path):
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2], micro_batch_size=1, schedule="1f1b")
    lines = []
    launch(plan, LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(tmp_path / "run"), progress_s=0.5),
           log=lines.append)
    estimate = [line for line in lines if line.startswith("training the full tiny on this CPU")]
    assert len(estimate) == 1 and "at least" in estimate[0] and "GFLOP/s of matrix products" in estimate[0]
    progress = [line for line in lines if line.startswith("[")]
    assert progress and all(" s] rank" in line for line in progress)
    from planner.runtime.supervise import PHASES

    assert any(phase in line for line in progress for phase, _ in PHASES[1:])


def test_every_phase_names_a_function_the_runtime_has():
    import importlib

    from planner.runtime.supervise import PHASES

    for phase, key in PHASES:
        if key is None:
            continue
        filename, function = key
        module = {"distributed_c10d.py": "torch.distributed.distributed_c10d", "_tensor.py": "torch._tensor"}.get(
            filename, f"planner.runtime.{filename[:-3]}")
        source = Path(importlib.import_module(module).__file__).read_text()
        assert f"def {function}(" in source, (phase, key)


def test_recompute_keeps_block_inputs_only_and_gives_the_same_gradients():
    from planner.runtime.gpt import build_stage

    spec = model_preset("tiny")
    tokens = torch.randint(0, spec.vocabulary, (2, spec.sequence))
    saved, grads = {}, {}
    for recompute in (False, True):
        module = build_stage(spec, 0, spec.layers, seed=3, recompute=recompute)
        count = [0]

        def pack(tensor, count=count):
            count[0] += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = module(tokens).float().logsumexp(-1).mean()
        loss.backward()
        saved[recompute] = count[0]
        grads[recompute] = [p.grad.clone() for p in module.parameters()]
    assert saved[True] < 0.5 * saved[False], saved
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[False], grads[True]))


def test_a_compiled_block_compiles_its_recomputation():
    """The checkpoint is inside the block's forward, so ``torch.compile`` traces it (one graph, no
    break), and the compiler's partitioner places the recomputation in the compiled backward."""
    import torch._dynamo

    from planner.runtime.gpt import build_stage

    spec = model_preset("tiny")
    block = next(iter(build_stage(spec, 0, spec.layers, seed=3, recompute=True).blocks.values()))
    x = torch.randn(2, spec.sequence, spec.hidden, requires_grad=True)
    explained = torch._dynamo.explain(block.forward)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    code = explained.graphs[0].code
    assert "checkpoint" in code, code
    block.recompute = False
    assert "checkpoint" not in torch._dynamo.explain(block.forward)(x).graphs[0].code
