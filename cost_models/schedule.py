"""Per-stage op lists of the pipeline schedules: the one source that both the simulator and the
runtime execute, so that predicted and measured timelines can be compared op by op.

An op is ``(kind, microbatch, chunk)``. Kinds: ``recv_fwd``/``fwd``/``send_fwd`` move activations from
stage s to s+1, ``recv_bwd``/``bwd``/``send_bwd`` move gradients from s+1 to s, ``sync`` is the
stage's gradient all-reduce over its replicas and ``step`` the optimizer update (microbatch -1).
The zero-bubble schedule splits a backward into ``bwd_input`` (the gradient of the stage's input,
which the stage upstream waits for) and ``bwd_weight`` (the weights' gradients, which nobody waits
for until the sync), so that weight gradients fill what would be bubble.
Interleaved 1F1B (``virtual_stages`` v > 1) gives each device v model chunks: chunk c of stage s is
the model's piece ``c * S + s`` of ``S * v``, and its messages go to piece ``p + 1`` (forward) or
``p - 1`` (backward), from the last stage to the first between chunks (``piece_of``, ``peer_stage``).
"""

from enum import StrEnum
from typing import NamedTuple

import numpy as np

__all__ = ["Schedule", "DEEPENED_SCHEDULES", "Op", "stage_ops", "round_sizes", "piece_of", "peer_stage", "interleaving_problem",
           "interleaved_warmup", "one_f_one_b_warmup", "run_depth", "warmup_depth_problem", "OP_KINDS",
           "COMPUTE_KINDS", "AUTO_SCHEDULES", "AUTO_WARMUP_DEPTHS"]


class Schedule(StrEnum):
    """The pipeline schedules (their values are what plan files and topology files write)."""

    ONE_F_ONE_B = "1f1b"  # PipeDream-Flush (Narayanan et al. 2021)
    GPIPE = "gpipe"  # Huang et al. 2019
    ZERO_BUBBLE = "zb-h1"  # ZB-H1, Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec. 3.1


# What ``schedule: auto``'s placement search ranks. ZB-H1 is not a third schedule there (it would split
# the search's budget three ways: tests/test_tensor_parallel.py's 8 x T4 + A100 cluster got 19.9 s
# instead of 15.7 s in 8 s); where a calibration measured every device's split backward, auto scores
# its 1F1B finalists again as ZB-H1 (``planner.search.zero_bubble``), as interleaving scores them again
# with v > 1 chunks per device (``planner.search.interleave``).
AUTO_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
# What ``warmup_depth: auto`` tries on 1F1B plans (``one_f_one_b_warmup``; ``planner.search.warmup``):
# at 8 a stage waits 7 steady steps more per hop for its messages than PipeDream-Flush lets it.
AUTO_WARMUP_DEPTHS = (1, 2, 3, 4, 6, 8)


OP_KINDS = ("recv_fwd", "fwd", "send_fwd", "recv_bwd", "bwd", "bwd_input", "send_bwd", "bwd_weight", "sync",
            "step")
COMPUTE_KINDS = ("fwd", "bwd", "bwd_input", "bwd_weight")


class Op(NamedTuple):
    kind: str
    microbatch: int
    chunk: int = 0  # the model chunk of the device that runs it (interleaved 1F1B; else 0)


def piece_of(stage: int, stages: int, chunk: int) -> int:
    """The model piece (of ``stages * v``, in layer order) that ``chunk`` of ``stage`` holds: ``chunk *
    stages + stage`` (Narayanan et al. 2021, sec. 2.2.2)."""
    return chunk * stages + stage


def peer_stage(stage: int, stages: int, forward: bool) -> int:
    """The stage a message of ``stage`` goes to: the next (forward) or previous (backward), wrapping
    from the last stage to the first between chunks of an interleaved schedule."""
    return (stage + (1 if forward else -1)) % stages


def interleaving_problem(schedule: str, stages: int, micro_batches, per_round: int = 0,
                         virtual_stages: int = 1) -> str:
    """Why ``virtual_stages`` chunks per device cannot run (empty when they can): interleaving is a
    1F1B schedule over at least two stages, and each accumulation round's micro-batches must be a
    multiple of the stage count (Narayanan et al. 2021, sec. 2.2.2: the schedule runs micro-batches
    in groups of S through every chunk)."""
    if virtual_stages == 1:
        return ""
    if virtual_stages < 1:
        return f"virtual stages must be at least 1, got {virtual_stages}"
    if schedule != Schedule.ONE_F_ONE_B:
        return f"virtual stages interleave 1F1B only, not {schedule}: use schedule 1f1b or virtual stages 1"
    if stages < 2:
        return "virtual stages need at least 2 pipeline stages"
    for m in micro_batches:
        sizes = round_sizes(int(m), per_round)
        if any(size % stages for size in sizes):
            return (f"interleaved 1F1B runs micro-batches in groups of the {stages} stages, but a replica runs "
                    f"rounds of {sizes}: make every replica's micro-batches (and rounds) a multiple of {stages}")
    return ""


