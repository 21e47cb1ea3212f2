"""Answers a user can act on: why each idle device is idle and which constraint binds in the plan,
each computed by re-evaluating the plan with one thing changed, never guessed.

Idle devices (grouped by type and region, one representative re-evaluated per group):
- memory: the smallest stage it could hold (one layer, one micro-batch of the smallest size, the
  optimizer state sharded as far as the plan allows) does not fit in it;
- otherwise the device is added to the plan in the ways that keep the rest of it (as an extra stage
  of a one-replica plan, or with other idle devices as an extra replica; in place of a used device
  of another type where neither is possible), the best by the estimate is simulated, and both plans
  are simulated again on a free network (no latency, unlimited bandwidth, no shared NICs): when the
  device would help on a free network, the reason is the slow link, and the difference between the
  network and the free one is its communication cost; when not, its compute share is too small.

What binds (the plan as it is, changed in one place and simulated again, or estimated again):
- memory: the fullest device, and the estimate with twice its memory;
- the slowest link the plan uses (a pipeline hop or a ring hop), and the time with 10x its bandwidth;
- the schedule: a one-chunk 1F1B plan of two stages or more simulated again under ZB-H1 (which
  ``schedule: auto`` runs only where a calibration measured every device's split backward:
  ``planner.search.zero_bubble``);
- the bubble and the gradient sync: their share of the critical device's timeline.

A deadline (``time.perf_counter()`` value) caps the work: a simulation starts only while the time
left holds one as long as the search's longest (``simulation_wall_s`` of its record) and as long as
its size predicts (``planner.search.deadline.simulation_units``), one that runs past the deadline is
stopped, and groups and links left are reported as not re-evaluated, so the report ends within its time.
"""

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from cost_models.links import LevelMatrix
from planner.inputs.catalog import AUTO, runs
from planner.inputs.units import format_bytes
from cost_models.schedule import AUTO_WARMUP_DEPTHS, DEEPENED_SCHEDULES, Schedule, stage_ops
from cost_models.simulator import SimulationCut
from planner.plan.plan import CostModel
from planner.report.text import held_text
from planner.prediction.predict import predict
from planner.search.deadline import plan_simulation_s
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.no_plan import stage_memory_floor
from planner.search.plans import candidate_to_plan
from planner.search.zero_bubble import measured_schedules

__all__ = ["IdleReason", "Binding", "idle_reasons", "binding_constraints", "render_why", "LINK_FACTOR"]

LINK_FACTOR = 10.0  # "what would 10x this link's bandwidth buy"
ALONE_MOVES = 0.01  # a link that alone moves the iteration less than this: the links near it are tried together
NEAR_SLOWEST = 1.1  # those within 10% of the slowest the plan uses
MEMORY_FACTOR = 2.0
MAX_GROUPS = 8  # idle groups re-evaluated (each costs two simulations)
SMALL_SHARE = 0.5  # an idle device below this share of the fastest used device's speed: its compute share is small
FREE_BANDWIDTH = 1e18  # bytes/s of a "free" link
MEMORY_SHOWN = 0.9  # a device at least this full is reported as binding


@dataclass(frozen=True, kw_only=True)
class IdleReason:
    devices: tuple  # the group's device names
    kind: str  # "memory", "slow link", "compute share too small", "shape", "price", "would help", "not evaluated"
    text: str
    delta_s: float = float("nan")  # predicted change of the iteration with the device used
    link_cost_s: float = float("nan")  # of which communication (with the device's links made free)


@dataclass(frozen=True, kw_only=True)
class Binding:
    kind: str  # "memory", "link", "schedule", "bubble", "gradient sync"
    text: str
    change: float = float("nan")  # relative change of the iteration from the one change (negative: faster)


def _gbit(bandwidth_bytes_per_s: float) -> str:
    return f"{bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s"


def _assign(plan, topology) -> np.ndarray:
    return np.array([[topology.index(name) for name in row] for row in plan.assignment])


def _comparable(topology, training):
    """The training to re-evaluate in: the plan's, or ``auto`` precision where some device lacks the
    plan's format (bf16 on a V100 or T4), so that such a device is weighed at the 16-bit format it
    has (the same speed as bf16 on the devices that have both)."""
    if all(runs(d.peak_flops, training.precision) for d in topology.devices):
        return training
    return replace(training, precision=AUTO)


def _groups(plan, topology) -> list:
    groups = {}
    for name in plan.idle:
        device = topology.devices[topology.index(name)]
        groups.setdefault((device.type_name, device.region), []).append(name)
    return list(groups.values())


