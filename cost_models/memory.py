"""Memory per device: model and optimizer state, activations of micro-batches in flight, extras."""

import functools

import numpy as np

from cost_models.schedule import Schedule, round_sizes, stage_ops

__all__ = [
    "state_bytes_per_parameter",
    "optimizer_state_bytes_per_parameter",
    "weight_bytes_per_parameter",
    "layer_activation_bytes",
    "in_flight_micro_batches",
    "held_messages",
    "peak_in_flight",
    "head_in_flight",
    "logits_bytes",
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
                           recompute: bool = False, tensor: int = 1) -> float:
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
    """
    scale = dtype_bytes / 2.0
    if recompute:
        return 2.0 * s * b * h * scale
    per_token = 8.0 + 24.0 / tensor + (0.0 if flash_attention else 2.0 * a * s / (h * tensor))
    return s * b * h * per_token * scale


def in_flight_micro_batches(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0,
                            virtual_stages: int = 1):
    """Micro-batches whose activations stage ``stage`` (0-based) of ``stages`` holds at its peak.

    GPipe keeps all ``M`` (Huang et al. 2019); 1F1B at most ``min(S - i, M)`` (Narayanan et al. 2021,
    PipeDream-Flush, sec. 2.2); ZB-H1 keeps a micro-batch until its weight gradient, so stage i,
    which holds i of them back, keeps at most ``min(S, M)`` (Qi et al. 2024, sec. 3.1: the peak of
    1F1B's first stage, now on every stage); in accumulation rounds of ``per_round`` micro-batches,
    ``M`` is at most a round's. Vectorised over numpy arrays of stages and micro-batch counts.
    Interleaved 1F1B (1F1B with ``virtual_stages`` v > 1, ``cost_models.schedule.stage_ops``): stage i
    runs ``2 (S - i - 1) + (v - 1) S`` warm-up chunk forwards, so it holds at most one more, each
    chunk 1/v of its layers (chunks taken as even): ``min(2 (S - i - 1) + (v - 1) S + 1, M v) / v``
    micro-batches (all M when M = S, every forward then being warm-up): ``S + (S - 1) / v`` on stage 0,
    ``1 + (S - 1) / (S v)`` times 1F1B's S (Narayanan et al. 2021, sec. 2.2.2).
    """
    if per_round > 0:
        micro_batches = np.minimum(micro_batches, per_round)
    if virtual_stages > 1 and schedule == Schedule.ONE_F_ONE_B:
        v = virtual_stages
        chunk_forwards = np.multiply(micro_batches, v)  # M = S: every forward is warm-up (Megatron-LM's rule)
        warm = np.where(np.equal(micro_batches, stages), chunk_forwards,
                        2 * (stages - stage - 1) + (v - 1) * stages + 1)
        return np.minimum(warm, chunk_forwards) / v
    if schedule == Schedule.GPIPE:
        return micro_batches
    if schedule == Schedule.ONE_F_ONE_B:
        return np.minimum(stages - stage, micro_batches)
    if schedule == Schedule.ZERO_BUBBLE:
        return np.minimum(np.full(np.shape(stage), stages), micro_batches)
    raise ValueError(f"unknown schedule {schedule!r}")


def logits_bytes(s: int, b: int, v: int, dtype_bytes: int = 4) -> float:
    """The logits the loss keeps for backward, and their gradient, on the last stage: ``s*b*V``
    values of ``dtype_bytes`` each. ``4*s*b*V`` (fp32, formulas.md) where the loss casts the logits
    to fp32 before its softmax and keeps the fp32 result; the runtime's compiled loss (``plan
    launch`` compiles on GPUs, ``planner.runtime.gpt.compile_stage``) fuses the cast into the softmax
    kernel, so it keeps the 16-bit logits the head wrote and writes their gradient in 16 bits: the
    training precision's bytes (Megatron-LM's fused cross-entropy keeps its input logits the same
    way). Eager 16-bit training (``--compile off``) keeps fp32 log-probabilities, twice this."""
    return float(dtype_bytes) * s * b * v


def final_norm_bytes(s: int, b: int, h: int, positions: int, dtype_bytes: int = 2) -> float:
    """What the last stage's final norm keeps for backward per micro-batch, besides the logits: its
    input, the last block's whole ``(b, s, h)`` output, and its output at the head's ``positions``
    (all ``s`` for an LM head, the last one for a classification head), which the head's product
    keeps for its weight gradient (``planner.runtime.gpt.StageModule.forward``; Korthikanti et al.
    2022, sec. 4.1, count the block's own norms the same way)."""
    return float(dtype_bytes) * b * h * (s + positions)


def held_messages(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0,
                  virtual_stages: int = 1, chunk_layers: tuple = ()):
    """Pipeline messages that stage ``stage`` (0-based) of ``stages`` has sent and still holds at
    its activation peak: the runtime keeps every tensor it hands to a send until the iteration's
    ``sync`` op waits on them (``planner.runtime.engine.StageExecutor.iteration``'s pending sends),
    so a stage holds the output of every forward it sent downstream (from the forward on, the
    output the micro-batch's backward needs too) and every input gradient it sent upstream, whether
    or not their micro-batches are still in flight. Counted on the stage's op list
    (``cost_models.schedule.stage_ops``, the one the runtime executes) at the last op at which its
    in-flight activations are at their peak (a micro-batch's activations are kept from its forward
    to its backward, under ZB-H1 to its weight gradient): the messages sent by then, walked op by
    op or, for GPipe and 1F1B (interleaved too), in closed form.
    1F1B in one round: the last steady forward of stage i (Narayanan et al. 2021, sec. 2.2) has
    ``M`` forwards and ``M - min(S - i, M)`` backwards behind it, so ``M`` outputs (none on the last
    stage) and ``M - min(S - i, M)`` gradients (none on the first); GPipe: the ``M`` outputs (its
    peak, the last forward, precedes every backward). ``chunk_layers``: as ``peak_in_flight``'s.
    Vectorised over numpy arrays of stages and micro-batch counts."""
    chunks = tuple(int(n) for n in chunk_layers)
    held = np.vectorize(lambda i, m: _peak(str(schedule), int(i), int(stages), int(m), int(per_round),
                                           int(virtual_stages), chunks)[1], otypes=[float])
    return held(stage, micro_batches)


def peak_in_flight(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0,
                   virtual_stages: int = 1, chunk_layers: tuple = ()) -> float:
    """Micro-batches' activations that stage ``stage`` keeps at its peak, from its op list (the walk
    of ``held_messages``): ``in_flight_micro_batches`` where the stage's chunks hold equal layers;
    under interleaved 1F1B with ``chunk_layers`` (each chunk's blocks, chunk 0 first) the peak is
    the op where the in-flight chunks hold the most blocks, counted as ``sum_c n_c f_c / sum_c n_c``
    micro-batches (``f_c`` chunk c's micro-batches in flight), so that times the stage's blocks is
    the blocks' activations kept (the warm-up runs chunk 0 first: with uneven chunks, the larger
    first chunk is in flight more often; Narayanan et al. 2021, sec. 2.2.2)."""
    return _peak(str(schedule), int(stage), int(stages), int(micro_batches), int(per_round), int(virtual_stages),
                 tuple(int(n) for n in chunk_layers))[0]


def head_in_flight(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0,
                   virtual_stages: int = 1, chunk_layers: tuple = ()) -> float:
    """Micro-batches whose last-chunk activations stage ``stage`` keeps at its peak (the walk of
    ``peak_in_flight``): on the last stage, those whose logits and final norm (``logits_bytes``,
    ``final_norm_bytes``) are kept, which under interleaved 1F1B are only its last chunk's (the
    model's last piece, whose forward its backward soon follows), not ``peak_in_flight``'s."""
    if virtual_stages == 1:  # one chunk: all its in-flight micro-batches
        return peak_in_flight(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers)
    return _walk(str(schedule), int(stage), int(stages), int(micro_batches), int(per_round), int(virtual_stages),
                 tuple(int(n) for n in chunk_layers))[2]


def _peak(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int, virtual_stages: int,
          chunk_layers: tuple) -> tuple:
    """``_walk``'s (in-flight, held), in closed form for GPipe, 1F1B and interleaved 1F1B with equal
    chunks (the search asks for them at thousands of micro-batches), walked otherwise."""
    one_f_one_b = schedule == Schedule.ONE_F_ONE_B or (schedule == Schedule.ZERO_BUBBLE and stage == 0)
    if virtual_stages > 1 and schedule == Schedule.ONE_F_ONE_B and len(set(chunk_layers)) <= 1:
        return _interleaved_peak(stage, stages, micro_batches, per_round, virtual_stages)
    if virtual_stages > 1 or not (one_f_one_b or schedule == Schedule.GPIPE):
        return _walk(schedule, stage, stages, micro_batches, per_round, virtual_stages, chunk_layers)[:2]
    sizes = round_sizes(micro_batches, per_round)
    in_flight = [size if schedule == Schedule.GPIPE else min(stages - stage, size) for size in sizes]
    peak = max(in_flight)
    k = len(sizes) - 1 - in_flight[::-1].index(peak)  # the last round that reaches it
    before, size = sum(sizes[:k]), sizes[k]
    # at round k's last forward (GPipe) or last steady forward (1F1B): every forward of the rounds up
    # to k sent downstream, the backwards of the rounds before k (and, 1F1B, round k's size - peak) upstream
    backwards = before if schedule == Schedule.GPIPE else before + size - peak
    held = (before + size) * (stage < stages - 1) + backwards * (stage > 0)
    return float(peak), float(held)


def _interleaved_peak(stage: int, stages: int, micro_batches: int, per_round: int, chunks: int) -> tuple:
    """``_walk``'s (in-flight, held) for interleaved 1F1B with equal chunks, in closed form: each
    round of ``m`` micro-batches runs ``T = m v`` chunk forwards, ``w`` of them warm-up
    (``cost_models.schedule``), so the peak, ``w + 1`` chunks (``T`` when all are warm-up), is
    reached last at the round's last forward, after ``T - w - 1`` backwards (none)."""
    S, v, i = stages, chunks, stage
    sizes = round_sizes(micro_batches, per_round)
    peaks = []
    for m in sizes:
        total = m * v
        warmup = total if m == S else min(2 * (S - i - 1) + (v - 1) * S, total)
        peaks.append((warmup + 1, total - warmup - 1) if total > warmup else (total, 0))
    peak = max(p for p, _ in peaks)
    k = len(sizes) - 1 - [p for p, _ in peaks][::-1].index(peak)
    before, size, backwards = sum(sizes[:k]), sizes[k], peaks[k][1]
    first_chunk = (backwards // (S * v)) * S + max(0, min(backwards % (S * v), v * S) - (v - 1) * S)
    outputs = v * (before + size) - (before + size) * (i == S - 1)  # the last stage's last chunk sends none
    gradients = v * before - before * (i == 0) + backwards - first_chunk * (i == 0)  # nor the first's first
    return float(peak / v), float(outputs + gradients)


@functools.lru_cache(maxsize=4096)
def _walk(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int, virtual_stages: int,
          chunk_layers: tuple) -> tuple:
    """(in-flight micro-batches, messages held, last chunk's in-flight micro-batches) at the last op
    where the stage's in-flight activations, weighted by ``chunk_layers`` (equal without), peak."""
    weights = chunk_layers or (1,) * virtual_stages
    frees = "bwd_weight" if schedule == Schedule.ZERO_BUBBLE and stage > 0 else "bwd"
    in_flight, peak, sent, at_peak = [0] * virtual_stages, -1, 0, (0.0, 0, 0)
    for kind, _, chunk in stage_ops(Schedule(schedule), stage, stages, micro_batches, per_round, virtual_stages):
        if kind == "fwd":
            in_flight[chunk] += 1
        elif kind == frees:
            in_flight[chunk] -= 1
        elif kind in ("send_fwd", "send_bwd"):
            sent += 1
        kept = sum(n * f for n, f in zip(weights, in_flight))
        if kept >= peak:
            peak, at_peak = kept, (kept / sum(weights), sent, in_flight[-1])
    return float(at_peak[0]), float(at_peak[1]), float(at_peak[2])
