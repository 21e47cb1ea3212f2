"""Activation recomputation in the runtime, per worker (``planner.plan.recompute``): a block's three
modes compute the same thing and keep less the more they recompute (selective: the attention core,
Korthikanti et al. 2022, sec. 5); a plan whose workers run different modes trains like one process;
``plan launch`` refuses a malformed table of modes."""

import contextlib
import copy

import pytest
import yaml

torch = pytest.importorskip("torch")

from planner.inputs.model import model_preset  # noqa: E402
from planner.plan.recompute import RecomputeMode  # noqa: E402
from planner.runtime import gpt  # noqa: E402
from planner.runtime.gpt import build_stage  # noqa: E402
from planner.runtime.launch import LaunchOptions, launch  # noqa: E402
from tests.runtime_helpers import cpu_topology, run_cli, two_by_two_plan, write_test_plan  # noqa: E402
from tests.test_runtime import _assert_matches_single_process  # noqa: E402
from tests.test_runtime_tensor import GATED  # noqa: E402

pytestmark = pytest.mark.runtime


def _block_step(block, x: torch.Tensor, mode: RecomputeMode, backend=None) -> tuple:
    """(output, parameter gradients, input gradient, bytes the autograd graph saved) of one forward and
    backward of ``block`` in ``mode``, attention by ``backend`` (an SDPA backend; None: torch's choice)."""
    block.recompute = mode
    block.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    saved_bytes = [0]

    def pack(tensor):
        saved_bytes[0] += tensor.numel() * tensor.element_size()
        return tensor

    # The recomputation must take the forward's attention path, so the backward runs under it too.
    with torch.nn.attention.sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            y = block(x)
        (y * torch.linspace(-1.0, 1.0, y.shape[-1])).square().sum().backward()
    return y.detach(), [p.grad.clone() for p in block.parameters()], x.grad.clone(), saved_bytes[0]


@pytest.mark.parametrize("spec", [model_preset("tiny"), GATED], ids=["tiny", "gated-rotary"])
def test_the_three_modes_give_the_same_output_and_gradients(spec):
    block = build_stage(spec, 0, 1, seed=3).blocks["0"]
    x = torch.randn(2, spec.sequence, spec.hidden, generator=torch.Generator().manual_seed(5))
    out, grads, x_grad, _ = _block_step(block, x, RecomputeMode.NONE)
    for mode in (RecomputeMode.SELECTIVE, RecomputeMode.FULL):
        other, other_grads, other_x_grad, _ = _block_step(block, x, mode)
        assert torch.allclose(other, out, atol=1e-6, rtol=0), mode
        assert torch.allclose(other_x_grad, x_grad, atol=1e-6, rtol=0), mode
        assert len(other_grads) == len(grads)
        for name, (a, b) in zip([n for n, _ in block.named_parameters()], zip(grads, other_grads)):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), (mode, name)


def test_selective_drops_the_attention_cores_square_tensors():
    """On SDPA's math path the attention core keeps its (b, a, s, s) probabilities; selective
    recomputation keeps none of them, and full keeps less still (the block's input only)."""
    spec = model_preset("tiny")
    block = build_stage(spec, 0, 1, seed=3).blocks["0"]
    b = 2
    x = torch.randn(b, spec.sequence, spec.hidden, generator=torch.Generator().manual_seed(5))
    math = torch.nn.attention.SDPBackend.MATH
    saved = {mode: _block_step(block, x, mode, math)[3] for mode in RecomputeMode}
    probabilities_bytes = b * spec.heads * spec.sequence**2 * 4  # fp32
    assert saved[RecomputeMode.NONE] - saved[RecomputeMode.SELECTIVE] >= probabilities_bytes, saved
    assert saved[RecomputeMode.FULL] < saved[RecomputeMode.SELECTIVE], saved
    # On torch's own (fused) path the core keeps no square tensor, but its output and statistics.
    fused = {mode: _block_step(block, x, mode)[3] for mode in RecomputeMode}
    assert fused[RecomputeMode.FULL] < fused[RecomputeMode.SELECTIVE] < fused[RecomputeMode.NONE], fused


