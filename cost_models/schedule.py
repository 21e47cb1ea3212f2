"""Per-stage op lists of the pipeline schedules: the one source that both the simulator and the
runtime execute, so that predicted and measured timelines can be compared op by op.

An op is ``(kind, microbatch)``. Kinds: ``recv_fwd``/``fwd``/``send_fwd`` move activations from
stage s to s+1, ``recv_bwd``/``bwd``/``send_bwd`` move gradients from s+1 to s, ``sync`` is the
stage's gradient all-reduce over its replicas and ``step`` the optimizer update (microbatch -1).
The zero-bubble schedule splits a backward into ``bwd_input`` (the gradient of the stage's input,
which the stage upstream waits for) and ``bwd_weight`` (the weights' gradients, which nobody waits
for until the sync), so that weight gradients fill what would be bubble.
"""

from enum import StrEnum
from typing import NamedTuple

__all__ = ["Schedule", "Op", "stage_ops", "round_sizes", "OP_KINDS", "COMPUTE_KINDS", "AUTO_SCHEDULES"]


class Schedule(StrEnum):
    """The pipeline schedules (their values are what plan files and topology files write)."""

    ONE_F_ONE_B = "1f1b"  # PipeDream-Flush (Narayanan et al. 2021)
    GPIPE = "gpipe"  # Huang et al. 2019
    ZERO_BUBBLE = "zb-h1"  # ZB-H1, Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1


# What ``schedule: auto`` searches. ZB-H1 is asked for by name: it keeps up to S micro-batches'
# activations on every stage, and a third schedule splits the search's budget three ways (with it,
# tests/test_tensor_parallel.py's 8 x T4 + A100 cluster got 19.9 s instead of 15.7 s in 8 s).
AUTO_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)


OP_KINDS = ("recv_fwd", "fwd", "send_fwd", "recv_bwd", "bwd", "bwd_input", "send_bwd", "bwd_weight", "sync",
            "step")
COMPUTE_KINDS = ("fwd", "bwd", "bwd_input", "bwd_weight")


class Op(NamedTuple):
    kind: str
    microbatch: int


def _forward(stage: int, stages: int, mb: int) -> list:
    ops = [] if stage == 0 else [Op("recv_fwd", mb)]
    ops.append(Op("fwd", mb))
    if stage < stages - 1:
        ops.append(Op("send_fwd", mb))
    return ops


def _backward(stage: int, stages: int, mb: int, kind: str = "bwd") -> list:
    ops = [] if stage == stages - 1 else [Op("recv_bwd", mb)]
    ops.append(Op(kind, mb))
    if stage > 0:
        ops.append(Op("send_bwd", mb))
    return ops


def round_sizes(micro_batches: int, per_round: int = 0) -> list:
    """Micro-batches of each accumulation round: ``per_round`` each and the rest in the last (one
    round of all when ``per_round`` is 0 or at least ``micro_batches``)."""
    if per_round <= 0 or per_round >= micro_batches:
        return [micro_batches]
    full, rest = divmod(micro_batches, per_round)
    return [per_round] * full + ([rest] if rest else [])


def stage_ops(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0) -> list:
    """The ordered ops of one device holding ``stage`` (0-based) of ``stages``, for ``micro_batches``.

    GPipe: all forwards, then all backwards, both in micro-batch order (Huang et al. 2019).
    1F1B (PipeDream-Flush, Narayanan et al. 2021, sec. 2.2): ``min(S - s - 1, M)`` warm-up
    forwards, then alternate one forward and one backward, then drain the remaining backwards.
    ZB-H1 (Qi et al. 2024, sec. 3.1, handcrafted schedule H1): as 1F1B, but stage ``s`` splits its
    backwards into input and weight gradients and runs its first ``s`` weight gradients late (each
    steady-state step is forward, input gradient, one weight gradient; the ``s`` left over end the
    round), so the drain's chain of backwards from the last stage to the first carries input
    gradients only: the bubble drops from ``(S - 1)(F + B + W)`` to ``(S - 1)(F + B - W)``, and a
    stage keeps at most ``S`` micro-batches' activations (1F1B's peak, on stage 0). The first stage
    has nobody upstream: its backwards stay whole.
    With ``per_round`` > 0 the micro-batches run in accumulation rounds of that many (DTFM's runs
    accumulate in rounds of 64), each round its own pipeline fill and drain; gradients accumulate
    over the rounds and one sync and step end the iteration.
    """
    if not 0 <= stage < stages or micro_batches < 1:
        raise ValueError(f"bad stage {stage} of {stages} or micro_batches {micro_batches}")
    ops, first = [], 0
    for size in round_sizes(micro_batches, per_round):
        ops += [Op(kind, first + mb) for kind, mb in _one_round(schedule, stage, stages, size)]
        first += size
    return ops + [Op("sync", -1), Op("step", -1)]


def _one_round(schedule: str, stage: int, stages: int, micro_batches: int) -> list:
    ops = []
    if schedule == Schedule.GPIPE:
        for mb in range(micro_batches):
            ops += _forward(stage, stages, mb)
        for mb in range(micro_batches):
            ops += _backward(stage, stages, mb)
    elif schedule == Schedule.ONE_F_ONE_B:
        warmup = min(stages - stage - 1, micro_batches)
        for mb in range(warmup):
            ops += _forward(stage, stages, mb)
        for i in range(micro_batches - warmup):
            ops += _forward(stage, stages, warmup + i)
            ops += _backward(stage, stages, i)
        for mb in range(micro_batches - warmup, micro_batches):
            ops += _backward(stage, stages, mb)
    elif schedule == Schedule.ZERO_BUBBLE:
        ops = _zero_bubble_round(stage, stages, micro_batches)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return ops


def _zero_bubble_round(stage: int, stages: int, micro_batches: int) -> list:
    if stage == 0:
        return _one_round(Schedule.ONE_F_ONE_B, stage, stages, micro_batches)
    ops, forwards, backwards, weights = [], 0, 0, 0
    warmup = min(stages - stage - 1, micro_batches)
    for _ in range(warmup):
        ops += _forward(stage, stages, forwards)
        forwards += 1
    deferred = stage  # weight gradients held back to fill the drain
    while forwards < micro_batches:
        ops += _forward(stage, stages, forwards)
        forwards += 1
        ops += _backward(stage, stages, backwards, "bwd_input")
        backwards += 1
        if backwards > deferred:
            ops.append(Op("bwd_weight", weights))
            weights += 1
    while backwards < micro_batches:
        ops += _backward(stage, stages, backwards, "bwd_input")
        backwards += 1
        ops.append(Op("bwd_weight", weights))
        weights += 1
    ops += [Op("bwd_weight", mb) for mb in range(weights, micro_batches)]
    return ops