def _uses_of(device: int, assign: np.ndarray, idle: list, ctx, plan, topology) -> list:
    """Placements that add ``device`` to the plan and keep the rest: as an extra stage (one
    replica), or with the fastest other idle devices as an extra replica; where neither is
    possible, in place of each used device of another type."""
    R, S = assign.shape
    uses = []
    if R == 1 and S < ctx.model.layers:
        uses += [np.insert(assign, k, device, axis=1) for k in range(S + 1)]
    others = sorted((i for i in idle if i != device), key=lambda i: -ctx.speed[i])[:S - 1]
    if len(others) == S - 1 and ctx.training.global_batch // plan.micro_batch_size > R:
        uses.append(np.vstack([assign, [device] + others]))
    if not uses:
        kind = topology.devices[device].type_name
        for r in range(R):
            for s in range(S):
                if topology.devices[assign[r, s]].type_name != kind:
                    swapped = assign.copy()
                    swapped[r, s] = device
                    uses.append(swapped)
    return uses


def _free_network(topology):
    """The topology on a free network: no latency, unlimited bandwidth, no shared NICs."""
    free = dict(host=topology.host_ids, region=np.zeros(topology.size, dtype=np.int64))
    return replace(topology, latency_s=LevelMatrix(**free, host_value=0.0, table=np.zeros((1, 1))),
                   bandwidth_bytes_per_s=LevelMatrix(**free, host_value=FREE_BANDWIDTH,
                                                     table=np.full((1, 1), FREE_BANDWIDTH), diagonal=np.inf),
                   nic_bytes_per_s={}, message_overhead_s=0.0)


def _slowest_link_from(device: int, used: np.ndarray, topology) -> str:
    bandwidth = topology.network.bandwidth_bytes_per_s
    other = min(used.tolist(), key=lambda u: min(bandwidth[device, u], bandwidth[u, device]))
    peer = topology.devices[other]
    return (f"{_gbit(min(bandwidth[device, other], bandwidth[other, device]))} to {peer.name} "
            f"(region {peer.region})")


def _time_for_simulation(plan, deadline: float, ops: float = 1.0) -> bool:
    """Whether one simulation of ``plan`` (as long as the search's longest, and as its size
    predicts; ``ops`` times that for a variant with that many times its ops) ends before ``deadline``."""
    return time.perf_counter() + ops * max(plan.search.get("simulation_wall_s", 0.0),
                                           plan_simulation_s(plan)) <= deadline


def _seconds(value: float) -> str:
    """An iteration time in seconds to four significant digits (a 10 ms plan keeps its change)."""
    return f"{value:.4g}"


