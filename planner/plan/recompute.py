"""Activation recomputation per worker: what each (replica, stage) recomputes in its backward.

Three modes (Korthikanti et al. 2022, sec. 4-5):

- ``none``: a block keeps every activation its backward reads;
- ``selective``: a block recomputes its attention core (the scores, their softmax and its product
  with the values) in backward and keeps the rest, so it drops the ``a s^2 b`` terms for the attention
  core's forward FLOPs, ``4 b s^2 h`` (``cost_models.flops.attention_core_forward_flops``); with flash
  attention nothing of the core is kept, so it saves nothing there;
- ``full``: a block keeps its input only and re-runs its whole forward in backward (Chen et al. 2016).

A plan names each worker's mode (``Plan.recompute``, shaped as its assignment); every block of a
worker, each of its chunks under interleaving, runs that mode. The training's ``recompute`` is
``false`` (none), ``true`` (full), ``selective`` or ``auto``: the search gives each worker the
lightest mode under which it fits (``lightest_fitting``). A worker's mode changes only its own
backward's time and its own memory, so for a fixed placement and split the lightest mode that fits
each worker is the fastest choice.
"""

from dataclasses import replace
from enum import StrEnum

__all__ = ["RecomputeMode", "mode_of", "training_value", "uniform_modes", "plan_modes", "recompute_table_problem",
           "RELAXED_ORDER", "with_modes"]


class RecomputeMode(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


# Lightest first: each mode saves memory for more recomputation than the one before.
RELAXED_ORDER = (RecomputeMode.NONE, RecomputeMode.SELECTIVE, RecomputeMode.FULL)

_BY_VALUE = {False: RecomputeMode.NONE, True: RecomputeMode.FULL, "selective": RecomputeMode.SELECTIVE}
_TO_VALUE = {mode: value for value, mode in _BY_VALUE.items()}


def mode_of(value) -> RecomputeMode:
    """The mode of a resolved ``training.recompute`` (false, true or selective) or of a mode's name."""
    if isinstance(value, RecomputeMode):
        return value
    if isinstance(value, bool) or value == "selective":
        return _BY_VALUE[value]
    return RecomputeMode(value)


def training_value(mode) -> bool | str:
    """``training.recompute``'s value for ``mode``: False, True or "selective"."""
    return _TO_VALUE[mode_of(mode)]


def uniform_modes(mode, replicas: int, stages: int) -> tuple:
    """Every worker of ``replicas`` x ``stages`` in ``mode``."""
    return tuple((str(mode_of(mode)),) * stages for _ in range(replicas))


def plan_modes(plan, training) -> tuple:
    """The plan's table of modes: its own, or every worker in the training's resolved mode."""
    if plan.recompute:
        return plan.recompute
    return uniform_modes(mode_of(training.recompute), plan.replicas, plan.stages)


def with_modes(plan, training, table) -> tuple:
    """(plan, training) running ``table``'s modes: the plan keeps the table where its workers differ
    (one mode: the training's alone), and the training names the heaviest mode any worker runs."""
    modes = {mode_of(m) for row in table for m in row}
    heaviest = max(modes, key=RELAXED_ORDER.index)
    trained = replace(training, recompute=training_value(heaviest))
    return replace(plan, recompute=tuple(tuple(row) for row in table) if len(modes) > 1 else ()), trained


def recompute_table_problem(plan) -> str | None:
    """Why ``plan.recompute`` is malformed (not one known mode per worker), else None."""
    if not plan.recompute:
        return None
    if len(plan.recompute) != plan.replicas or any(len(row) != plan.stages for row in plan.recompute):
        return (f"recompute names {[len(row) for row in plan.recompute]} modes per replica, but the plan has "
                f"{plan.replicas} replicas of {plan.stages} stages: give one mode per worker")
    known = {str(m) for m in RecomputeMode}
    for row in plan.recompute:
        for mode in row:
            if mode not in known:
                return f"recompute mode {mode!r} is not one of {', '.join(sorted(known))}"
    return None
