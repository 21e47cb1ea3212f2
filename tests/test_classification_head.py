"""A classification head (``model.head: classification``, ``classes: N``): DTFM's runs trained one
instead of a 50k-token LM head. Parsing and its mistakes, the cost model, and training equal to
single-process training."""

import dataclasses

import pytest

from cost_models import flops
from planner.errors import InputError
from planner.inputs.model import model_preset, parse_model, parse_training
from planner.prediction.stage_model import head_outputs, layer_costs, stage_profile
from tests.runtime_helpers import cpu_topology, write_test_plan


def test_the_head_is_parsed_untied_by_default_and_mistakes_name_the_field():
    spec = parse_model({"preset": "gpt3-xl", "head": "classification", "classes": 2})
    assert spec.head == "classification" and spec.classes == 2 and not spec.tied_embeddings
    assert parse_model({"preset": "gpt3-xl"}).head == "lm"
    for document, field in (({"preset": "tiny", "head": "classification"}, "model.classes"),
                            ({"preset": "tiny", "head": "classification", "classes": 1}, "model.classes"),
                            ({"preset": "tiny", "classes": 3}, "model.classes"),
                            ({"preset": "tiny", "head": "classify", "classes": 3}, "model.head"),
                            ({"preset": "tiny", "head": "classification", "classes": 3, "tied_embeddings": True},
                             "model.tied_embeddings")):
        with pytest.raises(InputError) as error:
            parse_model(document)
        assert field in str(error.value), (document, str(error.value))


def test_a_bad_head_in_a_topology_is_one_line_with_exit_code_2(write_yaml, capsys):
    from planner.cli import main
    from tests.conftest import small_topology

    path = write_yaml(small_topology(model={"preset": "tiny", "head": "classification"}))
    assert main([str(path), "--no-exact"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.classes" in err[0] and str(path) in err[0], err


def test_the_cost_model_charges_the_last_position_only():
    """GPT-3 XL with 2 classes: the head is ``2*b*h*N`` FLOPs and ``h*N`` weights instead of the
    LM head's ``2*b*s*h*V`` and ``h*V``; the last stage gets lighter and keeps no logits to speak of."""
    training = parse_training({"global_batch": 16, "precision": "bf16"})
    lm = model_preset("gpt3-xl")
    classifier = dataclasses.replace(lm, head="classification", classes=2, tied_embeddings=False)
    assert head_outputs(classifier) == (2, 1) and head_outputs(lm) == (flops.padded_vocabulary(lm.vocabulary),
                                                                       lm.sequence)
    b = 2
    costs = {m.head: layer_costs(m, training, b, 2) for m in (lm, classifier)}
    assert costs["classification"].head_forward_flops == 2.0 * b * lm.hidden * 2
    assert costs["classification"].last_params == 2 * lm.hidden + lm.hidden * 2  # final LayerNorm + head
    # bf16 logits (memory.logits_bytes), the final norm's input (the last block's output) and its
    # output at the last position (memory.final_norm_bytes)
    assert costs["classification"].last_kept_bytes == 2.0 * b * 2 + 2.0 * b * lm.hidden * (lm.sequence + 1)
    bounds = (0, 12, 24)
    light, heavy = stage_profile(costs["classification"], bounds), stage_profile(costs["lm"], bounds)
    assert light.forward_flops[1] < heavy.forward_flops[1] and light.parameters[1] < heavy.parameters[1]
    assert light.forward_flops[0] == heavy.forward_flops[0]


@pytest.mark.runtime
@pytest.mark.slow
def test_classification_training_equals_single_process(tmp_path):
    torch = pytest.importorskip("torch")
    from planner.runtime.launch import LaunchOptions, launch
    from planner.runtime.reference import train_single_process

    spec = dataclasses.replace(model_preset("tiny"), head="classification", classes=3, tied_embeddings=False)
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 1, 4],
                           micro_batches=[3, 1], micro_batch_size=2, schedule="1f1b", model=spec)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=4, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    losses, reference = train_single_process(spec, global_batch=8, iterations=4, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    weights = {}
    for s in range(2):
        weights.update(torch.load(out / "state" / f"stage{s}.pt"))
    assert weights["head.weight"].shape == (3, spec.hidden)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    assert losses[0] == pytest.approx(torch.log(torch.tensor(3.0)).item(), rel=0.2)  # about chance at the start


def test_the_head_reads_the_last_positions_hidden_state():
    """The logits are the head applied to the normalised hidden state of the last position, so they
    change when only the last token changes (which no earlier position sees, attention being causal)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from planner.runtime.gpt import build_stage

    spec = dataclasses.replace(model_preset("tiny"), head="classification", classes=3, tied_embeddings=False)
    module = build_stage(spec, 0, spec.layers, seed=1)
    tokens = torch.randint(0, spec.vocabulary, (2, spec.sequence), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = module.embed(tokens) + module.positions(torch.arange(spec.sequence))
        for block in module.blocks.values():
            hidden = block(hidden)
        expected = F.linear(module.norm(hidden[:, -1]), module.head.weight)
        logits = module(tokens)
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % spec.vocabulary
        assert logits.shape == (2, 3) and torch.allclose(logits, expected, atol=1e-6)
        assert not torch.allclose(module(changed), logits)
