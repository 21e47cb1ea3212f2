"""Memory per device: model and optimizer state, activations of micro-batches in flight, extras."""

import functools

import numpy as np

from cost_models.schedule import Schedule, interleaved_warmup, one_f_one_b_warmup, round_sizes, stage_ops

__all__ = [
    "state_bytes_per_parameter",
    "optimizer_state_bytes_per_parameter",
    "weight_bytes_per_parameter",
    "layer_activation_bytes",
    "held_messages",
    "peak_in_flight",
    "head_in_flight",
    "stage_peak",
    "one_f_one_b_held",
    "logits_bytes",
    "loss_bytes",
    "final_norm_bytes",
]


def state_bytes_per_parameter(precision: str, optimizer: str) -> float:
    """Bytes of weights + gradients + optimizer state per parameter.

    Mixed-precision Adam: 2 (fp16/bf16 weights) + 2 (grads) + 12 (fp32 master, momentum, variance)
    = 16 B (Rajbhandari et al. 2020, ZeRO, sec. 3.1). fp32 Adam: 4 + 4 + 8 = 16 B. SGD with
    momentum: mixed 2 + 2 + 4 + 4 = 12 B, fp32 4 + 4 + 4 = 12 B.
    """
    if optimizer == "adam":
        return 16.0
    if optimizer == "sgd":
        return 12.0
    raise ValueError(f"unknown optimizer {optimizer!r}")


def optimizer_state_bytes_per_parameter(precision: str, optimizer: str) -> float:
    """The part of ``state_bytes_per_parameter`` that ZeRO stage 1 shards over ``N_d`` data-parallel
    ranks (Rajbhandari et al. 2020, sec. 5.1: ``(2 + 2 + K / N_d) * Psi`` with ``K = 12`` for
    mixed-precision Adam): everything but the working weights and gradients (2 + 2 B in 16-bit,
    4 + 4 B in fp32). Adam: 12 B mixed, 8 B fp32; SGD with momentum: 8 B mixed, 4 B fp32."""
    working = 2.0 * weight_bytes_per_parameter(precision)  # the weights and their gradients
    return state_bytes_per_parameter(precision, optimizer) - working


def weight_bytes_per_parameter(precision: str) -> float:
    """Bytes of the working weight per parameter: 2 in 16-bit training, 4 in fp32 (the weights part
    of ZeRO's ``2 + 2 + K`` per parameter, Rajbhandari et al. 2020, sec. 3.1)."""
    return 4.0 if precision == "fp32" else 2.0


def layer_activation_bytes(s: int, b: int, h: int, a: int, *, dtype_bytes: int = 2, flash_attention: bool = False,
                           recompute: bool | str = False, tensor: int = 1) -> float:
    """Activations one block keeps for backward, per micro-batch, on each member of a tensor group
    of ``tensor`` devices.

    Korthikanti et al. 2022 (sec. 4.1, eq. 1; Table 2 with tensor parallelism of degree t, no
    sequence parallelism) count ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes in 16 bits, of which two
    ``s*b*h`` one-byte dropout masks (after the attention's projection and after the MLP) and, in
    the score term, the attention dropout's mask ``a*s^2*b`` and output ``2*a*s^2*b``. The runtime's
    block (``planner.runtime.gpt.Block``) has no dropout, so it keeps ``s*b*h*(8 + 24/t +
    2*a*s/(h*t))``: whole on every member, the block input and the attention's residual sum (the
    norms' inputs; the compiled block keeps the projection's all-reduced output and adds the
    residual again in backward, the same bytes) and both norms' outputs, ``2*s*b*h`` each; divided,
    q, k and v (6), the attention output (2), the MLP's up projection and its GELU (8 + 8), and
    the softmax output ``2*a*s^2*b``, which flash attention does not keep. Full recomputation keeps
    only the block input, ``2*s*b*h``, whole on every member (sec. 4). Scaled by ``dtype_bytes / 2``
    for other precisions. (The compiled block's saved tensors, listed by ``torch.compile``'s
    partitioner, are these.)
    Selective recomputation (``recompute="selective"``, sec. 5) recomputes the attention core in
    backward and keeps what flash attention keeps: the softmax term goes."""
    scale = dtype_bytes / 2.0
    selective = recompute == "selective"
    if recompute and not selective:
        return 2.0 * s * b * h * scale
    scores = not (flash_attention or selective)
    per_token = 8.0 + 24.0 / tensor + (2.0 * a * s / (h * tensor) if scores else 0.0)
    return s * b * h * per_token * scale


