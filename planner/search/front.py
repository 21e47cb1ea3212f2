"""The front door: ``search(topology, model, training, options, rng=..., callback=...)``.

1. Enumerate degrees (stages S x replicas D <= N), micro-batch sizes and schedules.
2. For each, place devices by the constructive layouts and balance layers and batch exactly.
3. Improve the best placements by iterated local search (swap two devices, or swap in an idle one;
   structural moves: stage groups and clusters moved, replicas merged or split, the depth changed
   in place; equal-cost moves walked a bounded way; kicks of a few random moves), with a seeded
   ``rng``, an evaluation budget and a stopping rule, so the same seed gives the same plan.
4. Run a genetic search (aligned crossover, memetic descent, elitism) on the best shape.
5. On small topologies, solve the leading shapes exactly with CP-SAT (placement, layer and batch
   split together), hinted with the heuristic's best.
6. Refine the splits of the best distinct candidates against the whole estimate, simulate them with
   the event simulator and keep the fastest.
7. Report a lower bound on any plan's iteration time and the gap to it.
"""

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from cost_models.network import Sync
from cost_models.schedule import Schedule

from cost_models.simulator import SimulationCut
from planner.prediction.predict import estimated_prediction, predict
from planner.prediction.stage_model import optimizer_shards
from planner.errors import InputError
from planner.plan.dims import Compression, GradientCompression, MessageCompression
from planner.plan.plan import Plan, validate_plan
from planner.plan.precision import resolve_precision
from planner.plan.sync import AUTO, syncs_for
from planner.plan.tensor import TENSOR_DEGREES, grouping_groups, groupings
from planner.search.recompute_cells import relaxed_plan, resplit
from planner.search.bounds import pair_bounds_s, work_flops
from planner.search.construct import layouts, probe_fallback, probe_layouts, within_cluster
from planner.search.cpsat_placement import exact_placement, model_is_small_enough
from planner.search.deadline import (CONSTRUCT_UNITS_PER_S, ESTIMATES_PER_S, EXACT_WORK_PER_S,
                                     REFINE_ESTIMATES_PER_S, SIMULATION_MARGIN, SMALL_SIMULATION_S, Budget,
                                     construct_units, plan_simulation_s, simulation_s)
from planner.search.dtfm_plan import dtfm_objective_plan
from planner.search.evaluate import Candidate, charges_groups, evaluate_placement, make_context, score_split
from planner.search.genetic import POPULATION, alignment_s, genetic_search
from planner.search.interleave import (interleaved_variants, interleaving_error, interleaving_refusal,
                                       virtual_stage_choices)
from planner.search.warmup import deeper_variants, warmup_depth_choices
from planner.search.zero_bubble import measured_schedules, placement_schedules, runnable_start, zero_bubble_variants
from planner.search.local import iterated_local_search
from planner.search.locality import bandwidth_clusters
from planner.search.moves import Neighbourhood
from planner.search.objective import IterationTime, Objective
from planner.search.plans import candidate_to_plan
from planner.search.sync_choice import choose_sync, estimated_sync, plan_with_sync, sync_training
from planner.search.group_choice import GROUP_CHOICE_SHARE, choose_sync_groups, chooses_groups, with_asked_groups
from planner.search.no_plan import (BudgetKnob, OutOfBudget, network_error, no_degrees_error, no_fit_error,
                                    out_of_budget_error, stage_memory_floor, too_few_micro_batches_error,
                                    too_large_error)
from planner.search.refine import REFINE_EVALUATIONS, refine_split

__all__ = ["SearchOptions", "SearchResult", "search"]


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    seed: int = 0
    time_limit_s: float = 30.0  # the clock's cap on the search
    budget_s: float | None = None  # the work budget, seconds at deadline.py's rates; None: time_limit_s
    max_evaluations: int = 4000  # local-search moves; the deterministic stopping rule
    stages: int | None = None  # pin S
    replicas: int | None = None  # pin D
    micro_batch_sizes: tuple = (1, 2, 4, 8)  # tried when training.micro_batch_size is 0 (auto)
    simulate_top: int = 6
    exact: bool = True  # solve the leading shapes with CP-SAT on topologies of <= EXACT_DEVICES devices
    exact_work_per_shape: float = 5.0  # CP-SAT deterministic time per shape (about seconds)
    tensor_degrees: tuple = TENSOR_DEGREES  # tensor degrees tried inside a host; (1,): none
    structural: bool = True  # cluster layouts and structural local moves; False: fastest-first and swaps only
    # the option the user set the work budget with (None: from budget_s), kept through the phases' shares
    budget_knob: BudgetKnob | None = None

    def __post_init__(self):
        if self.budget_knob is None:
            object.__setattr__(self, "budget_knob",
                               BudgetKnob.TIME_LIMIT if self.budget_s is None else BudgetKnob.BUDGET)

    @property
    def work_s(self) -> float:
        """The work budget (``planner.search.deadline``): the same budget and seed give the same plan."""
        return self.time_limit_s if self.budget_s is None else self.budget_s

    def share(self, fraction: float) -> "SearchOptions":
        """These options with ``fraction`` of the time limit and of the work budget."""
        return replace(self, time_limit_s=self.time_limit_s * fraction, budget_s=self.work_s * fraction)


@dataclass(kw_only=True)
class SearchResult:
    plan: Plan
    predicted_s: float  # the simulator's iteration time
    objective_s: float  # the plan's score under the objective (the iteration time for "time")
    lower_bound_s: float  # on the objective
    gap: float  # (objective - bound) / objective
    objective: str = "time"
    evaluations: int
    wall_s: float
    history: list = field(default_factory=list)  # (evaluations, wall_s, best estimate)
    algorithm: str = "construct+local+genetic"
    exact_shapes: list = field(default_factory=list)  # per CP-SAT-solved shape: status, optimum, bound
    training: object = None  # the training the plan runs: the asked one with its precision resolved
    pool: list = field(default_factory=list)  # the "pool" engine's distinct plans (planner.search.pareto.PoolEntry)


EXACT_DEVICES = 12  # CP-SAT placement is tried on topologies up to this size
STARTS = 3  # distinct shapes improved by local search
KEEP_UNREFINED = 2  # leading candidates simulated with their unrefined splits as well
LEXIMIN_GAIN = 1e-9  # relative drop of the estimate for which a split refined in leximin order is simulated


def _micro_batch_sizes(training, options) -> list:
    if training.micro_batch_size:
        return [training.micro_batch_size]
    return [b for b in options.micro_batch_sizes if training.global_batch % b == 0] or [1]


def _schedules(training) -> list:
    if training.fixed_virtual_stages > 1:  # interleaving is a 1F1B schedule
        return [Schedule.ONE_F_ONE_B]
    return placement_schedules(training)


DENSE_DEVICES = 256  # up to this many devices every replica count is tried; above, a geometric grid
_GRID_RATIO = 1.15


def _replica_counts(most: int, n: int) -> list:
    """Every count up to ``most`` on small topologies; on large ones 1-8, a geometric grid, and ``most``."""
    if n <= DENSE_DEVICES:
        return list(range(1, most + 1))
    counts, d = set(range(1, min(most, 8) + 1)), 8.0
    while d < most:
        d *= _GRID_RATIO
        counts.add(min(int(round(d)), most))
    counts.add(most)
    return sorted(counts)


