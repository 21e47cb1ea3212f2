"""DTFM-style plans: all devices, even layers, even batch, the allocation DTFM's objective prefers."""

from dataclasses import replace

from planner.prediction.predict import predict
from planner.errors import InputError
from planner.plan.plan import Plan
from planner.search.dtfm_search import dtfm_degrees, dtfm_search, groups_to_pipelines
from planner.search.plans import candidate_to_plan
from planner.search.evaluate import Candidate, make_context

__all__ = ["dtfm_degrees", "dtfm_style_plan", "best_dtfm_style_plan", "dtfm_objective_plan"]


STYLE_LIMIT_S = 3.0  # the search under DTFM's objective for one DTFM-style plan's groups


def dtfm_style_plan(topology, model, training, stages: int, replicas: int, groups=None, *, seed: int = 0,
                    schedule: str = "gpipe") -> Plan:
    """Even layers and batch over the pipelines of ``groups`` (found under DTFM's objective if None,
    in ``STYLE_LIMIT_S``)."""
    if groups is None:
        groups = dtfm_search(topology, stages, replicas, seed=seed, time_limit_s=STYLE_LIMIT_S).groups
    assign = groups_to_pipelines(topology, groups)
    micro = training.micro_batch_size or 1
    total = training.global_batch // micro
    if total % replicas or model.layers % stages:
        raise InputError(f"{stages} x {replicas} does not split {model.layers} layers and {total} micro-batches "
                         "evenly", field="--stages")
    ctx = make_context(topology, model, training)
    candidate = Candidate(assign=assign, layer_counts=(model.layers // stages,) * stages,
                          micro_batches=(total // replicas,) * replicas, micro_batch_size=micro, schedule=schedule,
                          score_s=float("nan"))
    plan = candidate_to_plan(ctx, candidate)
    prediction, _ = predict(plan, topology, model, training)
    return plan.with_prediction(prediction)


def best_dtfm_style_plan(topology, model, training, *, seed: int = 0):
    """The fastest (under the full cost model) DTFM-style plan that fits in memory, or None."""
    best = None
    micro = training.micro_batch_size or 1
    for stages, replicas in dtfm_degrees(topology.size, model.layers):
        if (training.global_batch // micro) % replicas:
            continue
        groups = dtfm_search(topology, stages, replicas, seed=seed, time_limit_s=STYLE_LIMIT_S).groups
        for schedule in ("gpipe", "1f1b"):
            plan = dtfm_style_plan(topology, model, training, stages, replicas, groups, seed=seed, schedule=schedule)
            if plan.prediction.fits and (best is None or plan.prediction.iteration_s < best.prediction.iteration_s):
                best = plan
    return best




def dtfm_objective_plan(topology, model, training, *, stages=None, replicas=None, seed: int = 0,
                        time_limit_s: float = 10.0, callback=None) -> tuple:
    """The plan DTFM's scheduler would choose: every device, even layers and batch, and the
    allocation minimising DTFM's objective (``COST_DP + 2 * COST_PP``, dtfm.md) over its degrees
    (or the pinned ones, recorded as ``pinned``). Returns (plan with the simulator's prediction,
    ``DtfmResult``); the plan's search record holds DTFM's cost, the lower bound over the searched
    degrees (``engine_bound_s``, which the front door turns into the one ``lower_bound_s`` and
    ``gap`` of the objective), and CP-SAT's status on the chosen degrees (``dtfm_exact``: optimal
    when the allocation is proven optimal)."""
    pairs = [(s, r) for s, r in dtfm_degrees(topology.size, model.layers)
             if (stages is None or s == stages) and (replicas is None or r == replicas)]
    micro = training.micro_batch_size or 1
    pairs = [(s, r) for s, r in pairs if (training.global_batch // micro) % r == 0]
    if not pairs:
        raise InputError(f"DTFM uses all {topology.size} devices with stages dividing the {model.layers} layers and "
                         "replicas dividing the micro-batches: no such degrees here; pin others or use --objective time",
                         field="--objective")
    best, best_pair, bound, clock_cut = None, None, float("inf"), []
    per_pair = time_limit_s / len(pairs)
    for s, r in pairs:
        result = dtfm_search(topology, s, r, seed=seed, time_limit_s=per_pair)
        bound = min(bound, result.bound_s)  # over every searched shape
        clock_cut += [f"{s}x{r}:{phase}" for phase in result.clock_cut]
        if best is None or result.cost_s < best.cost_s:
            best, best_pair = result, (s, r)
        if callback:
            callback({"evaluations": result.evaluations, "best_s": best.cost_s, "phase": "dtfm"})
    # DTFM ran GPipe; with schedule 'auto' 1F1B stands in when GPipe's activations do not fit.
    for schedule in ([training.schedule] if training.schedule != "auto" else ["gpipe", "1f1b"]):
        plan = dtfm_style_plan(topology, model, training, *best_pair, groups=best.groups, schedule=schedule)
        if plan.prediction.fits:
            break
    pinned = {"stages": stages, "replicas": replicas}
    plan = replace(plan, search={"algorithm": "dtfm-objective", "seed": seed, "dtfm_cost_s": best.cost_s,
                                 "dtfm_dp_s": best.dp_s, "dtfm_pp_s": best.pp_s, "evaluations": best.evaluations,
                                 "engine_bound_s": bound, "dtfm_exact": best.exact_status,
                                 "dtfm_search": best.algorithm, "clock_cut": clock_cut,
                                 **({"pinned": pinned} if stages or replicas else {})})
    return plan, best