def logits_bytes(s: int, b: int, v: int, dtype_bytes: int = 4) -> float:
    """The logits the loss keeps for backward, and their gradient, on the last stage: ``s*b*V``
    values of ``dtype_bytes`` each. ``4*s*b*V`` (fp32, formulas.md) where the loss casts the logits
    to fp32 before its softmax and keeps the fp32 result; the runtime's compiled loss (``plan
    launch`` compiles on GPUs, ``planner.runtime.gpt.compile_stage``) fuses the cast into the softmax
    kernel, so it keeps the 16-bit logits the head wrote and writes their gradient in 16 bits: the
    training precision's bytes (Megatron-LM's fused cross-entropy keeps its input logits the same
    way). Eager training (``--compile off``) keeps more: ``loss_bytes``."""
    return float(dtype_bytes) * s * b * v


EAGER_LOSS_KEPT_BYTES_PER_LOGIT = 4  # per logit: the fp32 log-probabilities log_softmax keeps for its backward
# per logit: the fp32 gradients of the log-probabilities and of the logits, at once
EAGER_LOSS_BACKWARD_BYTES_PER_LOGIT = 8


def loss_bytes(s: int, b: int, v: int, dtype_bytes: int, *, compiled: bool = True) -> tuple:
    """(kept, transient) bytes of the loss on the last stage per micro-batch of ``b`` sequences of
    ``s`` positions over ``v`` outputs. Compiled (``plan launch`` on GPUs): the fused loss keeps the
    logits the head wrote and writes their gradient, ``dtype_bytes`` each (``logits_bytes``). Eager
    (``plan launch --compile off``, and every CPU run): ``planner.runtime.gpt.lm_loss`` casts the
    logits to fp32 and ``F.cross_entropy`` runs ``log_softmax``, whose backward reads its own fp32
    output (PyTorch ``tools/autograd/derivatives.yaml``: ``_log_softmax_backward_data(grad, result,
    ...)``), so ``4`` bytes per logit stay until the backward, which holds the fp32 gradient it
    receives and the fp32 gradient it returns at once: ``8`` more. Measured on 2x H100 (eager
    runs of ``benchmarks/results/accuracy_gpu/``): the last stage's peak allocation lies 8.1-8.3
    bytes per logit above the compiled loss's ``2 + 2`` under bf16 1F1B, as ``4 + 8`` predicts; 6.95
    with full recomputation, whose recomputed block's working set and this backward's do not peak
    together, though the stage model adds them (those runs predicted 1.3-2.0% high)."""
    if compiled:
        return logits_bytes(s, b, v, dtype_bytes), logits_bytes(s, b, v, dtype_bytes)
    return (logits_bytes(s, b, v, EAGER_LOSS_KEPT_BYTES_PER_LOGIT),
            logits_bytes(s, b, v, EAGER_LOSS_BACKWARD_BYTES_PER_LOGIT))


def final_norm_bytes(s: int, b: int, h: int, positions: int, dtype_bytes: int = 2) -> float:
    """What the last stage's final norm keeps for backward per micro-batch, besides the logits: its
    input, the last block's whole ``(b, s, h)`` output, and its output at the head's ``positions``
    (all ``s`` for an LM head, the last one for a classification head), which the head's product
    keeps for its weight gradient (``planner.runtime.gpt.StageModule.forward``; Korthikanti et al.
    2022, sec. 4.1, count the block's own norms the same way)."""
    return float(dtype_bytes) * b * h * (s + positions)