def idle_reasons(plan, topology, model, training, *, dollars=None, deadline: float = math.inf,
                 pinned: tuple = (None, None)) -> list:
    """Why each idle device is idle (``IdleReason`` per group of one type and region).

    ``dollars``: for a plan chosen by price, a function of a predicted plan to its US dollars per
    iteration; a device that would make the plan faster but dearer is idle for its price.
    ``pinned``: the (stages, replicas) the user pinned (None: free), which leave other shapes out."""
    if not plan.idle:
        return []
    training = _comparable(topology, training)
    ctx = make_context(topology, model, training)
    assign = _assign(plan, topology)
    idle = [topology.index(name) for name in plan.idle]
    floor = stage_memory_floor(model, training, 1, model.layers, max(plan.replicas, 1))
    base = plan.prediction.iteration_s
    # a plan left at the search's estimate has no simulated time to compare simulations with
    late = plan.prediction.cost_model != CostModel.SIMULATOR or not _time_for_simulation(plan, deadline)
    if not late:
        free_network = _free_network(topology)
        try:
            base_free = predict(plan, free_network, model, training, deadline=deadline)[0].iteration_s
        except SimulationCut:
            late = True
    reasons = []
    for k, names in enumerate(_groups(plan, topology)):
        device = topology.index(names[0])
        usable = float(ctx.capacity[device])
        if floor > usable:
            reasons.append(IdleReason(devices=tuple(names), kind="memory", text=(
                f"memory: the smallest stage (1 layer, micro-batch 1) needs {format_bytes(floor)}, it has "
                f"{format_bytes(usable)} usable")))
            continue
        late = late or not _time_for_simulation(plan, deadline)
        if k >= MAX_GROUPS or late:
            why = (f"only the first {MAX_GROUPS} groups are" if k >= MAX_GROUPS else
                   "the report's time ran out: a longer --time-limit gives it more")
            reasons.append(IdleReason(devices=tuple(names), kind="not evaluated", text=f"not re-evaluated ({why})"))
            continue
        uses = _uses_of(device, assign, idle, ctx, plan, topology)
        scored = [c for c in (evaluate_placement(ctx, a, plan.micro_batch_size, plan.schedule) for a in uses)
                  if c is not None]
        if not scored:
            R, S = assign.shape
            if uses:
                ways = "as a stage or a replica more" if R == 1 else "as a replica more"
                text = f"memory: added to this {S}-stage plan ({ways}) no split fits in its {format_bytes(usable)} usable"
            else:
                text = (f"no room: a replica more of this {S}-stage plan needs {S - 1} idle devices and "
                        f"{len(idle) - 1} others are idle")
            reasons.append(IdleReason(devices=tuple(names), kind="memory" if uses else "no room", text=text))
            continue
        best = min(scored, key=lambda c: c.score_s)
        used_plan = candidate_to_plan(ctx, best)
        try:
            used = predict(used_plan, topology, model, training, deadline=deadline)[0]
            free = predict(used_plan, free_network, model, training, deadline=deadline)[0].iteration_s
        except SimulationCut:
            late = True
            reasons.append(IdleReason(devices=tuple(names), kind="not evaluated", text=(
                "not re-evaluated (the report's time ran out: a longer --time-limit gives it more)")))
            continue
        with_it = used.iteration_s
        R, S = best.assign.shape
        how = (f"added as a {S}-stage pipeline" if S > plan.stages else
               f"added with a replica more ({S} stages x {R} replicas)" if R > plan.replicas else
               "used in place of a device")
        pins = [f"--{name} {value}" for name, value, now in (("stages", pinned[0], S), ("replicas", pinned[1], R))
                if value is not None and value != now]
        delta, link_cost = with_it - base, with_it - free
        price = dollars(used_plan.with_prediction(used)) if dollars else 0
        if dollars and with_it < base and price > dollars(plan):
            kind = "price"
            text = (f"price: {how}, the iteration takes {with_it:.3f} s ({delta:+.3f} s) but costs ${price:.4g} "
                    f"instead of ${dollars(plan):.4g}")
        elif with_it < base:
            kind = "would help"
            text = (f"would help: {how}, the iteration takes {with_it:.3f} s ({delta:+.3f} s): "
                    + (f"{' and '.join(pins)} left this shape out; drop the pin to let the search try it" if pins else
                       "the search's budget missed it; plan again with a larger --budget (or --time-limit)"))
        elif free < base_free:
            kind = "slow link"
            text = (f"slow link: {how}, the iteration takes {with_it:.3f} s ({delta:+.3f} s), of which "
                    f"{link_cost:.3f} s is communication; its slowest link is "
                    f"{_slowest_link_from(device, best.assign.ravel(), topology)}; on a free network it would cut "
                    f"{base_free - free:.3f} s")
        else:
            share = ctx.speed[device] / ctx.speed[assign.ravel()].max()
            if share < SMALL_SHARE:
                kind = "compute share too small"
                text = (f"compute share too small: {how}, the iteration takes {with_it:.3f} s ({delta:+.3f} s), and "
                        f"{free - base_free:+.3f} s even on a free network (it computes at {100 * share:.0f}% of the "
                        "fastest used device)")
            else:  # fast enough: what it would take part in costs more than its compute gives
                kind = "shape"
                cost = ("a stage more lengthens the pipeline's fill and drain" if S > plan.stages else
                        "a replica more takes a share of the batch and a place in the sync" if R > plan.replicas
                        else "the layers and micro-batches it would take")
                text = (f"the shape it joins costs more than it computes: {how}, the iteration takes {with_it:.3f} s "
                        f"({delta:+.3f} s), and {free - base_free:+.3f} s even on a free network, though it computes "
                        f"at {100 * share:.0f}% of the fastest used device ({cost})")
        reasons.append(IdleReason(devices=tuple(names), kind=kind, text=text, delta_s=delta, link_cost_s=link_cost))
    return reasons


