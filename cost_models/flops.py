"""Parameter and FLOP counts of a GPT-style decoder.

Symbols: b micro-batch (sequences), s sequence length, h hidden, f MLP hidden (4h for GPT), V
vocabulary, l layers. One multiply-add = 2 FLOPs.
"""

__all__ = [
    "VOCABULARY_MULTIPLE",
    "padded_vocabulary",
    "layer_parameters",
    "tensor_split_parameters",
    "embedding_parameters",
    "head_parameters",
    "model_parameters",
    "layer_forward_flops",
    "head_forward_flops",
    "layer_weight_gradient_flops",
    "zero_bubble_trip_share",
    "training_flops_multiplier",
    "attention_core_forward_flops",
    "recomputed_layer_flops",
    "megatron_iteration_flops",
]


VOCABULARY_MULTIPLE = 128  # Megatron-LM's --make-vocab-size-divisible-by default


def padded_vocabulary(v: int) -> int:
    """Rows of the embedding and the LM head as trained: ``V`` rounded up to a multiple of 128
    (Megatron-LM, ``_vocab_size_with_padding``). An odd row count (GPT-2's 50,257) leaves the
    logits' leading dimension unaligned and the head's matrix products far slower on tensor cores;
    the padded rows are never looked up and their logits are dropped before the loss."""
    return -(-v // VOCABULARY_MULTIPLE) * VOCABULARY_MULTIPLE


def layer_parameters(h: int, f: int, *, gated_mlp: bool = False, biases: bool = True) -> int:
    """Parameters of one transformer block.

    GPT (f = 4h, biases, LayerNorm): ``12h^2 + 13h`` = QKV ``3h^2+3h`` + output projection
    ``h^2+h`` + MLP ``8h^2+5h`` + two LayerNorms ``4h`` (Narayanan et al. SC'21, sec. 5.1;
    Kaplan et al. 2020, Table 1). LLaMA's SwiGLU MLP has three ``h x f`` matrices, RMSNorm
    only a scale, and no biases (Touvron et al. 2023, sec. 2.2).
    """
    mlp_matrices = 3 if gated_mlp else 2
    weights = 4 * h * h + mlp_matrices * h * f
    if biases:
        return weights + 3 * h + h + f + h + 4 * h  # qkv, proj, fc1, fc2, two LayerNorms (scale+shift)
    return weights + 2 * h  # two RMSNorm scales


def tensor_split_parameters(h: int, f: int, *, gated_mlp: bool = False, biases: bool = True) -> int:
    """The part of ``layer_parameters`` that tensor parallelism divides among the ``t`` members of a
    group (Shoeybi et al. 2019, sec. 3, Megatron-LM): every weight matrix (QKV and fc1, and the gate,
    split by columns; the output projection and fc2 by rows) and the biases of the column-parallel
    layers (``3h + f``). The row-parallel layers' biases and the norms stay whole on every member.
    """
    mlp_matrices = 3 if gated_mlp else 2
    weights = 4 * h * h + mlp_matrices * h * f
    return weights + (3 * h + f if biases else 0)


def embedding_parameters(v: int, h: int, s: int, *, learned_positions: bool = True) -> int:
    """Token embedding ``V*h`` plus learned positions ``s*h`` (GPT-2/3; none with RoPE)."""
    return v * h + (s * h if learned_positions else 0)


def head_parameters(v: int, h: int, *, tied: bool = True, biases: bool = True) -> int:
    """Final norm (``2h`` LayerNorm, ``h`` RMSNorm) plus the LM head ``V*h`` unless tied to the embedding."""
    return (2 * h if biases else h) + (0 if tied else v * h)


def model_parameters(l: int, h: int, f: int, v: int, s: int, *, gated_mlp: bool = False, biases: bool = True,
                     tied: bool = True, learned_positions: bool = True) -> int:
    """Whole model: ``l`` blocks + embeddings + head. GPT-3 XL gives 1.316e9 (paper: 1.3B)."""
    return (l * layer_parameters(h, f, gated_mlp=gated_mlp, biases=biases)
            + embedding_parameters(v, h, s, learned_positions=learned_positions)
            + head_parameters(v, h, tied=tied, biases=biases))


def layer_forward_flops(b: int, s: int, h: int, f: int, *, gated_mlp: bool = False) -> float:
    """Forward FLOPs of one block for a micro-batch.

    Matrix products ``2*b*s*(4h^2 + m*h*f)`` (m = 2 MLP matrices, 3 for SwiGLU) plus attention
    scores and their product with values ``4*b*s^2*h``. For GPT (f = 4h) this is Narayanan et al.
    SC'21, Appendix: ``24*b*s*h^2 + 4*b*s^2*h``.
    """
    mlp_matrices = 3 if gated_mlp else 2
    return 2.0 * b * s * (4 * h * h + mlp_matrices * h * f) + 4.0 * b * s * s * h


def layer_weight_gradient_flops(b: int, s: int, h: int, f: int, *, gated_mlp: bool = False) -> float:
    """The weight gradients' part of one block's backward for a micro-batch: ``2*b*s*(4h^2 + m*h*f)``.

    The backward of ``Y = X W`` is two products of the forward's size, ``dX = dY W^T`` and
    ``dW = X^T dY`` (Narayanan et al. SC'21, Appendix: backward = 2x forward); the second is the
    weight gradient that a zero-bubble schedule runs apart (Qi et al. 2024, sec. 2). Attention's
    scores and values have no weights: their backward is all input gradient.
    """
    mlp_matrices = 3 if gated_mlp else 2
    return 2.0 * b * s * (4 * h * h + mlp_matrices * h * f)


def zero_bubble_trip_share(least_block_slowdown: float) -> float:
    """The least share of a round trip's forward and backward seconds, priced at the devices' least
    block slowdown ``k`` (``Device.block_slowdown`` under ZB-H1), that ZB-H1 leaves in the trip (Qi
    et al. 2024, sec. 3.1: the weight gradients W run apart, the forward F and the input gradients
    stay): ``min(2/3, 1/2 + 1/(6 k))``.

    W is at most the forward's FLOPs (``layer_weight_gradient_flops``; the head's dW is one product
    of its forward's size) and the backward at least twice them (``training_flops_multiplier``). The
    simulator runs a block's forward at its FLOPs and charges the slowdown's extra ``(k - 1)`` times
    the block's FLOPs to its backward, which the input and weight passes split by FLOPs
    (``cost_models.simulator.op_compute_s``). Per block of forward F on a device of slowdown
    ``k' >= k``: without recomputation the trip keeps ``F + (3 k' F - F) / 2 >= (1/2 + 1/(6 k)) 3 k F``,
    with it ``F + 2 (4 k' F - F) / 3 >= (2/3 + 1/(12 k)) 4 k F``; the head keeps 2/3 of its own.
    Both are at least ``min(2/3, 1/2 + 1/(6 k))`` (2/3 at ``k <= 1``)."""
    return min(2.0 / 3.0, 0.5 + 1.0 / (6.0 * least_block_slowdown))


def head_forward_flops(b: int, s: int, h: int, v: int) -> float:
    """Forward FLOPs of the LM head (logits): ``2*b*s*h*V`` (Narayanan et al. SC'21, Appendix). A
    classification head of ``N`` classes on the last position is the same product with ``s = 1``
    and ``V = N``."""
    return 2.0 * b * s * h * v


def training_flops_multiplier(recompute: bool) -> float:
    """Forward + backward as a multiple of forward: backward is 2x forward, full recomputation adds
    1x (Chen et al. 2016; Korthikanti et al. 2022, sec. 4: 4/3 of a plain block's FLOPs). Where a
    calibration measured the recomputed block, its time comes from that instead
    (``planner.inputs.topology.Device.block_slowdown``). Selective recomputation's multiple depends
    on the shape: ``recomputed_layer_flops``."""
    return 4.0 if recompute else 3.0


def attention_core_forward_flops(b: int, s: int, h: int) -> float:
    """Forward FLOPs of a block's attention core, the scores ``Q K^T`` and their product with the
    values, ``2 * 2*b*s^2*h`` (the ``4*b*s^2*h`` term of ``layer_forward_flops``): what selective
    recomputation runs again in backward (Korthikanti et al. 2022, sec. 5; the softmax's
    element-wise work is not counted, as in ``layer_forward_flops``)."""
    return 4.0 * b * s * s * h


def recomputed_layer_flops(forward_flops: float, core_forward_flops: float, recompute) -> float:
    """A block's forward + backward FLOPs under ``recompute`` (False, True or "selective"): 3 forwards,
    4 with full recomputation (``training_flops_multiplier``), 3 forwards and the attention core's
    forward again with selective recomputation (``attention_core_forward_flops``)."""
    if recompute == "selective":
        return 3.0 * forward_flops + core_forward_flops
    return forward_flops * training_flops_multiplier(bool(recompute))


def megatron_iteration_flops(batch: int, s: int, l: int, h: int, v: int, *, recompute: bool) -> float:
    """Whole-iteration FLOPs of a GPT model (f = 4h), Narayanan et al. SC'21, eq. (3) and Appendix.

    ``72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h))`` without recomputation,
    ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))`` with it. The head term counts forward and backward
    (3x) in both: Megatron recomputes blocks, not the head.
    """
    if recompute:
        return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return 72.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