def peak_in_flight(schedule: str, stage, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
                   chunk_layers: tuple = (), warmup_depth: int = 1):
    """Micro-batches' activations that stage ``stage`` (0-based) of ``stages`` keeps at its peak, the
    most of any accumulation round (``cost_models.schedule.round_sizes``): a micro-batch's are kept
    from its forward to its backward, under ZB-H1 to its weight gradient.

    GPipe keeps a round's ``m`` (Huang et al. 2019); 1F1B ``min(S - i, m)`` (Narayanan et al. 2021,
    PipeDream-Flush, sec. 2.2), with warm-up depth k ``min(k (S - i - 1) + 1, m)`` (its ``w`` warm-up
    forwards and the steady step's, ``cost_models.schedule.one_f_one_b_warmup``); ZB-H1 ``min(S, m)``
    on every stage (Qi et al. 2024, sec. 3.1: the
    peak of 1F1B's first stage; stage i defers i weight gradients); interleaved 1F1B (``virtual_stages``
    v > 1) ``w + 1`` chunk forwards of a round of ``m v`` with ``w`` warm-up ones
    (``cost_models.schedule.interleaved_warmup``; all ``m v`` when every forward is warm-up), each
    chunk 1/v of the stage's layers: ``S + (S - 1) / v`` micro-batches on stage 0, ``1 + (S - 1) /
    (S v)`` times 1F1B's S (Narayanan et al. 2021, sec. 2.2.2). With ``chunk_layers`` (each chunk's
    blocks, chunk 0 first) of unequal sizes the op list is walked and the peak is where the in-flight
    chunks hold the most blocks, counted as ``sum_c n_c f_c / sum_c n_c`` micro-batches (the warm-up
    runs chunk 0 first: the larger first chunk is in flight more often). Vectorised over numpy
    arrays of stages and micro-batch counts."""
    return _peak(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers, warmup_depth)[0]


def held_messages(schedule: str, stage, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
                  chunk_layers: tuple = (), warmup_depth: int = 1) -> tuple:
    """(outputs, gradients): the pipeline messages stage ``stage`` has sent and still holds at its
    peak. The runtime keeps every tensor it hands to a send until the iteration's ``sync`` op waits
    on them (``planner.runtime.engine.StageExecutor.iteration``'s pending sends), so a stage holds
    the output of every forward it sent downstream and every input gradient it sent upstream.

    Counted on the stage's op list (``cost_models.schedule.stage_ops``, the one the runtime runs) at
    the last op of the last accumulation round where that round's in-flight activations peak: by
    then every earlier round sent all its messages, and later ops of the round free a micro-batch's
    (or a chunk's) activations for each message they send, at least its bytes (a block keeps at
    least its input, the message's size; ``layer_activation_bytes``). With ``peak_in_flight`` (the
    most of any round) this bounds activations plus held messages over every op from above, exactly
    where the rounds are equal (or one). In one round of ``m``: 1F1B's last steady forward
    (Narayanan et al. 2021, sec. 2.2) follows ``m`` forwards and ``m - min(S - i, m)`` backwards;
    GPipe's last forward precedes every backward; ZB-H1's stage i > 0 holds its peak ``min(S, m)``
    until the input gradient of its last steady step, ``k = m - min(S - i - 1, m)`` of them (``k +
    1``, at most ``m``, where the peak is reached only when the drain begins, ``k <= i``); interleaved
    1F1B's last steady forward follows all ``m v`` chunk forwards and ``m v - w - 1`` chunk backwards.
    The last piece sends no output, the first no gradient. Vectorised like ``peak_in_flight``."""
    return _peak(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers, warmup_depth)[1:3]


def stage_peak(schedule: str, stage, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
               chunk_layers: tuple = (), warmup_depth: int = 1) -> tuple:
    """(``peak_in_flight``, *``held_messages``) in one pass: in-flight micro-batches, outputs and
    gradients held, for the search's tables."""
    return _peak(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers, warmup_depth)