def _degree_pairs(n: int, layers: int, options, virtual_stages: int = 1) -> list:
    """(stages, replicas) within ``n`` devices; with ``virtual_stages`` v fixed above 1, only depths of
    two stages or more that hold v chunks of a layer or more each."""
    pairs = []
    for s in range(1, min(layers, n) + 1):
        if (options.stages and s != options.stages) or (virtual_stages > 1 and not 2 <= s <= layers // virtual_stages):
            continue
        for d in _replica_counts(n // s, n) if not options.replicas else [options.replicas]:
            if s * d <= n:
                pairs.append((s, d))
    return pairs


def _ordered_pairs(pairs: list, work_flops: float, speed: np.ndarray) -> list:
    """(bound, stages, replicas) by ascending bound: the work over the fastest ``S x D`` devices."""
    fastest = np.cumsum(np.sort(speed)[::-1])
    return sorted((work_flops / fastest[s * d - 1], s, d) for s, d in pairs)


def _bound_ordered(pairs: list, topology, model, training) -> list:
    """``_ordered_pairs``' pairs (their work bounds kept, which prune) in the order of each pair's lower
    bound on every plan of its degrees (``bounds.pair_bounds_s``: the gradient sync, the round trips
    and the clusters besides the work; infinite for degrees whose largest stage's state fits on no
    device), so that where no probe orders them (above ``DENSE_DEVICES``) construction does not
    start with pairs whose replicas' rings must cross slow links."""
    table = pair_bounds_s(topology, model, training)

    def bound(work_s: float, stages: int, replicas: int) -> float:
        row = table.get(stages)
        return max(work_s, float(row[replicas - 1])) if row is not None and replicas <= len(row) else math.inf
    return sorted(pairs, key=lambda pair: (bound(*pair), pair))


def search(topology, model, training, options: SearchOptions = SearchOptions(), *, objective: Objective = None,
           x0: Plan | None = None, rng=None, callback=None) -> SearchResult:
    """Find the plan that minimises ``objective`` (the iteration time by default) and fits in memory.

    ``x0``: a plan to start from (re-planning); it is scored with the rest and kept if nothing beats
    it. ``callback(info)`` may return True to stop early. Returns the plan, its score under the
    objective, the objective's lower bound and the gap.
    """
    refusal = interleaving_refusal(model, training, options, (objective or IterationTime()).engine)
    if refusal is not None:
        raise refusal
    training = measured_schedules(training, topology)  # auto runs ZB-H1 where its blocks were measured
    x0 = runnable_start(x0, training)
    if training.fixed_virtual_stages > 1:  # interleaved 1F1B runs no tensor groups
        options = replace(options, tensor_degrees=(1,))
    if training.recompute == "auto":
        return _best_recompute(topology, model, training, options, objective=objective, x0=x0, rng=rng,
                               callback=callback)
    if "auto" in (training.compress_messages, training.compress_gradients):
        return _best_compression(topology, model, training, options, objective=objective, x0=x0, rng=rng,
                                 callback=callback)
    too_large = too_large_error(topology, model, training)  # before any work: no budget would find a plan
    if too_large is not None:
        raise too_large
    started = time.perf_counter()
    objective = objective or IterationTime()
    if x0 is not None and objective.engine != "placement":
        raise InputError(f"the {objective.name} objective plans every device with even splits and does not start "
                         "from a plan: drop the starting plan or use the time objective", field="x0")
    rng = rng if rng is not None else np.random.default_rng(options.seed)
    engine = {"placement": _placement_search, "allocation": _allocation_search, "pool": _pool_search}[objective.engine]
    # ``sync_groups: auto`` with local steps: the grouping choice keeps its share of the time limit
    # (and the search's work budget shrinks with it), so that auto compares groupings at any limit.
    searched = options.share(1.0 - GROUP_CHOICE_SHARE) if chooses_groups(training) else options
    plan, record = engine(topology, model, training, searched, rng=rng, callback=callback, x0=x0, started=started,
                          **({"objective": objective} if objective.engine == "pool" else {}))
    history, pool = record.pop("history", []), record.pop("pool", [])
    bound = objective.lower_bound(topology, model, training)  # over every device, at the asked precision
    # An engine's proof over the plans it could return (with pinned degrees, those degrees'), if tighter.
    bound = max(bound, record.pop("engine_bound_s", 0.0))
    sync_tried = record.pop("sync_tried", None)
    if sync_tried is not None and objective.engine == "placement":  # ``sync: auto`` resolved within the budget
        training = sync_training(training, plan.sync, plan.replicas)
    else:
        plan, training, sync_tried = choose_sync(plan, topology, model, training)
    # Local steps' sync groups: at most two simulations of the found plan (work set by the plan alone,
    # so the same seed and budget give the same grouping), within the time limit (its kept share).
    groups = choose_sync_groups(plan, topology, model, training, deadline=started + options.time_limit_s)
    plan, groups_tried = groups.plan, groups.tried
    training, plan = _resolved_training(plan, topology, model, training)
    validate_plan(plan, topology, model, training)
    score = objective.score(plan, topology, model, training)
    wall = time.perf_counter() - started
    gap = max(0.0, (score - bound) / score) if score > 0 else 0.0
    if sync_tried:
        record = {**record, "sync_tried": sync_tried}
    if groups_tried:
        record = {**record, "sync_groups_tried": groups_tried}
    if groups.untried:
        record = {**record, "sync_groups_untried": list(groups.untried)}
    if groups.clock_cut:
        record = {**record, "clock_cut": record.get("clock_cut", []) + ["sync groups"]}
    plan = replace(plan, search={**record, "objective": objective.name, "objective_s": score, "seed": options.seed,
                                 "wall_s": round(wall, 3), "lower_bound_s": bound, "gap": gap})
    return SearchResult(plan=plan, predicted_s=plan.prediction.iteration_s, objective=objective.name,
                        objective_s=score, lower_bound_s=bound, gap=gap, evaluations=record.get("evaluations", 0),
                        wall_s=wall, history=history,
                        algorithm=record["algorithm"], exact_shapes=record.get("exact", []), training=training,
                        pool=pool)


def _best_recompute(topology, model, training, options, **kwargs) -> SearchResult:
    """``recompute: auto``: the better of a search without recomputation and one with full
    recomputation, each on half the time limit (recomputation costs a forward per block and saves
    memory, so it wins only where memory binds), the second's plan with each worker at the lightest
    recomputation under which it fits (``recompute_cells``) where that scores no worse. The bound
    holds for every plan auto may return, whatever modes its workers run: never above either
    search's, nor above the bound over plans whose workers run any mode (``bounds.lower_bound_s``
    under ``auto``, with each search's resolved training)."""
    half = options.share(0.5)
    deadline = time.perf_counter() + options.time_limit_s
    results, tried, errors = [], {}, []
    for recompute in (False, True):
        try:
            found = search(topology, model, replace(training, recompute=recompute), half, **kwargs)
        except InputError as error:
            errors.append(error)
            continue
        tried[str(recompute).lower()] = found.objective_s
        if recompute:
            relaxed = _relaxed(found, topology, model, kwargs.get("objective") or IterationTime(), deadline)
            if relaxed is not found:
                found = relaxed
                tried[PER_WORKER] = found.objective_s
        results.append(found)
    if not results:
        raise errors[-1]  # the error with recomputation on: memory binds even then
    best = min(results, key=lambda r: r.objective_s)
    # Over every plan auto may return, its workers in any modes: the bound over plans whose workers run
    # any mode, under each search's own resolved training (compression and sharding) at the asked
    # precision, over every device as the searches' own bounds (a plan of bf16 devices alone resolves
    # to bf16, which devices without it cannot be bounded at)
    objective = kwargs.get("objective") or IterationTime()
    bound = min([r.lower_bound_s for r in results]
                + [objective.lower_bound(topology, model, replace(r.training, recompute="auto",
                                                                  precision=training.precision))
                   for r in results])
    gap = max(0.0, (best.objective_s - bound) / best.objective_s) if best.objective_s > 0 else 0.0
    tried = {"recompute_tried": tried}
    plan = replace(best.plan, search={**best.plan.search, "objective_s": best.objective_s, "lower_bound_s": bound,
                                      "gap": gap, **tried})
    return replace(best, plan=plan, lower_bound_s=bound, gap=gap, wall_s=sum(r.wall_s for r in results),
                   pool=[entry for r in results for entry in r.pool])


# ``recompute_tried``'s name for the plan of full recomputation with its workers then at their lightest modes
PER_WORKER = "per worker"


def _relaxed(result: SearchResult, topology, model, objective, deadline: float) -> SearchResult:
    """``result`` with each worker at the lightest recomputation under which it fits, if the plan
    so run scores no worse (``recompute_cells.relaxed_plan``), and then its layers moved while
    that scores lower (``recompute_cells.resplit``). Nothing starts after ``deadline``: what the
    clock cut is recorded (``clock_cut``: "recompute per worker")."""
    if time.perf_counter() > deadline:
        return _cut(result)
    relaxed = relaxed_plan(result.plan, topology, model, result.training)
    if relaxed is None:
        return result
    result = _if_no_worse(result, *relaxed, topology, model, objective)

    def score(plan, training):
        predicted = plan.with_prediction(predict(plan, topology, model, training)[0])
        return objective.score(predicted, topology, model, training) if predicted.prediction.fits else math.inf
    plan, training, _, cut = resplit(result.plan, result.training, topology, model, score, deadline=deadline,
                                     score_s=result.objective_s)
    if plan is not result.plan:
        result = _if_no_worse(result, plan, training, topology, model, objective)
    return _cut(result) if cut else result


def _cut(result: SearchResult) -> SearchResult:
    """``result`` with "recompute per worker" among the phases the clock cut (``clock_cut``)."""
    search = result.plan.search
    plan = replace(result.plan, search={**search, "clock_cut": search.get("clock_cut", []) + ["recompute per worker"]})
    return replace(result, plan=plan)


_COMPRESSED = {"compress_messages": MessageCompression.INT8, "compress_gradients": GradientCompression.POWERSGD}


def _best_compression(topology, model, training, options, *, objective=None, **kwargs) -> SearchResult:
    """``compress_messages`` / ``compress_gradients`` auto: a search with those switches off and one
    with them on, each on half the time limit (placement and splits follow what the wire costs; the
    second starts from the first's plan, compressed), and the better plan; if that is the
    compressed one, each switch is then turned off alone on that plan and kept off if the plan is
    not slower without it (compression is lossy: it stays only where it pays, so not on a plan of
    one stage or one replica). Ties go to no compression. The bound is the smaller of the two
    searches'."""
    auto = [key for key in _COMPRESSED if getattr(training, key) == "auto"]
    half = options.share(0.5)
    results, errors = {}, []
    for on in (False, True):
        chosen = replace(training, **{key: str(_COMPRESSED[key]) if on else "off" for key in auto})
        start = kwargs.get("x0")
        if on and start is None and "off" in results and (objective or IterationTime()).engine == "placement" \
                and results["off"].plan.virtual_stages == 1:  # interleaved 1F1B sends no int8 messages
            # the plan without compression, compressed, is a candidate too
            start = replace(results["off"].plan, compression=Compression.of_training(chosen), prediction=None,
                            search={})
        try:
            results["on" if on else "off"] = search(topology, model, chosen, half, objective=objective,
                                                    **{**kwargs, "x0": start})
        except InputError as error:
            errors.append(error)
    if not results:
        raise errors[-1]
    label = min(results, key=lambda k: results[k].objective_s)  # "off" on a tie
    tried = {"compression_tried": {k: r.objective_s for k, r in results.items()}}
    best = results[label]
    if label == "on":
        best = _drop_unpaid_compression(best, auto, topology, model, objective or IterationTime())
    results = list(results.values())
    bound = min(r.lower_bound_s for r in results)
    gap = max(0.0, (best.objective_s - bound) / best.objective_s) if best.objective_s > 0 else 0.0
    plan = replace(best.plan, search={**best.plan.search, "lower_bound_s": bound, "gap": gap, **tried})
    return replace(best, plan=plan, lower_bound_s=bound, gap=gap, wall_s=sum(r.wall_s for r in results),
                   pool=[entry for r in results for entry in r.pool])


def _drop_unpaid_compression(result: SearchResult, auto: list, topology, model, objective) -> SearchResult:
    """Turn each compression switch of ``auto`` that ``result`` has on off alone, and keep it off
    where the plan, predicted again, scores no worse without it; then, with int8 messages still on,
    each stage boundary's alone (in order), so only the boundaries where it pays stay compressed."""
    for key in auto:
        if getattr(result.training, key) != "off":
            training = replace(result.training, **{key: "off"})
            result = _if_no_worse(result, replace(result.plan, compression=Compression.of_training(training)),
                                  training, topology, model, objective)
    if "compress_messages" not in auto or result.training.compress_messages == "off":
        return result
    S = result.plan.stages
    for boundary in range(S - 1):
        kept = tuple(b for b in range(S - 1) if result.plan.compression.compresses(b) and b != boundary)
        compression = replace(result.plan.compression, boundaries=kept)
        result = _if_no_worse(result, replace(result.plan, compression=compression), result.training, topology,
                              model, objective)
    boundaries = result.plan.compression.boundaries
    if boundaries is not None and not boundaries:  # none pays: the switch is off
        training = replace(result.training, compress_messages="off")
        result = replace(result, training=training,
                         plan=replace(result.plan, compression=Compression.of_training(training)))
    elif boundaries is not None and len(boundaries) == S - 1:  # every one: written as such
        result = replace(result, plan=replace(result.plan, compression=replace(result.plan.compression,
                                                                                boundaries=None)))
    return result


def _if_no_worse(result: SearchResult, plan, training, topology, model, objective) -> SearchResult:
    """``result`` with ``plan`` (run with ``training``) instead, if it fits and scores no worse."""
    plan = replace(plan, prediction=None)
    plan = plan.with_prediction(predict(plan, topology, model, training)[0])
    if not plan.prediction.fits:
        return result
    score = objective.score(plan, topology, model, training)
    if score > result.objective_s:
        return result
    return replace(result, plan=plan, training=training, objective_s=score, predicted_s=plan.prediction.iteration_s)


def _resolved_training(plan, topology, model, training) -> tuple:
    """The training the plan runs: ``auto`` precision becomes bf16 or fp16 by the devices the plan
    uses (the plan is predicted again at the resolved format's peak when that changes a device's
    speed), and ``shard_optimizer`` says whether this plan's stages shard their optimizer state."""
    precision = resolve_precision(topology, plan.used_devices, training.precision)
    shard = optimizer_shards(training, plan.replicas) > 1
    resolved = replace(training, precision=precision, shard_optimizer=shard, virtual_stages=plan.virtual_stages,
                       warmup_depth=plan.warmup_depth)
    if precision == training.precision:
        return resolved, plan
    devices = [topology.devices[topology.index(name)] for name in plan.used_devices]
    if any(d.effective_flops(training.precision) != d.effective_flops(precision) for d in devices):
        plan = plan.with_prediction(predict(plan, topology, model, resolved))
    return resolved, plan


def _pool_search(topology, model, training, options, *, objective, rng, callback, x0, started) -> tuple:
    """Objectives in dollars or under a budget: the objective's choice among a pool of distinct
    plans (``planner.search.pareto``) that holds the placement engine's plan."""
    from planner.search.pareto import POOL_SHARE, plan_pool

    placement = options.share(1.0 - POOL_SHARE)  # the pool takes the rest
    fastest, record = _placement_search(topology, model, training, placement, rng=rng, callback=callback, x0=x0,
                                        started=started)
    pool = plan_pool(topology, model, training, options, [fastest], charge_idle=objective.charge_idle)
    return objective.choose(pool).plan, {**record, "pool": pool, "pool_plans": len(pool)}


def _allocation_search(topology, model, training, options, *, rng, callback, x0, started) -> tuple:
    """DTFM's allocation (every device, even splits) under its own objective (``dtfm_plan``)."""
    plan, dtfm = dtfm_objective_plan(topology, model, training, stages=options.stages, replicas=options.replicas,
                                     seed=options.seed, time_limit_s=options.time_limit_s, callback=callback)
    if not plan.prediction.fits:
        worst = max(plan.prediction.memory_bytes,
                    key=lambda d: plan.prediction.memory_bytes[d] / plan.prediction.capacity_bytes[d])
        raise InputError(f"DTFM's plan ({plan.stages} x {plan.replicas}, even splits) needs "
                         f"{plan.prediction.memory_bytes[worst] / 1e9:.1f} GB on {worst} of "
                         f"{plan.prediction.capacity_bytes[worst] / 1e9:.1f} GB: DTFM ignores memory; "
                         "use --objective time", field="--objective")
    return plan, {**plan.search, "dtfm_evaluations": dtfm.evaluations, "dtfm_wall_s": round(dtfm.wall_s, 3)}


PROBE_SHARE = 0.5  # of the construction budget, at most, for the probes that order the pairs
PROBE_FIRST = 8  # pairs with the best probes constructed first; the rest follow in bound order
PROBE_INSIDE_SHARE = 0.25  # of PROBE_SHARE, at most, on top of it where the probes left pairs (_inside_one_cluster)


def _probed_order(ctx, topology, pairs: list, micro_batch_size: int, schedule, budget, most_units: float,
                  levels: list, orders: dict) -> tuple:
    """The degree pairs in construction order, and the construction units the probes took: the
    ``PROBE_FIRST`` pairs whose probe (the better of the locality layout and the layout of whole
    pipelines inside the finest clusters, ``construct.probe_layouts``, at the smallest micro-batch
    size) is best, then every other pair in bound order.

    The compute bound ranks pairs that use more devices first; on a topology where the extra
    devices sit behind slow links (homes on 1 Gbit/s beside a GPU host) those pairs are the worst,
    and a pair of a few fast devices came too late for the construction budget. One layout's probe
    can also misjudge a pair that another layout serves well, so the bound order keeps the rest.
    Where these probes leave pairs, the ones that fill one of the coarsest clusters are probed inside
    it, on ``PROBE_INSIDE_SHARE`` of the share more (together at most 5/8 of the construction budget,
    give or take a probe), and go first where that probe beats every probe here
    (``_inside_one_cluster``); where they reach every pair, nothing changes."""
    scored, units, reached = [], 0.0, len(pairs)
    for index, (bound, stages, replicas) in enumerate(pairs):
        if units >= most_units or budget.out_of_time("construct"):
            scored += [(np.inf, i) for i in range(index, len(pairs))]
            reached = index
            break
        best = np.inf
        probes = probe_layouts(topology, ctx.speed, ctx.capacity, stages, replicas, levels, orders)
        for assign in probes:
            units += construct_units(stages * replicas)
            probe = evaluate_placement(ctx, assign, micro_batch_size, schedule)
            best = min(best, probe.score_s if probe is not None else np.inf)
        if not np.isfinite(best) and stages > 1:  # none fits: pipelines that mix the device types
            units += construct_units(stages * replicas)
            probe = evaluate_placement(ctx, probe_fallback(probes[0]), micro_batch_size, schedule)
            best = probe.score_s if probe is not None else np.inf
        scored.append((best, index))
    first = [i for score, i in sorted(scored)[:PROBE_FIRST] if np.isfinite(score)]
    alone, alone_units = _inside_one_cluster(ctx, topology, pairs, micro_batch_size, schedule, budget,
                                             most_units * PROBE_INSIDE_SHARE, levels,
                                             beat=min([score for score, _ in scored], default=np.inf), after=reached)
    first = alone + first  # none of the probes above reached those
    chosen = set(first)
    return [pairs[i] for i in first] + [p for i, p in enumerate(pairs) if i not in chosen], units + alone_units


def _inside_one_cluster(ctx, topology, pairs: list, micro_batch_size: int, schedule, budget, most_units: float,
                        levels: list, *, beat: float, after: int) -> tuple:
    """The indices in ``pairs``, from ``after`` on (those ``_probed_order``'s probes did not reach),
    of the pairs that fill one of the coarsest clusters (``levels[-1]``; for each cluster size ``c``
    and each S, the most replicas it holds, ``D = floor(c / S)``) whose layout inside one cluster
    (``_inside_layout``) the estimate puts below ``beat`` (the best of those probes), best first,
    ``PROBE_FIRST`` at most; and the construction units these probes took (``most_units`` at most,
    give or take the last probe).

    A plan inside one region, the others idle, uses fewer devices than most pairs, so it comes late in
    the compute bound's order and the probes' share of the budget ends first: on the 256 generated
    devices (two regions of 128 joined at 1-10 Gbit/s) 18 x 7 is pair 535 of 1,028, the probes
    reached 36 of them at ``--budget 5`` (223 at ``--budget 30``), and the search returned 16 x 16 at
    3.308 s (4 x 64 at 1.971 s) where 18 x 7 inside one region takes 1.551 s. Only a probe below every
    other one goes first, and only pairs the probes left: a pair constructed first takes the budget
    of one that would have been (with every probe inside one cluster first, whatever its estimate,
    DTFM case 4 went 22.107 -> 25.48 s and home-consumer-gpus under ``warmup_depth: auto`` 36.408 ->
    46.135 s), and so do probes (on home-mini at ``--budget 1``, probing again the pairs already probed
    left 2 x 1, 44.70 s, unbuilt: 45.91 s)."""
    if not levels:
        return [], 0.0
    sizes = np.bincount(levels[-1])
    filling = {(stages, int(c) // stages) for c in np.unique(sizes) for stages in range(1, int(c) + 1)}
    scored, units = [], 0.0
    for index, (_, stages, replicas) in enumerate(pairs[after:], start=after):
        if (stages, replicas) not in filling:
            continue
        if units >= most_units or budget.out_of_time("construct"):
            break
        units += construct_units(stages * replicas)
        probe = evaluate_placement(ctx, _inside_layout(ctx, topology, levels[-1], stages, replicas), micro_batch_size,
                                   schedule)
        if probe is not None and probe.score_s < beat:
            scored.append((probe.score_s, index))
    return [i for _, i in sorted(scored)[:PROBE_FIRST]], units


def _inside_layout(ctx, topology, labels: np.ndarray, stages: int, replicas: int) -> np.ndarray:
    """(replicas, stages): whole pipelines inside the one cluster of ``labels`` whose ``S D`` fastest
    devices compute most (ties: the first), among those with ``S D`` devices at least
    (``construct.within_cluster``)."""
    cells = stages * replicas
    devices = np.arange(topology.size)
    holding = [c for c in range(int(labels.max()) + 1) if np.count_nonzero(labels == c) >= cells]
    best = max(holding, key=lambda c: (float(np.sort(ctx.speed[labels == c])[::-1][:cells].sum()), -c))
    return within_cluster(topology, ctx.speed, ctx.capacity, stages, replicas, devices[labels == best])


def _placement_search(topology, model, training, options, *, rng, callback, x0, started) -> tuple:
    """The placement engine over tensor groupings (``planner.plan.tensor.groupings``): without
    tensor groups on the whole time limit and work budget, as when no grouping is tried, so that
    trying them never returns a slower plan for the same seed and budget (while the clock cuts
    nothing); then the smaller-memory types grouped on the work budget the first search did not use
    (its stopping rules end phases before their shares; ``Budget.spent_s``) and the clock it left;
    only when neither finds a plan, every type in groups of 2, 4, 8 on equal parts of the time
    left. The plan the simulator finds fastest, and its search's record."""
    first, fallback = groupings(topology, model, options.tensor_degrees)
    if x0 is not None and x0.tensor_groups:
        validate_plan(x0, topology, model, training)
        first, fallback = [None], []  # re-planning a plan with tensor groups keeps its groups
    best, tried, failure, attempts, skipped = None, {}, None, 0, False
    spent_s = 0.0  # the work budget the groupings tried so far used
    for k, mapping in enumerate(first + fallback):
        if k >= len(first):
            if best is not None:
                break
            left = options.time_limit_s - (time.perf_counter() - started)
            share = replace(options, time_limit_s=max(left, 0.0) / (len(first) + len(fallback) - k),
                            budget_s=options.work_s / (len(first) + len(fallback)))  # work: not the clock's
        else:
            # The ungrouped search gets the whole budget; a later grouping gets the work budget the
            # searches before it left unused (their stopping rules end phases early) and the clock left.
            share = options if k == 0 else replace(options, budget_s=max(options.work_s - spent_s, 0.0))
            left = options.time_limit_s - (time.perf_counter() - started)  # an earlier grouping's overrun
            if best is not None and left <= 0.0:  # the clock ran out: a plan is at hand
                skipped = True
                break
            share = replace(share, time_limit_s=max(min(share.time_limit_s, left), 0.0))
        groups = x0.tensor_groups if mapping is None else grouping_groups(topology, mapping)
        attempts += 1
        budget = Budget(limit_s=share.time_limit_s, work_s=share.work_s,
                        started=time.perf_counter() if best or failure else started)
        try:
            plan, record = _grouped_placement_search(topology, model, training, share, groups=groups, rng=rng,
                                                     callback=callback, x0=x0 if mapping is None or not groups else None,
                                                     started=budget.started, budget=budget)
        except InputError as error:  # the first failure, unless a later one says more budget may find a plan
            failure = error if failure is None or (isinstance(error, OutOfBudget)
                                                   and not isinstance(failure, OutOfBudget)) else failure
            spent_s += budget.spent_s  # the work a search that found no plan used
            continue
        spent_s += record["work_used_s"]
        label = ", ".join(f"{t}: {d}" for t, d in sorted((mapping or {}).items())) or "as the starting plan"
        tried[label] = plan.prediction.iteration_s
        if best is None or plan.prediction.iteration_s < best[0].prediction.iteration_s:
            best = (plan, record)
    if best is None:
        raise failure
    plan, record = best
    record = {**record, "work_used_s": spent_s}  # over every grouping tried
    if skipped:  # the clock, not the work budget, left the tensor groupings untried
        record = {**record, "clock_cut": record["clock_cut"] + ["tensor groups"]}
    return plan, ({**record, "tensor_tried": tried} if attempts > 1 else record)


def _grouped_placement_search(topology, model, training, options, *, groups, rng, callback, x0, started,
                              budget: Budget | None = None) -> tuple:
    """The placement engine (steps 1-6 of this module's description) with ``groups`` as tensor
    groups: the best plan by the simulator among the estimate's best candidates, and the search's record.

    Every phase runs on a deterministic work budget sized by the time limit and stops at its share
    of the limit if the clock gets there first (``planner.search.deadline``); ``budget``: the
    options' own, made by the caller to read the work spent when no plan is found."""
    budget = budget or Budget(limit_s=options.time_limit_s, work_s=options.work_s, started=started)
    ctx = make_context(topology, model, training, groups)
    real, topology = topology, ctx.topology  # the search places the groups; the simulator sees their members
    history = []
    evaluations = 0
    candidates = []
    best_score = np.inf

    def report(phase: str, best: float) -> None:
        if callback and callback({"evaluations": evaluations, "best_s": best, "phase": phase}):
            budget.stop()

    # Degree pairs by ascending work bound (up to DENSE_DEVICES a probe reorders them, above their whole
    # lower bound does); a pair whose work bound reaches the best estimate is skipped (every estimate is
    # at least its pair's work bound).
    allowed = _degree_pairs(topology.size, model.layers, options, training.fixed_virtual_stages)
    sizes = _micro_batch_sizes(training, options)
    if not allowed:
        raise no_degrees_error(topology.size, model.layers, options.stages, options.replicas)
    if min(d for _, d in allowed) > training.global_batch // min(sizes):
        raise too_few_micro_batches_error(training.global_batch, min(sizes), min(d for _, d in allowed))
    pairs = _ordered_pairs(allowed, work_flops(topology, model, training), ctx.speed)
    if topology.size > DENSE_DEVICES:
        pairs = _bound_ordered(pairs, real, model, ctx.training)
    units = 0.0
    levels = bandwidth_clusters(topology) if options.structural else []
    orders = {}  # each cluster level's order, shared by the degree pairs (construct.cluster_layouts)
    if topology.size <= DENSE_DEVICES:
        schedules = _schedules(training)  # the probe takes 1F1B where allowed: it keeps the fewest activations
        probe_schedule = Schedule.ONE_F_ONE_B if Schedule.ONE_F_ONE_B in schedules else schedules[0]
        pairs, probed = _probed_order(ctx, topology, pairs, sizes[0], probe_schedule, budget,
                                      budget.construct_units() * PROBE_SHARE, levels, orders)
        units += probed
    # While no plan fits, construction goes on past its share, to the budget's and the clock's end for
    # construction without a plan (``deadline.CONSTRUCT_UNPLANNED_END``), checked at every evaluation
    # after the first pair's (one pair's layouts: the unit of work the limit may be exceeded by).
    unplanned_units, first_plan_units, cut, tried, left = budget.construct_units(planned=False), None, None, 0, 0
    ungrouped, largest_bytes = ctx.tensor.max() == 1, ctx.capacity.max()  # the floor knows no tensor groups

    def unplanned_cut() -> str | None:  # what ends construction without a plan: the work budget or the clock
        if units >= unplanned_units:
            return "budget"
        return "clock" if budget.out_of_time_unplanned() else None

    for index, (pair_bound, stages, replicas) in enumerate(pairs):
        if pair_bound >= best_score:
            continue  # no plan of this pair can beat the best estimate
        if candidates and (units >= budget.construct_units() or budget.out_of_time("construct")):
            break  # the first pair with a plan that fits is always finished
        if not candidates and tried and (cut := unplanned_cut()):
            left = len(pairs) - index
            break
        if not candidates and ungrouped and stage_memory_floor(model, ctx.training, min(sizes), stages,
                                                               replicas) > largest_bytes:
            continue  # while none fits, a pair no device can hold a stage of costs no work (no_plan's floor)
        tried, planned = tried + 1, bool(candidates)
        for layout_name, assign in layouts(topology, ctx.speed, ctx.capacity, stages, replicas, levels, orders).items():
            # a pair's layouts of 16,384 devices take seconds
            if candidates and (budget.out_of_time("construct") if planned else budget.out_of_time_unplanned()):
                break
            for micro_batch_size, schedule in ((b, s) for b in sizes for s in _schedules(training)):
                if not candidates and tried > 1 and (cut := unplanned_cut()):
                    left = len(pairs) - index - 1  # this one tried in part
                    break
                evaluations += 1
                units += construct_units(stages * replicas)
                candidate = evaluate_placement(ctx, assign, micro_batch_size, schedule)
                if candidate is not None:
                    first_plan_units = units if first_plan_units is None else first_plan_units
                    candidates.append(candidate)
                    best_score = min(best_score, candidate.score_s)
            if cut:
                break
        report("construct", best_score)
        if cut:
            break
    budget.spend("construct", units / CONSTRUCT_UNITS_PER_S)
    if first_plan_units is not None:
        budget.construct_ended(first_plan_units)
    x0_candidate = _start_candidate(ctx, x0)
    if x0_candidate is not None:
        candidates.append(x0_candidate)
    if not candidates and cut:
        raise out_of_budget_error(tried, left, clock=cut == "clock", knob=options.budget_knob)
    if not candidates:
        raise no_fit_error(topology, model, training, allowed, sizes, stages_pinned=bool(options.stages),
                           speed=ctx.speed, capacity=ctx.capacity)
    candidates.sort(key=lambda c: c.score_s)
    best_estimate = candidates[0].score_s
    first = candidates[0]
    budget.reserve_finalists(first.assign.shape[1], first.assign.shape[0], sum(first.micro_batches))
    history.append((evaluations, time.perf_counter() - started, best_estimate))
    report("construct", best_estimate)
    # Local search from the best three distinct shapes, the best of each schedule among them: the
    # estimate's errors differ between GPipe and 1F1B, so both get improved placements to simulate.
    seen, starts = set(), []
    for schedule in sorted({c.schedule for c in candidates}):
        leader = next(c for c in candidates if c.schedule == schedule)
        seen.add(_shape(leader))
        starts.append(leader)
    for c in candidates:
        if len(starts) >= STARTS:
            break
        if _shape(c) not in seen:
            seen.add(_shape(c))
            starts.append(c)
    starts.sort(key=lambda c: c.score_s)
    improved = []
    per_start = budget.estimates("local", options.max_evaluations, first.assign.size) // max(len(starts), 1)
    for start in starts:
        hood = Neighbourhood(levels=levels, stages_pinned=bool(options.stages), replicas_pinned=bool(options.replicas),
                             max_stages=model.layers, max_replicas=training.global_batch // start.micro_batch_size)
        result, used = iterated_local_search(ctx, start, rng, per_start, budget.end("local"),
                                             hood if options.structural else None)
        budget.note_cut("local", used < per_start and budget.out_of_time("local"))
        budget.spend("local", used * construct_units(first.assign.size) / ESTIMATES_PER_S)
        evaluations += used
        improved.append(result)
        best_estimate = min(best_estimate, result.score_s)
        history.append((evaluations, time.perf_counter() - started, best_estimate))
        report("local", best_estimate)
    # Genetic search on the best shape, seeded with its layouts and local-search results.
    leader = min(improved, key=lambda c: c.score_s)
    shape = (leader.assign.shape, leader.micro_batch_size, leader.schedule)
    seeds = [c for c in sorted(improved + candidates, key=lambda c: c.score_s)
             if (c.assign.shape, c.micro_batch_size, c.schedule) == shape][:POPULATION]
    genetic_budget = budget.estimates("genetic", options.max_evaluations // 4, leader.assign.size)
    result, used = genetic_search(ctx, seeds, rng, genetic_budget, budget.end("genetic"))
    budget.note_cut("genetic", used < genetic_budget and budget.remaining_s("genetic")
                      <= alignment_s(leader.assign.shape[0]))
    budget.spend("genetic", used * construct_units(leader.assign.size) / ESTIMATES_PER_S)
    evaluations += used
    improved.append(result)
    best_estimate = min(best_estimate, result.score_s)
    history.append((evaluations, time.perf_counter() - started, best_estimate))
    report("genetic", best_estimate)
    exact_shapes = []
    # CP-SAT's time and memory coefficients are per stage, not per tensor degree: grouped searches skip it.
    if options.exact and topology.size <= EXACT_DEVICES and ctx.tensor.max() == 1:
        work = budget.exact_work(len(starts), options.exact_work_per_shape)
        for start in starts:
            if budget.remaining_s("exact") < _EXACT_MIN_S:
                budget.note_cut("exact", True)
                break
            shape_best = min((c for c in improved + candidates if _shape(c) == _shape(start)), key=lambda c: c.score_s)
            record, exact = _solve_exactly(ctx, shape_best, work, budget.remaining_s("exact"))
            budget.spend("exact", work / EXACT_WORK_PER_S if record is not None else 0.0)
            if record is not None:
                exact_shapes.append(record)
            if exact is not None:
                improved.append(exact)
                best_estimate = min(best_estimate, exact.score_s)
            budget.note_cut("exact", budget.out_of_time("exact"))
        history.append((evaluations, time.perf_counter() - started, best_estimate))
        report("exact", best_estimate)
    pool = sorted(improved + candidates, key=lambda c: c.score_s)
    unique, keys = [], set()
    for c in pool:
        if c.key() not in keys:
            keys.add(c.key())
            unique.append(c)
        if len(unique) == options.simulate_top:
            break
    # The best of each schedule and micro-batch size is simulated too: the estimate's errors differ
    # between them, and the simulator has the last word.
    for variant in sorted({(c.schedule, c.micro_batch_size) for c in pool}):
        leader = next(c for c in pool if (c.schedule, c.micro_batch_size) == variant)
        if leader.key() not in keys:
            keys.add(leader.key())
            unique.append(leader)
    if x0_candidate is not None and x0_candidate.key() not in keys:  # the starting plan is simulated too
        keys.add(x0_candidate.key())
        unique.append(x0_candidate)
    # The best constructed plan too: local search lowers the estimate, which can misjudge a
    # placement by more than it gains (case 5: an improved 8 x 8 estimated 37.2 s simulates at
    # 40.4 s, the constructed one estimated 38.2 s at 30.6 s).
    constructed = candidates[0]
    if constructed.key() not in keys:
        keys.add(constructed.key())
        unique.insert(1, constructed)
    # The best of each shape first: when the finalists' budget ends the simulation early, the
    # shapes the estimate may misjudge have each had their best simulated.
    leaders, shapes = [], set()
    for c in unique[:1] + [constructed] + unique[1:]:
        if any(c is leader for leader in leaders):
            continue
        if _shape(c) not in shapes:
            shapes.add(_shape(c))
            leaders.append(c)
        elif c is constructed:
            leaders.append(c)
    unique = leaders + [c for c in unique if not any(c is leader for leader in leaders)]
    # Refined splits go to the simulator, and the two leading unrefined ones too: the estimate that
    # refinement lowers is not the simulator's prediction, which has the last word. Finalists are
    # refined and simulated in order until the finalists' share of the limit is spent; the first
    # is always simulated, so there is a plan. With ``sync: auto`` each finalist syncs by the
    # algorithm its estimate prefers, and the share keeps room to simulate the best plan with
    # every other algorithm (``sync_reserve_s``) before the last word.
    best_plan, best_time, unfinished, simulated = None, np.inf, [], 0
    finalists = []  # (estimate, simulator) of every simulated candidate, for benchmarks/estimate_at_scale.py
    work_s, allowed_s = 0.0, budget.finalists_work_s()  # deterministic work, in seconds at fixed rates
    simulation_wall_s = 0.0  # the longest simulation yet: one more starts only if the finalists' share holds it
    auto_sync = training.sync == AUTO
    sync_reserve_s = _sync_reserve_s(training, unique[0]) if auto_sync else 0.0

    def more(simulating: bool = False, reserve_s: float = 0.0) -> bool:  # whether more may be refined or simulated
        if best_plan is None:  # until one fits, always (the clock may cut its simulation: ``simulate``)
            return not estimated
        if simulating and budget.remaining_s("finalists") < simulation_wall_s:
            budget.note_cut("finalists", True)
            return False
        return work_s + reserve_s < allowed_s and not budget.out_of_time("finalists")

    def simulate(plan, run):
        """The simulator's prediction of ``plan`` run with ``run``, its work counted; None where the
        clock would end (or ends) it first: before the finalists' end (for the plan's first
        simulation, at least ``SMALL_SIMULATION_S`` from now)."""
        nonlocal simulation_wall_s, simulated, work_s
        predicted_s = plan_simulation_s(plan)
        now = time.perf_counter()
        end = (max(budget.first_simulation_end, now + SMALL_SIMULATION_S) if best_plan is None
               else budget.end("finalists"))
        if now + predicted_s > end:
            budget.note_cut("simulation", True)
            return None
        try:
            prediction, _ = predict(plan, real, model, run, deadline=end)
        except SimulationCut:
            budget.note_cut("simulation", True)
            return None
        simulation_wall_s = max(simulation_wall_s, time.perf_counter() - now)
        simulated += 1
        work_s += predicted_s
        return prediction

    choices, interleaved = virtual_stage_choices(training), set()  # the v tried, and (candidate, v, k, schedule) simulated
    depths = warmup_depth_choices(training)  # 1F1B's and ZB-H1's warm-up depths k tried
    estimated = None  # the first finalist at its estimate, where the clock cut its simulation
    simulated_splits = []  # (simulated seconds, order, candidate) of each candidate simulated at one chunk, fitting
    simulated_keys = set()  # the candidates simulated (``Candidate.key``)

    def try_candidate(candidate) -> bool:
        """Simulate ``candidate`` (and its interleaved and deeper variants); False where the share is spent."""
        nonlocal best_plan, best_time, estimated
        if not more(simulating=True, reserve_s=sync_reserve_s):
            return False
        plain, run = candidate_to_plan(ctx, candidate), training
        if auto_sync:
            sync = estimated_sync(ctx, candidate)
            plain, run = plan_with_sync(plain, real, sync), sync_training(training, sync, plain.replicas)
        plain = with_asked_groups(plain, real, run)  # ``cluster`` / ``one``: simulated in their groups
        # Interleaved 1F1B: the candidate's variants with v > 1 chunks per device, simulated too
        # (planner.search.interleave); with virtual_stages fixed above 1 only they may win.
        # 1F1B with more warm-up forwards where the search picks the depth (planner.search.warmup):
        # a deeper variant the estimate puts ahead is simulated in the candidate's place.
        deeper = deeper_variants(ctx, candidate, plain, depths) if 1 in choices else []
        main = deeper[0][1] if deeper else plain
        # ZB-H1 where auto runs it: the same split with its backward split (planner.search.zero_bubble).
        variants = [(e, p) for e, p in (interleaved_variants(ctx, candidate, plain, choices)
                                        + zero_bubble_variants(ctx, candidate, plain, choices, depths))
                    if (candidate.key(), p.virtual_stages, p.warmup_depth, p.schedule) not in interleaved]
        variants = (deeper or ([(candidate.score_s, plain)] if 1 in choices else [])) + variants
        interleaved.update((candidate.key(), p.virtual_stages, p.warmup_depth, p.schedule) for _, p in variants)
        for estimate, plan in variants:
            if plan is not main and not more(simulating=True, reserve_s=sync_reserve_s):
                break
            prediction = simulate(plan, run)
            if prediction is None:  # the clock cut it: the first plan keeps its estimate, the rest stop
                if best_plan is None and estimated is None:
                    estimated = plan.with_prediction(estimated_prediction(plan, real, model, run, estimate))
                break
            finalists.append({"stages": plan.stages, "replicas": plan.replicas, "estimate_s": float(estimate),
                              "simulated_s": float(prediction.iteration_s), "fits": prediction.fits,
                              **({"virtual_stages": plan.virtual_stages} if plan.virtual_stages > 1 else {}),
                              **({"warmup_depth": plan.warmup_depth} if plan.warmup_depth > 1 else {}),
                              **({"schedule": str(plan.schedule)} if plan.schedule != candidate.schedule else {})})
            if prediction.fits and not math.isfinite(prediction.iteration_s):
                unfinished.append(prediction.iteration_s)
            elif prediction.fits and prediction.iteration_s < best_time:
                best_plan, best_time = plan.with_prediction(prediction), prediction.iteration_s
            if plan is main and prediction.fits and math.isfinite(prediction.iteration_s):
                simulated_splits.append((prediction.iteration_s, len(simulated_splits), candidate))
        simulated_keys.add(candidate.key())
        return True

    for rank, c in enumerate(unique):
        if not more(reserve_s=sync_reserve_s):
            break
        tries = [c]
        if more(reserve_s=sync_reserve_s):
            refine_rate = REFINE_ESTIMATES_PER_S / construct_units(c.assign.size)
            refine_budget = min(REFINE_EVALUATIONS, max(1, int(refine_rate * max(allowed_s - sync_reserve_s - work_s,
                                                                                  0.0))))
            refine_end = budget.end("finalists")
            if best_plan is None:  # the plan's first simulation keeps twice its predicted time before the finalists' end
                R, S = c.assign.shape
                refine_end = min(refine_end, budget.first_simulation_end
                                 - SIMULATION_MARGIN * simulation_s(S, R, sum(c.micro_batches)))
            better, used = refine_split(ctx, c, budget=refine_budget, deadline=refine_end)
            budget.note_cut("finalists", used < refine_budget and time.perf_counter() >= refine_end)
            evaluations += used
            work_s += used / refine_rate
            tries = [better, c] if rank < KEEP_UNREFINED and better is not c else [better]
            best_estimate = min(best_estimate, better.score_s)
        for candidate in tries:
            if not try_candidate(candidate):
                break
    # What the finalists' share leaves: the simulated splits, fastest first, refined again in leximin
    # order (``planner.search.refine``: where several stages end together no single move lowers the
    # estimate); a split whose estimate that lowers is simulated too. The pass above is the same
    # without it, so this only adds plans.
    refined_keys = set()
    for _, _, c in sorted(simulated_splits, key=lambda t: (t[0], t[1])):
        if best_plan is None or not more(simulating=True, reserve_s=sync_reserve_s):
            break
        if c.key() in refined_keys:
            continue
        refined_keys.add(c.key())
        refine_rate = REFINE_ESTIMATES_PER_S / construct_units(c.assign.size)
        refine_budget = min(REFINE_EVALUATIONS, max(1, int(refine_rate * max(allowed_s - sync_reserve_s - work_s,
                                                                              0.0))))
        better, used = refine_split(ctx, c, budget=refine_budget, deadline=budget.end("finalists"), leximin=True)
        budget.note_cut("finalists", used < refine_budget and time.perf_counter() >= budget.end("finalists"))
        evaluations += used
        work_s += used / refine_rate
        if better.score_s < c.score_s * (1.0 - LEXIMIN_GAIN) and better.key() not in simulated_keys:
            best_estimate = min(best_estimate, better.score_s)
            if not try_candidate(better):
                break
    sync_record = {}
    if auto_sync and best_plan is not None:  # the best plan with every other algorithm, while the share holds
        tried, untried = {str(best_plan.sync): best_time}, []
        for sync in syncs_for(training, best_plan.replicas) if best_plan.replicas > 1 else ():
            if str(sync) in tried:
                continue
            if untried or not more(simulating=True):
                untried.append(str(sync))
                continue
            other = plan_with_sync(best_plan, real, sync)
            prediction = simulate(other, sync_training(training, sync, best_plan.replicas))
            if prediction is None:
                untried.append(str(sync))
                continue
            tried[str(sync)] = prediction.iteration_s
            if prediction.fits and math.isfinite(prediction.iteration_s) and prediction.iteration_s < best_time:
                best_plan, best_time = other.with_prediction(prediction), prediction.iteration_s
        sync_record = {"sync_tried": tried, **({"sync_untried": untried} if untried else {})}
    budget.spend("finalists", work_s)
    history.append((evaluations, time.perf_counter() - started, best_estimate))
    if best_plan is None and estimated is not None and estimated.prediction.fits:
        best_plan = estimated  # no simulation fitted the limit: the search's estimate stands
        if auto_sync:  # its sync is the estimate's choice, the others unsimulated
            sync_record = {"sync_tried": {}, "sync_untried": [str(s) for s in syncs_for(training, best_plan.replicas)
                                                              if s != best_plan.sync]}
    if best_plan is None:
        if unfinished:
            raise network_error(unfinished)
        if 1 not in choices:
            raise interleaving_error(training.virtual_stages)
        raise no_fit_error(topology, model, training, allowed, sizes, stages_pinned=bool(options.stages),
                           speed=ctx.speed, capacity=ctx.capacity)
    algorithm = "construct+local+genetic" + ("+cpsat" if exact_shapes else "") + "+refine"
    return best_plan, {"algorithm": algorithm, "evaluations": evaluations, "exact": exact_shapes,
                       "history": history, "pinned": {"stages": options.stages, "replicas": options.replicas},
                       "simulated": simulated, "finalists": finalists, "clock_cut": list(budget.clock_cut),
                       "simulation_wall_s": round(simulation_wall_s, 3), "work_used_s": budget.spent_s, **sync_record}


def _sync_reserve_s(training, lead: Candidate) -> float:
    """Work (seconds at the simulator's rate) to simulate a plan of ``lead``'s shape with each sync
    algorithm but one: what ``sync: auto`` keeps of the finalists' share for the best plan."""
    R, S = lead.assign.shape
    others = len(syncs_for(training, R)) - 1 if R > 1 else 0
    return others * simulation_s(S, R, sum(lead.micro_batches))


def _start_candidate(ctx, x0: Plan | None) -> Candidate | None:
    """``x0`` as a candidate scored by the estimate (None without one; an ``InputError`` when it
    does not fit these inputs)."""
    if x0 is None:
        return None
    validate_plan(x0, ctx.groups.topology, ctx.model, ctx.training)
    assign = np.array([[ctx.topology.index(d) for d in row] for row in x0.assignment])
    counts = tuple(int(c) for c in np.diff(x0.layer_bounds))
    score = score_split(ctx, assign, counts, tuple(x0.micro_batches), x0.micro_batch_size, Schedule(x0.schedule))
    if score is None:
        raise InputError("the starting plan does not fit in memory on these devices", field="x0")
    return Candidate(assign=assign, layer_counts=counts, micro_batches=tuple(x0.micro_batches),
                     micro_batch_size=x0.micro_batch_size, schedule=Schedule(x0.schedule), score_s=score)


def _shape(c: Candidate) -> tuple:
    return c.assign.shape, c.micro_batch_size, c.schedule


_EXACT_MIN_S = 0.05  # CP-SAT is not started with less time than this left in its share


def _solve_exactly(ctx, hint: Candidate, work_limit: float, seconds: float) -> tuple:
    """(record, best candidate) of CP-SAT on ``hint``'s shape within ``work_limit`` units of
    deterministic time and ``seconds`` of wall time (half for completing the hint, half for the
    solve); (None, None) when its sync groups are too many to enumerate."""
    R, S = hint.assign.shape
    if not model_is_small_enough(ctx.topology.size, S, R) or hint.schedule == Schedule.ZERO_BUBBLE:
        return None, None  # the CP-SAT model knows GPipe's and 1F1B's timing, not split backwards
    result = exact_placement(ctx, S, R, hint.micro_batch_size, hint.schedule, hint=hint, work_limit=work_limit,
                             time_limit_s=seconds / 2)
    # The model times each stage's sync as a ring all-reduce over all replicas: with other
    # algorithms, or with the sync groups asked for, its candidate is still scored by the estimate,
    # but its optimum and bound are the whole ring's, no proof.
    ring_only = R == 1 or (syncs_for(ctx.training, R) == (Sync.RING,) and not charges_groups(ctx.training, R))
    status = result.status if ring_only else f"{result.status} for a ring sync (candidate scored with the plan's)"
    # Under ``warmup_depth: auto`` the model times 1F1B at depth 1 (the costs' fixed depth): its
    # optimum and bound are depth 1's, which a deeper warm-up of the shape may beat.
    depth_one = ctx.training.warmup_depth == "auto" and hint.schedule == Schedule.ONE_F_ONE_B and S > 1
    status += " at warm-up depth 1 (candidate scored at its deepest)" if depth_one else ""
    return {"stages": S, "replicas": R, "micro_batch_size": hint.micro_batch_size, "schedule": hint.schedule,
            "status": status, "estimate_s": _finite(result.objective_s),
            "bound_s": _finite(result.bound_s) if ring_only and not depth_one else None,
            "wall_s": round(result.wall_s, 3)}, result.candidate


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
