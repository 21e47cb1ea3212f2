"""DTFM-style plans: all devices, even layers, even batch, the allocation DTFM's objective prefers."""


from planner.costing import predict
from planner.errors import InputError
from planner.plan import Plan
from planner.search.dtfm_search import dtfm_search, groups_to_pipelines
from planner.search.front import candidate_to_plan
from planner.search.evaluate import Candidate, make_context

__all__ = ["dtfm_degrees", "dtfm_style_plan", "best_dtfm_style_plan"]


def dtfm_degrees(n: int, layers: int) -> list:
    """(stages, replicas) with stages x replicas = n and stages dividing the layers (DTFM's constraints;
    at most 12 stages, the limit of the exact stage-order search)."""
    return [(s, n // s) for s in range(1, min(n, layers, 12) + 1) if n % s == 0 and layers % s == 0]


def dtfm_style_plan(topology, model, training, stages: int, replicas: int, groups=None, *, seed: int = 0,
                    schedule: str = "gpipe") -> Plan:
    """Even layers and batch over the pipelines of ``groups`` (found under DTFM's objective if None)."""
    if groups is None:
        groups = dtfm_search(topology, stages, replicas, seed=seed).groups
    assign = groups_to_pipelines(topology, groups)
    micro = training.micro_batch or 1
    total = training.global_batch // micro
    if total % replicas or model.layers % stages:
        raise InputError(f"{stages} x {replicas} does not split {model.layers} layers and {total} micro-batches "
                         "evenly", field="--stages")
    ctx = make_context(topology, model, training)
    candidate = Candidate(assign=assign, layer_counts=(model.layers // stages,) * stages,
                          microbatches=(total // replicas,) * replicas, micro_batch=micro, schedule=schedule,
                          score_s=float("nan"))
    plan = candidate_to_plan(ctx, candidate)
    prediction, _ = predict(plan, topology, model, training)
    return plan.with_prediction(prediction)


def best_dtfm_style_plan(topology, model, training, *, seed: int = 0):
    """The fastest (under the full cost model) DTFM-style plan that fits in memory, or None."""
    best = None
    micro = training.micro_batch or 1
    for stages, replicas in dtfm_degrees(topology.size, model.layers):
        if (training.global_batch // micro) % replicas:
            continue
        for schedule in ("gpipe", "1f1b"):
            plan = dtfm_style_plan(topology, model, training, stages, replicas, seed=seed, schedule=schedule)
            if plan.prediction.fits and (best is None or plan.prediction.iteration_s < best.prediction.iteration_s):
                best = plan
    return best