def head_in_flight(schedule: str, stage, stages: int, micro_batches, per_round: int = 0,
                   virtual_stages: int = 1, chunk_layers: tuple = (), warmup_depth: int = 1):
    """Micro-batches whose last-chunk activations stage ``stage`` keeps at the op of
    ``held_messages``: on the last stage, those whose logits and final norm (``logits_bytes``,
    ``final_norm_bytes``) are kept, which under interleaved 1F1B are only its last chunk's (the
    model's last piece, whose forward its backward soon follows), not ``peak_in_flight``'s."""
    if virtual_stages == 1:  # one chunk: all its in-flight micro-batches
        return peak_in_flight(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers,
                              warmup_depth)
    walk = np.vectorize(lambda i, m: _walk(str(schedule), int(i), int(stages), int(m), int(per_round),
                                           int(virtual_stages), tuple(int(n) for n in chunk_layers))[3],
                        otypes=[float])
    return walk(stage, micro_batches)


def one_f_one_b_held(stage, stages: int, micro_batches, in_flight) -> tuple:
    """(outputs, gradients) that 1F1B's stage ``stage`` holds at its last steady forward in a round
    of ``micro_batches`` with ``in_flight`` of them in flight (``min(S - i, m)``; Narayanan et al.
    2021, sec. 2.2): every forward's output but on the last stage, and ``m - f`` gradients but on the
    first. Plain arithmetic, so numpy arrays and CP-SAT's linear expressions both go through."""
    return micro_batches * (stage < stages - 1), (micro_batches - in_flight) * (stage > 0)


def _peak(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers, warmup_depth=1) -> tuple:
    """(in flight, outputs held, gradients held): in closed form (``_rounds_peak``) unless the chunks
    hold unequal layers, which are walked."""
    chunks = tuple(int(n) for n in chunk_layers)
    if virtual_stages > 1 and len(set(chunks)) > 1:
        walk = np.vectorize(lambda i, m: _walk(str(schedule), int(i), int(stages), int(m), int(per_round),
                                               int(virtual_stages), chunks)[:3], otypes=[float, float, float])
        return walk(stage, micro_batches)
    return _rounds_peak(str(schedule), stage, int(stages), micro_batches, int(per_round), int(virtual_stages),
                        int(warmup_depth))


def _rounds_peak(schedule: str, stage, stages: int, micro_batches, per_round: int, chunks: int,
                 depth: int = 1) -> tuple:
    """``_walk``'s (in flight, outputs, gradients) in closed form: the rounds are ``full`` of
    ``per_round`` and a ``rest`` (``round_sizes``); the in-flight peak is the larger of the two kinds'
    (``_round_peak``), and the messages are all of the rounds before the last (each micro-batch's
    ``v`` chunks send one output and one gradient each, but the last piece's output and the first
    piece's gradient) and the last round's up to its peak."""
    i = np.asarray(stage, dtype=np.int64)
    M = np.asarray(micro_batches, dtype=np.int64)
    shape = np.broadcast_shapes(i.shape, M.shape)  # GPipe's in-flight count, say, does not depend on the stage
    if per_round <= 0:  # one round
        return tuple(np.broadcast_to(n, shape).astype(float)
                     for n in _round_peak(schedule, i, stages, M, chunks, depth))
    size = np.where((per_round > 0) & (per_round < M), per_round, M)
    rest = M % size
    last = np.where(rest > 0, rest, size)
    f_full = _round_peak(schedule, i, stages, size, chunks, depth)[0]
    f_rest = np.where(rest > 0, _round_peak(schedule, i, stages, np.maximum(rest, 1), chunks, depth)[0], 0.0)
    _, outputs, gradients = _round_peak(schedule, i, stages, last, chunks, depth)
    before = M - last
    outputs = before * (chunks - (i == stages - 1)) + outputs
    gradients = before * (chunks - (i == 0)) + gradients
    return tuple(np.broadcast_to(n, shape).astype(float) for n in (np.maximum(f_full, f_rest), outputs, gradients))