def _plan_links(plan, topology) -> list:
    """The directed (a, b) device pairs the plan sends over: pipeline hops and ring hops."""
    assign = _assign(plan, topology)
    links = set()
    for row in assign:
        for s in range(len(row) - 1):
            links |= {(int(row[s]), int(row[s + 1])), (int(row[s + 1]), int(row[s]))}
    for s in range(plan.stages):
        ring = [topology.index(name) for name in plan.ring(s)]
        if len(ring) > 1:
            links |= {(a, b) for a, b in zip(ring, ring[1:] + ring[:1])}
    return sorted(links)


def _faster_links(topology, pairs, factor: float):
    """The topology with each link a <-> b of ``pairs`` ``factor`` times faster (and their hosts'
    NICs, if shared)."""
    bandwidth = topology.bandwidth_bytes_per_s.copy()
    hosts = set()
    for a, b in pairs:
        bandwidth[a, b] *= factor
        bandwidth[b, a] *= factor
        hosts |= {topology.devices[a].host, topology.devices[b].host}
    nics = {h: (tuple(x * factor for x in nic) if h in hosts else nic) for h, nic in topology.nic_bytes_per_s.items()}
    return replace(topology, bandwidth_bytes_per_s=bandwidth, nic_bytes_per_s=nics)


def _where(topology, a: int, b: int) -> str:
    """Where the link a -> b runs: in a host, in a region, or between two regions."""
    da, db = topology.devices[a], topology.devices[b]
    if da.host == db.host:
        return "host " + da.host
    return "region " + da.region if da.region == db.region else da.region + " -> " + db.region