def interleaved_warmup(stage, stages: int, micro_batches, chunks: int):
    """Warm-up chunk forwards of ``stage`` in one round of ``micro_batches`` under interleaved 1F1B
    with ``chunks`` chunks per device: ``min(2 (S - s - 1) + (v - 1) S, M v)``, all ``M v`` when
    M = S (Megatron-LM's ``forward_backward_pipelining_with_interleaving``; Narayanan et al. 2021,
    sec. 2.2.2). Vectorised over numpy arrays of stages and micro-batch counts."""
    total = np.multiply(micro_batches, chunks)
    return np.where(np.equal(micro_batches, stages), total,
                    np.minimum(2 * (stages - np.asarray(stage) - 1) + (chunks - 1) * stages, total))


def one_f_one_b_warmup(stage, stages: int, micro_batches, depth: int = 1):
    """Warm-up forwards of ``stage`` in a 1F1B round of ``micro_batches``: ``min(k (S - s - 1), M)``
    with warm-up depth ``k``. ``k = 1`` is PipeDream-Flush (Narayanan et al. 2021, sec. 2.2): stage s
    keeps ``S - s`` micro-batches in flight, as many as the pipeline downstream of it holds, so a
    message that takes longer than a stage's compute stalls it. Each further unit of depth keeps
    one more micro-batch in flight per stage downstream, as ZB-H2 adds warm-up forwards for more
    activation memory (Qi et al. 2024, sec. 3.1): stage s can then wait ``(k - 1)`` steady steps per
    hop for the messages of its round trip before it runs dry. Vectorised over numpy arrays."""
    return np.minimum(depth * (stages - np.asarray(stage) - 1), micro_batches)


DEEPENED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE)


def run_depth(schedule: str, depth: int, virtual_stages: int = 1) -> int:
    """The warm-up depth a plan of ``schedule`` runs with ``depth`` asked: ``depth`` under one-chunk
    1F1B or ZB-H1, 1 otherwise (GPipe and interleaving have their own warm-ups)."""
    return depth if schedule in DEEPENED_SCHEDULES and virtual_stages == 1 else 1


def warmup_depth_problem(schedule: str, depth: int, virtual_stages: int = 1) -> str:
    """Why warm-up depth ``depth`` cannot run (empty when it can): a depth above 1 deepens 1F1B and
    ZB-H1 with one chunk per device (GPipe already runs every forward first; interleaving has its
    own warm-up)."""
    if depth == 1:
        return ""
    if depth < 1:
        return f"warm-up depth must be at least 1, got {depth}"
    if schedule not in DEEPENED_SCHEDULES or virtual_stages != 1:
        what = f"{virtual_stages} virtual stages" if virtual_stages != 1 else f"schedule {schedule}"
        return f"a warm-up depth above 1 deepens 1F1B or ZB-H1 with one chunk per device, not {what}: use " \
               "schedule 1f1b or zb-h1 with virtual stages 1, or warm-up depth 1"
    return ""


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


