"""Peak memory against what the runtime allocates: the block's saved tensors counted on the CPU, the
messages a stage holds counted from its op list, and the recorded GPU runs (the CUDA allocator's
peak per device, ``benchmarks/results/accuracy_gpu4_h200_chain``) re-predicted within 5%."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
import yaml

from conftest import ROOT
from cost_models import memory
from cost_models.schedule import stage_ops
from planner.prediction.predict import predict
from planner.runtime.gpt import build_stage
from planner.runtime.inputs import load_run_inputs

RUNS = ROOT / "benchmarks" / "results" / "accuracy_gpu4_h200_chain"


def _saved_bytes(block, x) -> int:
    """Bytes of the activations ``block`` keeps for backward (its parameters left out), by storage."""
    parameters = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in parameters:
            saved[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x).sum().backward()
    return sum(saved.values())


@pytest.mark.parametrize("recompute", [False, True])
def test_the_runtime_block_keeps_what_the_formula_counts(recompute):
    """Second derivation of ``layer_activation_bytes``: the runtime's block (no dropout, scaled dot
    product attention that keeps no scores) saves ``s*b*h*32`` bytes at 16 bits for backward, its
    input alone with recomputation (fp32 on the CPU: twice that)."""
    spec = SimpleNamespace(name="t", layers=2, hidden=256, heads=4, sequence=128, vocabulary=512, ffn_hidden=1024,
                           gated_mlp=False, tied_embeddings=True, learned_positions=True, biases=True, head="lm",
                           classes=0)
    block = build_stage(spec, 1, 2, recompute=recompute).blocks["1"]
    b = 2
    x = torch.randn(b, spec.sequence, spec.hidden, requires_grad=True)
    counted = memory.layer_activation_bytes(spec.sequence, b, spec.hidden, spec.heads, dtype_bytes=4,
                                            flash_attention=True, recompute=recompute)
    # the saved statistics (norms' means and deviations, attention's log-sum-exp) are b*s values each
    assert _saved_bytes(block, x) == pytest.approx(counted, rel=0.01)


def _held_by_hand(schedule, stage, stages, micro_batches):
    """What the runtime's pending sends hold at the stage's peak, walked op by op as the executor
    runs them: a send adds one message, kept until the sync; the peak is the last op with the most
    micro-batches between their forward and backward."""
    in_flight, best, sent, held = 0, -1, 0, 0
    for kind, _, _ in stage_ops(schedule, stage, stages, micro_batches):
        in_flight += {"fwd": 1, "bwd": -1}.get(kind, 0)
        sent += kind in ("send_fwd", "send_bwd")
        if in_flight >= best:
            best, held = in_flight, sent
    return held


def test_held_messages_one_f_one_b_and_gpipe():
    # 1F1B, S = 4, M = 16: stage i's last steady forward follows 16 forwards and 16 - (4 - i) backwards;
    # the first stage sends no gradients, the last no outputs.
    assert [float(memory.held_messages("1f1b", s, 4, 16)) for s in range(4)] == [16, 16 + 13, 16 + 14, 15]
    # GPipe peaks at its last forward: every output sent, no gradient yet.
    assert [float(memory.held_messages("gpipe", s, 4, 16)) for s in range(4)] == [16, 16, 16, 0]
    for schedule in ("1f1b", "gpipe"):
        for stages, micro_batches in ((2, 1), (3, 5), (4, 8)):
            assert [float(memory.held_messages(schedule, s, stages, micro_batches)) for s in range(stages)] == \
                [_held_by_hand(schedule, s, stages, micro_batches) for s in range(stages)]


def test_the_closed_forms_agree_with_the_op_list_walk():
    """GPipe, 1F1B (and ZB-H1's first stage, which runs 1F1B) and interleaved 1F1B in accumulation
    rounds: the closed forms the search uses at thousands of micro-batches equal the op list's walk."""
    for schedule in ("1f1b", "gpipe", "zb-h1"):
        for stages in range(1, 5):
            for micro_batches in range(1, 10):
                for per_round in range(0, 4):
                    for s in range(stages):
                        case = (schedule, s, stages, micro_batches, per_round, 1, ())
                        assert memory._peak(*case) == memory._walk(*case)[:2], case
    # interleaved 1F1B, equal chunks: rounds of whole groups of S micro-batches
    for stages, chunks in ((2, 2), (3, 2), (4, 3)):
        for micro_batches in range(stages, 4 * stages + 1, stages):
            for per_round in (0, stages, 2 * stages):
                for s in range(stages):
                    case = ("1f1b", s, stages, micro_batches, per_round, chunks, ())
                    assert memory._peak(*case) == memory._walk(*case)[:2], case


def test_interleaved_peak_weights_chunks_by_their_blocks():
    # Even chunks: the closed form of in_flight_micro_batches.
    for s in range(4):
        assert memory.peak_in_flight("1f1b", s, 4, 16, 0, 2) == \
            pytest.approx(float(memory.in_flight_micro_batches("1f1b", s, 4, 16, 0, 2)))
    # Stage 0 of 5 blocks as chunks of 3 and 2: the warm-up holds chunk 0 (3 blocks) longest.
    assert memory.peak_in_flight("1f1b", 0, 4, 16, 0, 2, chunk_layers=(3, 2)) > \
        float(memory.in_flight_micro_batches("1f1b", 0, 4, 16, 0, 2))
    # The last stage keeps the logits of its last chunk only, which its backward follows at once.
    assert memory.head_in_flight("1f1b", 3, 4, 16, 0, 2) == 1.0


def _repredict(label: str, tmp_path):
    """(predicted allocated bytes by device, measured peak by device) of recorded run ``label``."""
    results = json.loads((RUNS / label / "results.json").read_text())
    plan = tmp_path / f"{label}.yaml"
    plan.write_text(yaml.safe_dump(results["plan"]))
    shutil.copy(RUNS / "calibration.yaml", tmp_path / "calibration.yaml")
    inputs = load_run_inputs(plan, ROOT / results["plan"]["topology"]["path"])
    prediction = predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0]
    allocated = {name: used - inputs.topology.devices[inputs.topology.index(name)].memory_reserved_bytes
                 for name, used in prediction.memory_bytes.items()}
    return allocated, results["measured"]["peak_memory_bytes"]