def _round_peak(schedule: str, i, S: int, m, v: int, depth: int = 1) -> tuple:
    """(in flight, outputs sent, gradients sent) at the last op of one round of ``m`` micro-batches
    where its in-flight activations peak (``held_messages`` gives each schedule's count)."""
    sends_down = i < S - 1
    if v > 1:  # interleaved 1F1B
        total = m * v
        w = interleaved_warmup(i, S, m, v)
        steady = total > w
        peak = np.where(steady, w + 1, total)
        back = np.where(steady, total - w - 1, 0)
        first_chunk = (back // (S * v)) * S + np.maximum(0, back % (S * v) - (v - 1) * S)  # chunk 0's backwards
        return peak / v, total - m * (i == S - 1), back - first_chunk * (i == 0)
    if schedule == Schedule.GPIPE:
        return m, m * sends_down, 0 * m
    if schedule == Schedule.ONE_F_ONE_B:
        f = np.minimum(one_f_one_b_warmup(i, S, m, depth) + 1, m)
        return (f, *one_f_one_b_held(i, S, m, f))
    if schedule == Schedule.ZERO_BUBBLE:
        w, held = one_f_one_b_warmup(i, S, m, depth), depth * i  # warm-up forwards, weight gradients held back
        k = m - w  # steady steps: forward, input gradient, a weight gradient after the first ``held``
        later = np.where(k >= held + 1, k, np.minimum(k + 1, m))
        # the warm-up, the step's forward and the held weight gradients: depth (S - 1) + 1 (S at depth 1)
        return np.minimum(w + held + 1, m), m * sends_down, np.where(i == 0, 0 * m, later)
    raise ValueError(f"unknown schedule {schedule!r}")


@functools.lru_cache(maxsize=4096)
def _walk(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int, virtual_stages: int,
          chunk_layers: tuple, warmup_depth: int = 1) -> tuple:
    """(in-flight micro-batches, outputs held, gradients held, last chunk's in-flight micro-batches)
    on the op list: the in-flight peak of any op, weighted by ``chunk_layers`` (equal without), and
    the rest at the first op of the last round where the kept blocks plus the messages sent are the
    most. A block keeps at least a message's bytes (``held_messages``), so for any op x of that
    round, with ``a >= r`` the bytes of a block and of a message, ``a kept_x + r sent_x <= r (kept +
    sent) + (a - r) peak <= a peak + r sent`` (an earlier round's op sent fewer): the in-flight peak
    plus that op's messages bound every op, also where unequal chunks under recomputation (a block
    keeps one message's bytes) make an op after the in-flight peak the heaviest. With equal chunks
    that op is the last round's in-flight peak (the closed forms)."""
    weights = chunk_layers or (1,) * virtual_stages
    frees = "bwd_weight" if schedule == Schedule.ZERO_BUBBLE and stage > 0 else "bwd"
    last_round = micro_batches - round_sizes(micro_batches, per_round)[-1]  # its first micro-batch
    in_flight, peak, most = [0] * virtual_stages, -1, -1
    outputs = gradients = 0
    at_most = (0, 0, 0)
    for kind, mb, chunk in stage_ops(Schedule(schedule), stage, stages, micro_batches, per_round, virtual_stages,
                                     warmup_depth):
        if kind == "fwd":
            in_flight[chunk] += 1
        elif kind == frees:
            in_flight[chunk] -= 1
        outputs += kind == "send_fwd"
        gradients += kind == "send_bwd"
        kept = sum(n * f for n, f in zip(weights, in_flight))
        peak = max(peak, kept)
        if mb >= last_round and kept + outputs + gradients > most:
            most, at_most = kept + outputs + gradients, (outputs, gradients, in_flight[-1])
    return float(peak / sum(weights)), float(at_most[0]), float(at_most[1]), float(at_most[2])