def stage_ops(schedule: str, stage: int, stages: int, micro_batches: int, per_round: int = 0,
              virtual_stages: int = 1, warmup_depth: int = 1) -> list:
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
    Interleaved 1F1B (1F1B with ``virtual_stages`` v > 1; Narayanan et al. 2021, sec. 2.2.2, in
    Megatron-LM's order): the ``M * v`` chunk forwards run in groups of S micro-batches through chunk
    0, then chunk 1, ... (backwards through the chunks in reverse); stage s runs ``min(2 (S - s - 1)
    + (v - 1) S, M v)`` warm-up forwards (all of them when M = S), then alternates one forward and one
    backward, then drains. Its bubble is ``(S - 1)(F + B) / v`` (sec. 2.2.2); stage 0 holds up to
    ``2 (S - 1) + (v - 1) S + 1`` chunk forwards, each 1/v of its layers: ``S + (S - 1) / v``
    micro-batches' activations against 1F1B's S, the paper's ``1 + (S - 1) / (S v)``.
    With ``per_round`` > 0 the micro-batches run in accumulation rounds of that many (DTFM's runs
    accumulate in rounds of 64), each round its own pipeline fill and drain; gradients accumulate
    over the rounds and one sync and step end the iteration.
    ``warmup_depth`` k > 1 (1F1B and ZB-H1) runs ``min(k (S - s - 1), M)`` warm-up forwards
    (``one_f_one_b_warmup``): more micro-batches in flight, so slow messages overlap compute; ZB-H1's
    stage s then holds its first ``k s`` weight gradients back (ZB-H2's memory at k = 2, Qi et al.
    2024, sec. 3.1), so the first backward's wait is filled and the drain still carries input
    gradients only.
    """
    if not 0 <= stage < stages or micro_batches < 1:
        raise ValueError(f"bad stage {stage} of {stages} or micro_batches {micro_batches}")
    problem = interleaving_problem(schedule, stages, [micro_batches], per_round, virtual_stages) or \
        warmup_depth_problem(schedule, warmup_depth, virtual_stages)
    if problem:
        raise ValueError(problem)
    ops, first = [], 0
    for size in round_sizes(micro_batches, per_round):
        ops += [Op(op.kind, first + op.microbatch, op.chunk)
                for op in _one_round(schedule, stage, stages, size, virtual_stages, warmup_depth)]
        first += size
    return ops + [Op("sync", -1), Op("step", -1)]


def _one_round(schedule: str, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1,
               warmup_depth: int = 1) -> list:
    ops = []
    if virtual_stages > 1:
        ops = _interleaved_round(stage, stages, micro_batches, virtual_stages)
    elif schedule == Schedule.GPIPE:
        for mb in range(micro_batches):
            ops += _forward(stage, stages, mb)
        for mb in range(micro_batches):
            ops += _backward(stage, stages, mb)
    elif schedule == Schedule.ONE_F_ONE_B:
        warmup = int(one_f_one_b_warmup(stage, stages, micro_batches, warmup_depth))
        for mb in range(warmup):
            ops += _forward(stage, stages, mb)
        for i in range(micro_batches - warmup):
            ops += _forward(stage, stages, warmup + i)
            ops += _backward(stage, stages, i)
        for mb in range(micro_batches - warmup, micro_batches):
            ops += _backward(stage, stages, mb)
    elif schedule == Schedule.ZERO_BUBBLE:
        ops = _zero_bubble_round(stage, stages, micro_batches, warmup_depth)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return ops


def _zero_bubble_round(stage: int, stages: int, micro_batches: int, warmup_depth: int = 1) -> list:
    if stage == 0:
        return _one_round(Schedule.ONE_F_ONE_B, stage, stages, micro_batches, warmup_depth=warmup_depth)
    ops, forwards, backwards, weights = [], 0, 0, 0
    warmup = int(one_f_one_b_warmup(stage, stages, micro_batches, warmup_depth))
    for _ in range(warmup):
        ops += _forward(stage, stages, forwards)
        forwards += 1
    deferred = stage * warmup_depth  # weight gradients held back to fill the drain
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


def _interleaved_round(stage: int, stages: int, micro_batches: int, chunks: int) -> list:
    """One round of interleaved 1F1B (Megatron-LM's ``forward_backward_pipelining_with_interleaving``):
    the k-th chunk forward is micro-batch ``(k // (S v)) S + k % S`` on chunk ``(k % (S v)) // S``;
    the k-th chunk backward the same micro-batch on the chunks in reverse."""
    S, total = stages, micro_batches * chunks

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % (S * chunks)) // S
        return c if forward else chunks - 1 - c

    def micro_batch(k: int) -> int:
        return (k // (S * chunks)) * S + k % S

    def forward(k: int) -> list:
        c = chunk_of(k, True)
        return [Op(kind, mb, c) for kind, mb, _ in _forward(piece_of(stage, S, c), S * chunks, micro_batch(k))]

    def backward(k: int) -> list:
        c = chunk_of(k, False)
        return [Op(kind, mb, c) for kind, mb, _ in _backward(piece_of(stage, S, c), S * chunks, micro_batch(k))]

    warmup = int(interleaved_warmup(stage, S, micro_batches, chunks))
    ops = []
    for k in range(warmup):
        ops += forward(k)
    for k in range(total - warmup):
        ops += forward(warmup + k)
        ops += backward(k)
    for k in range(total - warmup, total):
        ops += backward(k)
    return ops