@pytest.mark.parametrize("label, devices", [
    ("1x1-mb8-tensor-4", ("gpu-0", "gpu-1", "gpu-2", "gpu-3")),  # no dropout masks: +7.5% to +8.0% before
    ("4x1-mb2-1f1b-recompute", ("gpu-1", "gpu-2")),  # the sent messages held until the sync: -8.7%, -8.3%
    ("4x1-mb2-1f1b-interleaved-v2", ("gpu-0", "gpu-1", "gpu-2", "gpu-3")),  # uneven chunks: -3.4% to -10.7%
    ("2x1-mb4-tensor-2", ("gpu-3",)),  # a member sends nothing, keeps its outputs: +5.4%
])
def test_recorded_runs_peak_memory_within_five_percent(label, devices, tmp_path):
    predicted, measured = _repredict(label, tmp_path)
    for name in devices:
        assert predicted[name] == pytest.approx(measured[name], rel=0.05), name


def test_every_recorded_compiled_run_within_five_percent(tmp_path):
    for label in ("4x1-mb2-1f1b", "4x1-mb2-zb-h1-compiled-between"):
        predicted, measured = _repredict(label, tmp_path)
        for name, peak in measured.items():
            assert predicted[name] == pytest.approx(peak, rel=0.05), (label, name)


