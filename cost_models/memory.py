"""Memory per device: model and optimizer state, activations of micro-batches in flight, extras."""

import numpy as np

from cost_models.schedule import Schedule

__all__ = [
    "state_bytes_per_parameter",
    "optimizer_state_bytes_per_parameter",
    "weight_bytes_per_parameter",
    "layer_activation_bytes",
    "in_flight_micro_batches",
    "logits_bytes",
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

    16-bit, no tensor parallelism: ``s*b*h*(34 + 5*a*s/h)`` bytes (Korthikanti et al. 2022, sec. 4.1,
    eq. 1); with tensor parallelism of degree t (no sequence parallelism) ``s*b*h*(10 + 24/t +
    5*a*s/(h*t))`` (ibid., Table 2): the layer norms' and dropouts' inputs and the block input stay
    whole on every member. Flash attention drops the score term; full recomputation keeps only the
    block input, ``2*s*b*h``, whole on every member. Scaled by ``dtype_bytes / 2`` for other precisions.
    """
    scale = dtype_bytes / 2.0
    if recompute:
        return 2.0 * s * b * h * scale
    per_token = 10.0 + 24.0 / tensor + (0.0 if flash_attention else 5.0 * a * s / (h * tensor))
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
