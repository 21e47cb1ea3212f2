"""Formulas three ways: a hand case, a published number, and a second derivation."""

import pytest

from cost_models import comm, flops, memory
from planner.inputs.model import model_preset


def test_layer_parameters_hand_case():
    # h = 2: 12*4 + 13*2 = 74
    assert flops.layer_parameters(2, 8) == 74


def test_gpt3_xl_parameters_match_published_1_3e9():
    # Brown et al. 2020, Table 2.1: GPT-3 XL has 1.3B parameters.
    m = model_preset("gpt3-xl")
    total = flops.model_parameters(m.layers, m.hidden, m.ffn_hidden, m.vocabulary, m.sequence)
    assert total == pytest.approx(1.3e9, rel=0.02)


def test_llama_7b_parameters_match_published():
    # Touvron et al. 2023, Table 2: 6.7B.
    m = model_preset("llama-7b")
    total = flops.model_parameters(m.layers, m.hidden, m.ffn_hidden, m.vocabulary, m.sequence, gated_mlp=True,
                                   biases=False, tied=False, learned_positions=False)
    assert total == pytest.approx(6.74e9, rel=0.01)


def test_layer_forward_flops_hand_case():
    # b=1, s=2, h=2, f=8: 24*1*2*4 + 4*1*4*2 = 192 + 32
    assert flops.layer_forward_flops(1, 2, 2, 8) == 224


@pytest.mark.parametrize("recompute", [False, True])
def test_megatron_iteration_formula_equals_sum_of_per_layer_terms(recompute):
    # Narayanan et al. SC'21, Appendix: the closed form is the sum of the per-layer terms.
    B, s, l, h, v = 8, 2048, 24, 2048, 50257
    per_layer = l * flops.layer_forward_flops(B, s, h, 4 * h) * flops.training_flops_multiplier(recompute)
    head = 3 * flops.head_forward_flops(B, s, h, v)
    assert per_layer + head == pytest.approx(flops.megatron_iteration_flops(B, s, l, h, v, recompute=recompute))


def test_six_n_d_rule_of_thumb():
    # Kaplan et al. 2020: training FLOPs ~ 6 * parameters * tokens (for s << 6h).
    m = model_preset("gpt3-6.7b")
    n = flops.model_parameters(m.layers, m.hidden, m.ffn_hidden, m.vocabulary, m.sequence)
    total = flops.megatron_iteration_flops(1, m.sequence, m.layers, m.hidden, m.vocabulary, recompute=False)
    assert total == pytest.approx(6 * n * m.sequence, rel=0.12)


def test_activation_memory_korthikanti():
    # Korthikanti et al. 2022, eq. 1: s*b*h*(34 + 5as/h), less the two s*b*h dropout masks and the
    # attention dropout's 3as/h that the runtime's block (no dropout) does not keep: s*b*h*(32 + 2as/h);
    # hand case s=2, b=1, h=4, a=2: 8*(32+2) = 272
    assert memory.layer_activation_bytes(2, 1, 4, 2) == 272
    assert memory.layer_activation_bytes(2, 1, 4, 2, flash_attention=True) == 8 * 32
    assert memory.layer_activation_bytes(2, 1, 4, 2, recompute=True) == 16


def test_peak_in_flight():
    assert memory.peak_in_flight("gpipe", 0, 4, 16) == 16
    assert [memory.peak_in_flight("1f1b", s, 4, 16) for s in range(4)] == [4, 3, 2, 1]
    assert memory.peak_in_flight("1f1b", 0, 4, 2) == 2


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    # Rajbhandari et al. 2020 (ZeRO), sec. 3.1: 2 + 2 + 12 bytes.
    assert memory.state_bytes_per_parameter("bf16", "adam") == 16


def test_ring_allreduce_hand_case_and_bandwidth_term():
    # 4 members, 1 GB, 1 GB/s, no latency: 2*3/4 * 1 = 1.5 s
    assert comm.ring_allreduce_time_s(1e9, [0] * 4, [1e9] * 4) == pytest.approx(1.5)
    # the slowest hop and the largest latency govern: + 6 * 0.01
    assert comm.ring_allreduce_time_s(1e9, [0, 0.01, 0, 0], [1e9, 1e9, 0.5e9, 1e9]) == pytest.approx(3.06)
    assert comm.ring_allreduce_time_s(1e9, [0.1], [1.0]) == 0.0


def test_sharded_exchange_matches_ring_bandwidth_term_on_uniform_links():
    # Second derivation: with equal links, the sharded exchange moves 2(k-1)/k n per member, like a ring.
    import numpy as np
    k, n, bw = 4, 1e9, 1e9
    sharded = comm.sharded_exchange_time_s(n, np.zeros((k, k)), np.full((k, k), bw))
    assert sharded == pytest.approx(comm.ring_allreduce_time_s(n, [0] * k, [bw] * k))


def _saved_bytes(output) -> int:
    """Bytes of the distinct storages autograd keeps for ``output``'s backward."""
    import torch

    storages, seen, pending = {}, set(), [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kept = [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
        kept += list(node.saved_tensors) if hasattr(node, "saved_tensors") else []
        for value in kept:
            if torch.is_tensor(value):
                storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        pending += [n for n, _ in node.next_functions]
    return sum(storages.values())


def test_logits_bytes_by_hand():
    assert memory.logits_bytes(2048, 2, 50304) == 4 * 2048 * 2 * 50304  # fp32 (formulas.md)
    assert memory.logits_bytes(2048, 2, 50304, 2) == 2 * 2048 * 2 * 50304


def test_loss_bytes_by_hand():
    """Compiled: the bf16 logits kept and their bf16 gradient; eager: the fp32 log-probabilities
    kept, and two fp32 gradients at once in the backward; whatever the training's precision."""
    logits = 2048 * 2 * 50304
    assert memory.loss_bytes(2048, 2, 50304, 2) == (2 * logits, 2 * logits)
    assert memory.loss_bytes(2048, 2, 50304, 2, compiled=False) == (4 * logits, 8 * logits)
    assert memory.loss_bytes(2048, 2, 50304, 4, compiled=False) == (4 * logits, 8 * logits)


@pytest.mark.runtime
@pytest.mark.slow
def test_the_compiled_loss_keeps_16_bit_logits_and_the_eager_one_fp32():
    """Second derivation of ``memory.logits_bytes``: what the runtime's loss keeps for backward,
    counted: eager, the fp32 log-probabilities (4 B a logit); compiled (``plan launch`` on GPUs),
    the bf16 logits themselves (2 B), as the cost model counts them."""
    torch = pytest.importorskip("torch")
    from planner.runtime.gpt import lm_loss

    b, s, v = 2, 64, 1000
    logits = torch.randn(b, s, v, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, v, (b, s))
    assert _saved_bytes(lm_loss(logits, targets)) == pytest.approx(memory.logits_bytes(s, b, v), rel=0.02)
    assert _saved_bytes(lm_loss(logits, targets)) == pytest.approx(
        memory.loss_bytes(s, b, v, 2, compiled=False)[0], rel=0.02)
    compiled = _saved_bytes(torch.compile(lm_loss)(logits, targets))
    assert compiled == pytest.approx(memory.logits_bytes(s, b, v, dtype_bytes=2), rel=0.02)