def test_only_the_lead_holds_the_messages_it_sent():
    """Only a tensor group's lead sends pipeline messages (``planner.runtime.engine``); another
    member keeps its in-flight outputs only, one ``(b, s, h)`` tensor each, until their backward."""
    from planner.inputs.model import ModelSpec, TrainingSpec
    from planner.prediction.stage_model import layer_costs, stage_memory_bytes

    model = ModelSpec(name="m", layers=6, hidden=512, heads=8, sequence=256, vocabulary=1000)
    costs = layer_costs(model, TrainingSpec(global_batch=8, precision="bf16"), 2, 2)
    output = 2 * 256 * 512 * 2  # b * s * h at 2 bytes
    lead = [stage_memory_bytes(costs, 3, 0, 2, 2, lead=True, held=held) for held in (0, 5)]
    assert lead[1] - lead[0] == pytest.approx(5 * output)
    member = [stage_memory_bytes(costs, 3, 0, f, 2, lead=False, held=held) for f, held in ((2, 0), (2, 5), (3, 0))]
    assert member[1] == member[0]
    blocks = stage_memory_bytes(costs, 3, 0, 3, 2, lead=True) - stage_memory_bytes(costs, 3, 0, 2, 2, lead=True)
    assert member[2] - member[0] == pytest.approx(blocks + output)


def test_the_search_counts_the_memory_the_prediction_does(tmp_path):
    """The search's memory check (``evaluate.fits``) holds the same messages as the prediction: a
    capacity a hair below each device's predicted need refuses the plan, a hair above takes it."""
    import numpy as np

    from planner.prediction.stage_model import layer_costs
    from planner.search.evaluate import fits

    results = json.loads((RUNS / "4x1-mb2-1f1b-recompute" / "results.json").read_text())
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(results["plan"]))
    shutil.copy(RUNS / "calibration.yaml", tmp_path / "calibration.yaml")
    inputs = load_run_inputs(plan_path, ROOT / results["plan"]["topology"]["path"])
    plan = inputs.plan
    prediction = predict(plan, inputs.topology, inputs.model, inputs.training)[0]
    need = np.array([[prediction.memory_bytes[name] - inputs.topology.devices[inputs.topology.index(name)]
                      .memory_reserved_bytes for name in row] for row in plan.assignment])
    costs = layer_costs(inputs.model, inputs.training, plan.micro_batch_size, plan.stages, plan.replicas)
    counts = np.diff(plan.stage_bounds)
    micro_batches = np.array(plan.micro_batches)
    assert fits(costs, plan.schedule, counts, micro_batches, need * (1 + 1e-9))
    for s in range(plan.stages):
        tight = need.copy()
        tight[0, s] *= 1 - 1e-6
        assert not fits(costs, plan.schedule, counts, micro_batches, tight), s


def test_repredict_refuses_in_one_line_and_checks_the_calibration_of_launched_plans(tmp_path, capsys):
    """``benchmarks/repredict.py``: one kind of recorded runs a call, and a folder of ``plan launch``
    outputs whose calibration changed since its plans were made is refused by the plan's field."""
    from benchmarks.repredict import main

    folder = tmp_path / "runs"
    shutil.copytree(ROOT / "benchmarks" / "results" / "compression_gpu_h100x2", folder)
    topology = str(ROOT / "topologies" / "local" / "h100-x2.yaml")
    for argv, says in (([], "give one of MODE, --runs FOLDER or --runtime-runs, not none"),
                       (["gpu4", "--runs", str(folder), "--topology", topology],
                        "give one of MODE, --runs FOLDER or --runtime-runs, not MODE and --runs"),
                       (["--runs", str(folder)], "--runs needs --topology FILE")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()  # argparse's usage, then the one line
        assert exit_.value.code == 2 and "error: " + says in err[-1] and "Traceback" not in "".join(err), err
    with (folder / "calibration.yaml").open("a") as f:
        f.write("# edited\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--runs", str(folder), "--topology", topology])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "field 'calibration.sha256'" in err[0], err
    recorded = ROOT / "benchmarks" / "results" / "compression_gpu_h100x2" / "repredict.json"
    assert (folder / "repredict.json").read_text() == recorded.read_text()  # nothing written on a refusal