@pytest.mark.parametrize("flash", [True, False], ids=["fused-attention", "math-attention"])
def test_a_selective_block_keeps_what_the_memory_model_counts(flash):
    """``cost_models.memory.layer_activation_bytes`` with selective recomputation, on either attention
    path: the math path's square tensors are not kept, so both keep the same (fp32 on the CPU)."""
    from types import SimpleNamespace

    from cost_models import memory
    from tests.test_memory_accuracy import _saved_bytes

    spec = SimpleNamespace(name="t", layers=2, hidden=256, heads=4, sequence=128, vocabulary=512, ffn_hidden=1024,
                           gated_mlp=False, tied_embeddings=True, learned_positions=True, biases=True, head="lm",
                           classes=0)
    block = build_stage(spec, 1, 2, recompute="selective").blocks["1"]
    b = 2
    x = torch.randn(b, spec.sequence, spec.hidden, requires_grad=True)
    counted = memory.layer_activation_bytes(spec.sequence, b, spec.hidden, spec.heads, dtype_bytes=4,
                                            flash_attention=flash, recompute="selective")
    backend = None if flash else torch.nn.attention.SDPBackend.MATH
    with torch.nn.attention.sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        kept = _saved_bytes(block, x)
    assert kept == pytest.approx(counted, rel=0.01)


def test_each_mode_checkpoints_what_it_recomputes_and_only_with_grad(monkeypatch):
    spec = model_preset("tiny")
    block = build_stage(spec, 0, 1, seed=3).blocks["0"]
    x = torch.randn(2, spec.sequence, spec.hidden, requires_grad=True)
    called = []

    def counting(function, *args, **kwargs):
        called.append(getattr(function, "__name__", None))
        return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(gpt, "checkpoint", counting)
    expected = {RecomputeMode.NONE: [], RecomputeMode.SELECTIVE: ["_attend"], RecomputeMode.FULL: ["layers"]}
    for mode, names in expected.items():
        called.clear()
        block.recompute = mode
        block(x).sum().backward()  # full's recomputation in backward checkpoints nothing again
        assert called == names, mode
        called.clear()
        with torch.no_grad():
            block(x)
        assert called == [], mode


@pytest.mark.parametrize("value, mode", [(False, "none"), (True, "full"), ("none", "none"), ("selective", "selective"),
                                         ("full", "full"), (RecomputeMode.SELECTIVE, "selective")])
def test_a_stage_takes_a_bool_or_a_modes_name(value, mode):
    module = build_stage(model_preset("tiny"), 1, 3, recompute=value)
    assert [block.recompute for block in module.blocks.values()] == [RecomputeMode(mode)] * 2
    assert all(type(block.recompute) is RecomputeMode for block in module.blocks.values())


def test_a_block_set_with_a_bool_recomputes_fully_or_not_at_all():
    block = build_stage(model_preset("tiny"), 0, 1).blocks["0"]
    block.recompute = True  # as benchmarks/runtime_parts.py sets it
    assert block.recompute is RecomputeMode.FULL
    block.recompute = False
    assert block.recompute is RecomputeMode.NONE


def test_an_unknown_mode_is_refused_when_building_a_stage():
    with pytest.raises(ValueError, match="partial"):
        build_stage(model_preset("tiny"), 0, 1, recompute="partial")


def test_a_compiled_block_compiles_its_selective_recomputation():
    """As with full recomputation, the attention core's checkpoint is traced into the block's one graph."""
    import torch._dynamo

    spec = model_preset("tiny")
    block = build_stage(spec, 0, 1, seed=3, recompute="selective").blocks["0"]
    x = torch.randn(2, spec.sequence, spec.hidden, requires_grad=True)
    explained = torch._dynamo.explain(block.forward)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "checkpoint" in explained.graphs[0].code


MIXED = {
    # 4 processes: each stage has a worker of every mode but one; the training names the heaviest.
    "two-by-two": dict(
        assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 2, 4],
        micro_batches=[2, 2], micro_batch_size=2, schedule="1f1b", recompute=True,
        recompute_table=[["full", "selective"], ["selective", "none"]]),
    # 6 processes: stage 0 on groups of 2 (the attention core that selective re-runs lies between
    # the all-reduces), GPipe, uneven batch; a selective training allows no full worker.
    "two-by-two-tensor-groups": dict(
        assignment=[["a0", "a2"], ["b0", "b2"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]],
        layer_bounds=[0, 2, 4], micro_batches=[2, 1], micro_batch_size=2, schedule="gpipe", recompute="selective",
        recompute_table=[["selective", "none"], ["none", "selective"]]),
}


