"""Interleaved 1F1B in the search (Narayanan et al. 2021, sec. 2.2.2): which virtual-stage counts a
plan may run, its 1F1B finalists' interleaved variants ranked by the estimate, and the refusals of
a ``training.virtual_stages`` that no plan can hold.

The placement search itself ranks plans with one chunk per device; the finalists that run 1F1B are
scored again with v > 1 (``evaluate.score_split`` charges the shorter bubble, the v times more
pipeline messages and the activations the chunks keep), and the best variants go to the simulator
beside the plain plan. Each stage's layers go into v near-even chunks
(``planner.plan.plan.interleave_plan``), and each replica's micro-batches are rounded to a multiple
of S, as Megatron-LM's schedule requires.
"""

from dataclasses import replace

import numpy as np

from cost_models.schedule import Schedule, interleaving_problem
from planner.errors import InputError
from planner.inputs.model import MAX_VIRTUAL_STAGES
from planner.plan.plan import Plan, interleave_plan
from planner.search.evaluate import Candidate, score_split

__all__ = ["VARIANTS_SIMULATED", "virtual_stage_choices", "legal_virtual_stages", "multiple_split",
           "interleaved_variants", "interleaving_refusal", "interleaving_error"]

VARIANTS_SIMULATED = 2  # interleaved variants of each 1F1B finalist simulated, best estimate first


def virtual_stage_choices(training) -> tuple:
    """The virtual-stage counts the search may plan: ``auto`` every power of two up to
    ``MAX_VIRTUAL_STAGES`` (1 included), a number only itself."""
    if training.virtual_stages == "auto":
        return tuple(2 ** k for k in range(MAX_VIRTUAL_STAGES.bit_length()) if 2 ** k <= MAX_VIRTUAL_STAGES)
    return (training.virtual_stages,)


def legal_virtual_stages(choices: tuple, layer_counts, stages: int) -> list:
    """Of ``choices``, the counts v > 1 that ``stages`` stages of ``layer_counts`` layers can run: at
    least two stages and at least v layers on every stage (a chunk holds one layer or more)."""
    if stages < 2:
        return []
    return [v for v in choices if 1 < v <= min(layer_counts)]


def multiple_split(micro_batches, stages: int, per_round: int = 0) -> tuple | None:
    """Each replica's micro-batch count rounded to a multiple of ``stages`` with the same total (largest
    remainders first, every replica keeping at least ``stages``); None where the total is not a
    multiple, or accumulation rounds of ``per_round`` are not (Megatron-LM's rule,
    ``cost_models.schedule.interleaving_problem``)."""
    m = np.asarray(micro_batches, dtype=np.int64)
    total = int(m.sum())
    if total % stages or (per_round and per_round % stages) or total // stages < len(m):
        return None
    units = m / stages
    whole = np.maximum(np.floor(units).astype(np.int64), 1)
    left = total // stages - int(whole.sum())
    order = np.argsort(-(units - np.floor(units)), kind="stable")  # largest remainders first
    whole[order[:max(left, 0)]] += 1  # fewer than R units are left over from the floors
    while left < 0:  # floors of 1 raised some replicas: take from the largest
        r = int(np.argmax(whole))
        whole[r] -= 1
        left += 1
    return tuple(int(k * stages) for k in whole)


def interleaved_variants(ctx, candidate: Candidate, plan: Plan, choices: tuple) -> list:
    """Up to ``VARIANTS_SIMULATED`` (estimate, interleaved plan) of ``candidate`` (whose plan is
    ``plan``), best estimate first: its split with each legal v of ``choices``, the micro-batches a
    multiple of S; none where it runs another schedule than 1F1B, tensor groups or int8 messages, or
    where no v fits in memory."""
    R, S = candidate.assign.shape
    if candidate.schedule != Schedule.ONE_F_ONE_B or plan.tensor_groups or plan.compression.messages != "off":
        return []
    micro_batches = multiple_split(candidate.micro_batches, S, ctx.training.micro_batches_per_round)
    if micro_batches is None:
        return []
    scored = []
    for v in legal_virtual_stages(choices, candidate.layer_counts, S):
        estimate = score_split(ctx, candidate.assign, candidate.layer_counts, micro_batches,
                               candidate.micro_batch_size, candidate.schedule, virtual_stages=v)
        if estimate is not None:
            scored.append((estimate, v))
    scored.sort()
    return [(estimate, interleave_plan(replace(plan, micro_batches=micro_batches, prediction=None, warmup_depth=1), v))
            for estimate, v in scored[:VARIANTS_SIMULATED]]


def interleaving_refusal(model, training, options, engine: str) -> InputError | None:
    """Why ``training.virtual_stages`` N > 1 cannot hold for any plan of this search (None when it
    may): another objective than the placement engine's, tensor groups only, too few layers for two
    stages of N chunks (or the pinned stages), a pinned single stage, or a micro-batch count no
    stage count can split into multiples of S."""
    v = training.virtual_stages
    if v == "auto" or v == 1:
        return None
    field = "training.virtual_stages"
    if engine == "allocation":
        return InputError(f"is {v}, but DTFM's allocation search plans one chunk per device: use --objective "
                          "time or set virtual_stages 1", field=field)
    if 1 not in options.tensor_degrees:
        return InputError(f"is {v}, but --tensor-degrees {' '.join(map(str, options.tensor_degrees))} asks for "
                          "tensor groups only, which interleaved 1F1B does not run: add 1 or set virtual_stages 1",
                          field=field)
    if options.stages == 1:
        return InputError(f"is {v}, but the stages are pinned to 1: interleaving needs at least 2 stages", field=field)
    lowest = options.stages or 2
    if model.layers < lowest * v:
        return InputError(f"is {v}, but {model.layers} layers do not give {lowest} stages {v} chunks of at least "
                          f"one layer each: lower virtual_stages", field=field)
    sizes = [training.micro_batch_size] if training.micro_batch_size else \
        [b for b in options.micro_batch_sizes if training.global_batch % b == 0] or [1]
    stage_counts = [options.stages] if options.stages else range(2, model.layers // v + 1)
    per_round = training.micro_batches_per_round
    if all(interleaving_problem(Schedule.ONE_F_ONE_B, s, [training.global_batch // b], per_round, v)
           for b in sizes for s in stage_counts):
        what = f"{options.stages} stages" if options.stages else "any stage count"
        return InputError(f"is {v}, but no micro-batch count of global_batch {training.global_batch} splits into "
                          f"multiples of {what}{' per round' if per_round else ''}, as interleaved 1F1B needs: "
                          "change global_batch or set virtual_stages 1", field=field)
    return None


def interleaving_error(virtual_stages: int) -> InputError:
    """No plan the search found runs ``virtual_stages`` chunks per device (memory or splits)."""
    return InputError(f"is {virtual_stages}, but no plan the search found can run it (each stage needs "
                      f"{virtual_stages} layers or more, each replica a multiple of S micro-batches, and the chunks' "
                      "activations must fit): lower virtual_stages or set it to auto", field="training.virtual_stages")