def _near_slowest_text(plan, topology, model, training, slowest: list, base: float, deadline: float) -> str:
    """Where no link alone moves the iteration by ``ALONE_MOVES``: what the plan's links within
    ``NEAR_SLOWEST`` of the slowest, ``LINK_FACTOR`` times faster together, would buy ("" where there
    is one such link or no time to simulate it)."""
    bandwidth = topology.network.bandwidth_bytes_per_s
    near = [(a, b) for a, b in slowest if bandwidth[a, b] <= NEAR_SLOWEST * bandwidth[slowest[0]]]
    pairs = sorted({(min(a, b), max(a, b)) for a, b in near})
    if len(pairs) < 2 or not _time_for_simulation(plan, deadline):
        return ""
    try:
        together = predict(plan, _faster_links(topology, pairs, LINK_FACTOR), model, training,
                           deadline=deadline)[0].iteration_s
    except SimulationCut:
        return ""
    change = (together - base) / base
    places = sorted({_where(topology, a, b) for a, b in near})
    shown = ", ".join(places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
    return (f"; alone it moves little, but the plan's {len(pairs)} links within {100 * (NEAR_SLOWEST - 1):.0f}% of "
            f"it ({shown}), each {LINK_FACTOR:g}x faster, would {'cut' if change < 0 else 'change'} the iteration "
            f"{100 * abs(change):.1f}% ({_seconds(base)} -> {_seconds(together)} s)")


def binding_constraints(plan, topology, model, training, *, deadline: float = math.inf) -> list:
    """What limits ``plan``: memory on which device, which link, the bubble (``Binding`` each)."""
    p = plan.prediction
    base = p.iteration_s
    training = _comparable(topology, training)
    out = []
    fullest = max(p.memory_bytes, key=lambda d: p.memory_bytes[d] / p.capacity_bytes[d])
    use = p.memory_bytes[fullest] / p.capacity_bytes[fullest]
    if use >= MEMORY_SHOWN:
        ctx = make_context(topology, model, training)
        assign = _assign(plan, topology)
        now = evaluate_placement(ctx, assign, plan.micro_batch_size, plan.schedule)
        capacity = ctx.capacity.copy()
        capacity[topology.index(fullest)] *= MEMORY_FACTOR
        # the context's memos (costs, rings, routes) do not depend on memory: the copy shares them
        more = evaluate_placement(replace(ctx, capacity=capacity), assign, plan.micro_batch_size, plan.schedule)
        change = (more.score_s - now.score_s) / now.score_s if now is not None and more is not None else float("nan")
        effect = (f"with {MEMORY_FACTOR:g}x its memory the estimate changes {100 * change:+.1f}%"
                  if np.isfinite(change) else "")
        out.append(Binding(kind="memory", change=change, text=(
            f"memory: {fullest} holds {format_bytes(p.memory_bytes[fullest])} of {format_bytes(p.capacity_bytes[fullest])} "
            f"({100 * use:.0f}%)" + (f"; {effect}" if effect else ""))))
    simulated = p.cost_model == CostModel.SIMULATOR  # else the time limit left the plan at the search's estimate
    links = _plan_links(plan, topology) if simulated else []
    if not simulated:
        out.append(Binding(kind="link", text="link: not re-evaluated (the plan's time is the search's estimate, "
                                             "not a simulation to compare with)"))
    if links:
        bandwidth = topology.network.bandwidth_bytes_per_s
        slowest = sorted(links, key=lambda ab: (bandwidth[ab], ab))
        tried, best = set(), None
        for a, b in slowest:
            pair = (min(a, b), max(a, b))
            if pair in tried or len(tried) >= 3 or bandwidth[a, b] > 1.01 * bandwidth[slowest[0]]:
                continue
            if not _time_for_simulation(plan, deadline):
                break
            tried.add(pair)
            try:
                faster = predict(plan, _faster_links(topology, [(a, b)], LINK_FACTOR), model, training,
                                 deadline=deadline)[0].iteration_s
            except SimulationCut:
                break
            if best is None or faster < best[0]:
                best = (faster, a, b)
    if links and best is None:
        out.append(Binding(kind="link", text="link: not re-evaluated (the report's time ran out: a longer "
                                             "--time-limit gives it more)"))
    elif links:
        faster, a, b = best
        da, db = topology.devices[a], topology.devices[b]
        change = (faster - base) / base
        together = _near_slowest_text(plan, topology, model, training, slowest, base, deadline) \
            if abs(change) < ALONE_MOVES else ""
        out.append(Binding(kind="link", change=change, text=(
            f"link: the slowest the plan uses is {da.name} -> {db.name} ({_gbit(bandwidth[a, b])}, "
            f"{_where(topology, a, b)}); a {_gbit(bandwidth[a, b] * LINK_FACTOR)} link there would "
            f"{'cut' if change < 0 else 'change'} the iteration {100 * abs(change):.1f}% "
            f"({_seconds(base)} -> {_seconds(faster)} s)" + together)))
    if not simulated:  # no timeline
        out.append(Binding(kind="bubble", text="bubble and gradient sync: not simulated (the plan's time is the "
                                               "search's estimate)"))
        return out
    out += _zero_bubble_binding(plan, topology, model, training, deadline)
    out += _warmup_binding(plan, topology, model, training, deadline)
    for key, kind in (("bubble_s", "bubble"), ("gradient_sync_s", "gradient sync")):
        share = p.breakdown_s.get(key, 0.0) / base
        out.append(Binding(kind=kind, change=share, text=f"{kind}: {100 * share:.1f}% of the critical device's "
                                                         "iteration" + (f" ({plan.stages} stage(s), "
                                                                        f"{max(plan.micro_batches)} micro-batches on the "
                                                                        "busiest replica)" if kind == "bubble" else "")))
    return out


def _ops_ratio(plan, schedule) -> float:
    """How many times ``plan``'s ops under ``schedule`` its own schedule's are (``stage_ops`` of its
    busiest replica): a simulation's time goes with its ops."""
    count = lambda kind: sum(len(stage_ops(kind, s, plan.stages, max(plan.micro_batches), plan.micro_batches_per_round))
                             for s in range(plan.stages))
    return count(schedule) / count(plan.schedule)


def _zero_bubble_binding(plan, topology, model, training, deadline: float) -> list:
    """[Binding] of ``plan`` run under ZB-H1 instead (the same placement and splits), where it runs
    one-chunk 1F1B over two stages or more (else []); where no simulation of it fits in the time
    left, a line that says so."""
    if plan.schedule != Schedule.ONE_F_ONE_B or plan.stages < 2 or plan.virtual_stages > 1:
        return []
    late = [Binding(kind="schedule", text="schedule: ZB-H1 not re-evaluated (the report's time ran out: a longer "
                                          "--time-limit gives it more)")]
    if not _time_for_simulation(plan, deadline, _ops_ratio(plan, Schedule.ZERO_BUBBLE)):
        return late
    try:
        split = predict(replace(plan, schedule=Schedule.ZERO_BUBBLE, prediction=None), topology, model,
                        training, deadline=deadline)[0]
    except SimulationCut:
        return late
    base = plan.prediction.iteration_s
    asked = "--schedule zb-h1, its backward split" + (
        "" if Schedule.ZERO_BUBBLE in measured_schedules(training, topology).schedules else
        ", which schedule: auto runs only where a calibration measured every device's split backward")
    if not split.fits:
        fullest = max(split.memory_bytes, key=lambda d: split.memory_bytes[d] / split.capacity_bytes[d])
        return [Binding(kind="schedule", text=(
            f"schedule: under ZB-H1 ({asked}) the same plan would not fit ({fullest} would need "
            f"{format_bytes(split.memory_bytes[fullest])} of {format_bytes(split.capacity_bytes[fullest])})"))]
    change = (split.iteration_s - base) / base
    return [Binding(kind="schedule", change=change, text=(
        f"schedule: under ZB-H1 ({asked}) the same plan would {'cut' if change < 0 else 'lengthen'} the "
        f"iteration {100 * abs(change):.1f}% ({_seconds(base)} -> {_seconds(split.iteration_s)} s)"))]


WARMUP_WORTH_SHARE = 0.02  # pipeline transfers and bubble, of the iteration, for which deeper warm-ups are tried


def _warmup_binding(plan, topology, model, training, deadline: float) -> list:
    """[Binding] of ``plan`` at deeper 1F1B or ZB-H1 warm-ups (``cost_models.schedule.stage_ops``), the
    same placement and splits, where it runs one chunk over two stages or more and its pipeline
    transfers and bubble take ``WARMUP_WORTH_SHARE`` of the iteration or more: the depths of
    ``AUTO_WARMUP_DEPTHS`` above its own, shallowest first, until one fails to cut the time or to fit
    (else []); where the time ran out before the first, a line that says so."""
    p = plan.prediction
    exposed = p.breakdown_s.get("pipeline_transfer_s", 0.0) + p.breakdown_s.get("bubble_s", 0.0)
    if (plan.schedule not in DEEPENED_SCHEDULES or plan.stages < 2 or plan.virtual_stages > 1
            or exposed < WARMUP_WORTH_SHARE * p.iteration_s):
        return []
    base, best, overflow = p.iteration_s, None, None
    for k in (k for k in AUTO_WARMUP_DEPTHS if k > plan.warmup_depth):
        if not _time_for_simulation(plan, deadline):
            break
        try:
            deeper = predict(replace(plan, warmup_depth=k, prediction=None), topology, model, training,
                             deadline=deadline)[0]
        except SimulationCut:
            break
        if not deeper.fits:
            overflow = (k, max(deeper.memory_bytes, key=lambda d: deeper.memory_bytes[d] / deeper.capacity_bytes[d]))
            break
        if deeper.iteration_s >= (best[1] if best else base) * (1 - 1e-9):
            break
        best = (k, deeper.iteration_s)
    if best is None and overflow is None:
        return [Binding(kind="warm-up", text=f"warm-up: deeper {plan.schedule} warm-ups not re-evaluated (the report's "
                                             "time ran out: a longer --time-limit gives it more)")] \
            if not _time_for_simulation(plan, deadline) else []
    if best is None:
        k, device = overflow
        return [Binding(kind="warm-up", text=f"warm-up: at depth {k} the same plan would not fit ({device})")]
    k, seconds = best
    change = (seconds - base) / base
    return [Binding(kind="warm-up", change=change, text=(
        f"warm-up: at depth {k} (--warmup-depth {k}, or auto to search it; stage s runs {k} (S - s - 1) warm-up "
        f"forwards{held_text(plan.schedule, k)}) the same plan would cut the iteration {100 * abs(change):.1f}% ({_seconds(base)} -> "
        f"{_seconds(seconds)} s)" + (f"; depth {overflow[0]} would not fit on {overflow[1]}" if overflow else "")))]


def render_why(plan, topology, model, training, *, dollars=None, budget_s: float = math.inf,
               pinned: tuple = (None, None)) -> str:
    """The report's 'why idle' and 'what binds' lines (``dollars``, ``pinned``: as ``idle_reasons``),
    in about ``budget_s`` seconds (the binding constraints get a third of it)."""
    started = time.perf_counter()
    lines = []
    reasons = idle_reasons(plan, topology, model, training, dollars=dollars, deadline=started + budget_s * 2 / 3,
                           pinned=pinned)
    if reasons:
        lines.append("Why idle (each group's first device put to use and simulated):")
        for reason in reasons:
            names = ", ".join(reason.devices[:4]) + (f" and {len(reason.devices) - 4} more" if len(reason.devices) > 4
                                                      else "")
            lines.append(f"  {names}: {reason.text}")
    lines.append("What binds (one change at a time, simulated again):")
    lines += [f"  {b.text}" for b in binding_constraints(plan, topology, model, training,
                                                         deadline=started + budget_s)]
    return "\n".join(lines)