@pytest.mark.parametrize("case", ["two-by-two", pytest.param("two-by-two-tensor-groups",
                                                             marks=pytest.mark.slow)])
def test_workers_in_mixed_modes_train_like_one_process(tmp_path, case):
    kwargs = MIXED[case]
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, **kwargs)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    _assert_matches_single_process(results, out, kwargs, iterations=3, lr=0.05)
    groups = {group[0]: group for group in kwargs.get("tensor_groups", ())}
    ran = {member: mode for row, modes in zip(kwargs["assignment"], kwargs["recompute_table"])
           for lead, mode in zip(row, modes) for member in groups.get(lead, [lead])}
    assert results["run"]["recompute"] == ran  # every process built its blocks in its own worker's mode


def _edited_plan(tmp_path, edits: dict):
    """The two-by-two plan with ``edits`` (key -> value) made to each of its replicas' entries, in order."""
    plan_file = two_by_two_plan(tmp_path)
    document = copy.deepcopy(yaml.safe_load(plan_file.read_text()))
    for key, values in edits.items():
        if key == "training.recompute":
            document["training"]["recompute"] = values
            continue
        for replica, value in zip(document["replicas"], values):
            replica[key] = value
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(document, sort_keys=False))
    return edited


@pytest.mark.parametrize("edits, field, words", [
    pytest.param({"recompute": [["partial", "none"], ["none", "none"]]}, "replicas.recompute", "'partial'",
                 id="unknown-mode"),
    pytest.param({"recompute": [["none"], ["none", "none"]]}, "replicas.recompute", "one mode per worker",
                 id="too-few-modes"),
    pytest.param({"recompute": [["none", "none"]]}, "replicas.recompute", "one mode per worker",
                 id="one-replica-without-modes"),
    pytest.param({"recompute": [["none", "full"], ["none", "none"]]}, "replicas[0].recompute", "training.recompute",
                 id="heavier-than-the-training"),
    pytest.param({"training.recompute": "auto"}, "training.recompute", "plan again", id="auto")])
def test_a_malformed_table_of_modes_is_refused_by_launch(tmp_path, capsys, edits, field, words):
    edited = _edited_plan(tmp_path, edits)
    code, out, err = run_cli(["launch", edited, "--backend", "gloo", "--out", tmp_path / "run"], capsys)
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "edited.yaml" in err and f"field '{field}'" in err and words in err, err
    assert not (tmp_path / "run").exists() and "launching" not in out


def test_a_selective_training_runs_every_worker_selective_unless_the_plan_says(tmp_path):
    from planner.plan.recompute import plan_modes
    from planner.runtime.inputs import load_run_inputs

    inputs = load_run_inputs(_edited_plan(tmp_path, {"training.recompute": "selective"}))
    assert inputs.training.recompute == "selective"
    assert plan_modes(inputs.plan, inputs.training) == (("selective", "selective"),) * 2
    (tmp_path / "edited.yaml").unlink()
    inputs = load_run_inputs(_edited_plan(tmp_path, {"training.recompute": "selective",
                                                     "recompute": [["none", "selective"], ["none", "none"]]}))
    assert plan_modes(inputs.plan, inputs.training) == (("none", "selective"), ("none", "none"))


def test_the_first_iteration_estimate_counts_the_lightest_workers_recomputation(tmp_path):
    """A lower bound stays one under mixed modes: the FLOPs of the lightest mode any worker runs."""
    from planner.prediction.stage_model import iteration_flops
    from planner.runtime.inputs import load_run_inputs
    from planner.runtime.preflight import first_iteration_estimate

    mixed = load_run_inputs(_edited_plan(tmp_path, {"training.recompute": True,
                                                    "recompute": [["full", "selective"], ["full", "full"]]}))
    flops = iteration_flops(mixed.model, mixed.plan.global_batch, recompute="selective")
    assert flops < iteration_flops(mixed.model, mixed.plan.global_batch, recompute=True)
    assert first_iteration_estimate(mixed, 1e9) == pytest.approx(flops / 1e9)
