"""Human-readable rendering of a plan (what ``plan TOPOLOGY`` prints)."""

import math
from collections import Counter
from dataclasses import replace

import numpy as np

from cost_models.schedule import Schedule
from planner.inputs.units import format_bytes, format_flops, format_seconds
from planner.plan.plan import CostModel
from planner.plan.recompute import RELAXED_ORDER, RecomputeMode, plan_modes, uniform_modes
from planner.prediction.predict import communication_bytes, mode_costs, worker_memory_bytes
from planner.plan.sync_groups import outer_weights
from planner.plan.tensor import groups_of_plan
from planner.runtime.graphs import group_ungraphed
from planner.search.deadline import plan_simulation_s

__all__ = ["render_plan", "render_moves"]

# What an uncalibrated prediction is worth, from the GPU runs: 2x H100, GPT-3 XL, five plans
# (benchmarks/results/runtime_gpu.json, runtime_gpu_zero_bubble.json, runtime_gpu_tensor.json) and the
# same plans after ``plan calibrate`` (benchmarks/results/accuracy_gpu_zero_bubble.json); 4x H100,
# seven plans calibrated (benchmarks/results/accuracy_gpu4.json).
UNCALIBRATED_ERROR = ("uncalibrated predictions of GPT-3 XL on 2x H100 ran 12% below to 20% above the measured time, "
                      "calibrated ones within 1.3% there and 0.4-3.5% on 4x H100 (recomputation and tensor groups "
                      "up to 11% below): run 'plan calibrate' on the cluster")

# What a ZB-H1 prediction is worth, from the calibrated GPU runs (benchmarks/results/
# accuracy_gpu_h200x2_traced*.json, 2x H200; accuracy_gpu4_h200_whole.json, 4x H200, run before the
# split product's forward was traced into the block's graph).
ZERO_BUBBLE_ERROR = ("calibrated on 2x H200, the 2-stage GPT-3 XL plan was predicted within 2.2% (0.2918 and "
                     "0.2984 s on two hosts; 1F1B 0.3084 s) and one stage on a tensor group of 2 within 2.5%; "
                     "calibrated on 4x H200, 4 stages within 1.9% (0.3185 s; 1F1B 0.3383 s)")


def held_text(schedule: str, depth: int) -> str:
    """What a ZB-H1 stage at warm-up ``depth`` holds back (``cost_models.schedule.stage_ops``); empty
    under 1F1B."""
    return f" and holds {depth} s weight gradients back" if schedule == Schedule.ZERO_BUBBLE else ""


def _table(header: list, rows: list) -> list:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _idle_reason(plan, devices: int) -> str:
    """Why some devices are left out: the user's pinned degrees, or the search's choice."""
    pinned = (plan.search or {}).get("pinned") or {}
    used = len(plan.used_devices)
    if pinned.get("stages") and pinned.get("replicas"):
        return f"--stages {plan.stages} x --replicas {plan.replicas} pin {used} of {devices} devices"
    for flag, value in (("stages", plan.stages), ("replicas", plan.replicas)):
        if pinned.get(flag):
            return f"with --{flag} {value} pinned, using them would not speed up the iteration"
    objective = (plan.search or {}).get("objective")
    if objective == "cost":
        return "using them would not lower the dollars per iteration"
    if objective == "time-under-budget":
        return "using them would not speed up the iteration within the budget"
    return "using them would not speed up the iteration"


def _interleaving_lines(plan) -> list:
    """Where the search tried interleaved 1F1B (``planner.search.interleave``) or deeper 1F1B
    warm-ups (``planner.search.warmup``), the best simulated finalist of each chunk count or depth it
    tried; nothing for a dimension where it tried one value."""
    lines = []
    for key, label, symbol in (("virtual_stages", "Virtual stages", "v"), ("warmup_depth", "Warm-up depths", "k")):
        best = {}  # (value, the schedule where a variant ran another than its candidate's) -> seconds
        for finalist in plan.search.get("finalists", []):
            if finalist.get("fits"):
                value = (finalist.get(key, 1), finalist.get("schedule", "") if key == "warmup_depth" else "")
                best[value] = min(best.get(value, float("inf")), finalist["simulated_s"])
        if len({v for v, _ in best}) >= 2:
            lines.append(f"{label} tried (the best simulated finalist of each): "
                         + ", ".join(f"{symbol} = {v}{f' ({schedule})' if schedule else ''}: {seconds:.4g} s"
                                     for (v, schedule), seconds in sorted(best.items())))
    return lines


def _local_steps_lines(plan, training) -> list:
    """What local steps do to the training, said plainly (no claim of equal quality)."""
    if plan.sync_every <= 1:
        return []
    if plan.replicas == 1:
        return [f"Local steps: sync_every {plan.sync_every} changes nothing here (one replica, no data-parallel sync)."]
    return [f"Local steps (DiLoCo): each {'sync group' if plan.sync_groups else 'replica'} takes "
            f"{plan.sync_every} optimizer steps on its own, then the "
            f"replicas average their parameter deltas, each weighted by its share of the batch's tokens, and an "
            f"outer Nesterov step applies them (learning rate "
            f"{training.outer_learning_rate:g}, momentum {training.outer_momentum:g}).",
            *_sync_group_lines(plan),
            "  This changes the optimisation: the loss per step may differ from syncing every iteration; "
            "the planner predicts speed, not model quality."]


_GROUPS_SHOWN = 8
_DISAGREE = 0.01  # CP-SAT's estimate this far below the simulated plan is reported as a disagreement


def _sync_group_lines(plan) -> list:
    """Which replicas all-reduce gradients every iteration, over which devices (each stage's ring)."""
    tried = plan.search.get("sync_groups_tried")
    untried = plan.search.get("sync_groups_untried")
    chosen = (" (chosen by the search: fastest of " + ", ".join(f"{k} {v:.4g} s" for k, v in tried.items())
              + ("; " + ", ".join(untried) + " not simulated within the search's budget" if untried else "") + ")"
              if tried else "")
    if not plan.sync_groups:
        return [f"  Sync groups: none, every replica alone{chosen}."] if tried else []
    out = [f"  Sync groups ({len(plan.sync_groups)}): each all-reduces its gradients every iteration over its "
           f"replicas' devices (each stage's ring); their leads (replicas "
           f"{', '.join(str(g[0]) for g in plan.sync_groups)}) average the deltas every {plan.sync_every} "
           f"iterations and broadcast them to their groups{chosen}."]
    weights = outer_weights(plan.sync_groups, plan.micro_batches)
    for g, weight in list(zip(plan.sync_groups, weights))[:_GROUPS_SHOWN]:
        rings = "; ".join(f"stage {s}: " + " ".join(plan.assignment[r][s] for r in g) for s in range(plan.stages))
        out.append(f"    replicas {', '.join(str(r) for r in g)} (delta weight {weight:.3g}): {rings}")
    if len(plan.sync_groups) > _GROUPS_SHOWN:
        out.append(f"    ... and {len(plan.sync_groups) - _GROUPS_SHOWN} more groups")
    return out


def _compression_lines(plan) -> list:
    """What the plan compresses on the wire, said plainly: it is lossy (no claim of equal quality)."""
    c = plan.compression
    if not c.active:
        return []
    from cost_models.compression import BLOCK_VALUES

    parts = []
    if c.messages != "off":
        where = "" if c.boundaries is None else \
            " across boundaries " + ", ".join(f"{b}-{b + 1}" for b in c.boundaries) + " only"
        parts.append(f"messages between stages in int8 with a scale per {BLOCK_VALUES} values{where}")
    if c.gradients != "off":
        shards = ", each tensor member's shards apart" if plan.tensor_groups else ""
        parts.append(f"gradient sync by PowerSGD of rank {c.rank} (matrices{shards}; vectors whole)")
    return [f"Compression: {'; '.join(parts)}.",
            "  This changes the optimisation (lossy): the loss per step may differ from uncompressed training; "
            "the planner predicts speed, not model quality."]


def _timed_block_text(plan, topology) -> list:
    """Per tensor-group degree and device type of ``plan`` whose block the calibration timed: the
    time per block the prediction takes at the plan's micro-batch (``TensorGroups.placed``: a group
    that runs without graphs, on a later stage or under ZB-H1, by its received timings where they
    were taken apart)."""
    groups = groups_of_plan(topology, plan)
    assign = np.array([[groups.virtual.index(name) for name in row] for row in plan.assignment])
    zero_bubble = plan.schedule == Schedule.ZERO_BUBBLE
    timed = groups.placed(assign, plan.micro_batch_size, plan.virtual_stages, zero_bubble)[1]
    seen = {(groups.virtual.devices[k].type_name, len(groups.members[k]),
             group_ungraphed(s, plan.virtual_stages, zero_bubble)):
            float(timed[r, s]) for (r, s), k in np.ndenumerate(assign) if timed[r, s] > 0}
    return [f"; {kind} group of {t}{' run without graphs' if received else ''}: a block timed at "
            f"{1e3 * seconds:.3g} ms (micro-batch {plan.micro_batch_size})"
            for (kind, t, received), seconds in sorted(seen.items())]


def _recompute_lines(plan, training) -> list:
    """What the workers recompute (``planner.plan.recompute``), and what the search tried under ``auto``."""
    table = plan_modes(plan, training)
    counts = Counter(m for row in table for m in row)
    tried = plan.search.get("recompute_tried") if plan.search else None
    if len(counts) == 1 and not tried:
        return []
    what = (f"{next(iter(counts))} on every worker" if len(counts) == 1 else "per worker, the lightest under which "
            "it fits (" + ", ".join(f"{mode} on {counts[mode]}" for mode in RELAXED_ORDER if mode in counts) + ")")
    return [f"Recomputation: {what}" + (" (chosen by the search: " + ", ".join(f"{k} {v:.4g} s" for k, v in
                                                                              tried.items()) + ")" if tried else "")]


def _recompute_memory(plan, topology, model, training) -> tuple:
    """({device: its worker's recomputation}, {device: its predicted peak bytes without it}) where
    some worker recomputes; two empty dicts where none does."""
    table = plan_modes(plan, training)
    if all(m == RecomputeMode.NONE for row in table for m in row):
        return {}, {}
    none = str(RecomputeMode.NONE)
    costs = mode_costs(replace(plan, recompute=()), model, replace(training, recompute=False))
    plain, _ = worker_memory_bytes(plan, topology, costs, uniform_modes(none, plan.replicas, plan.stages))
    modes = {m: table[r][s] for r, row in enumerate(plan.assignment) for s, name in enumerate(row)
             for m in plan.members(name)}
    return modes, plain


def _cell(plan, name: str) -> str:
    """A (replica, stage) cell: its device, or its tensor group's lead and degree."""
    t = len(plan.members(name))
    return f"{name} x{t}" if t > 1 else name


def render_plan(plan, topology, model, training, *, result=None) -> str:
    p = plan.prediction
    S, R = plan.stages, plan.replicas
    in_flight = min(plan.warmup_depth * (S - 1) + 1, max(plan.micro_batches), plan.micro_batches_per_round or math.inf)
    out = [f"Plan for {topology.name}: {model.name} ({model.layers} layers, h {model.hidden}), "
           f"global batch {training.global_batch} x {model.sequence} tokens, {training.precision}",
           f"Degrees: {S} pipeline stage(s) x {R} data-parallel replica(s)"
           + (f" x tensor groups of up to {plan.degrees.tensor}" if plan.tensor_groups else "")
           + f" = {len(plan.used_devices)} of {topology.size} devices"
           + (f"; {len(plan.idle)} idle" if plan.idle else ""),
           f"Schedule: {plan.schedule}"
           + (f" interleaved over {plan.virtual_stages} virtual stages per device (Narayanan et al. 2021, sec. 2.2.2: "
              f"the bubble shrinks {plan.virtual_stages}x, {plan.virtual_stages}x the pipeline messages)"
              if plan.virtual_stages > 1 else "")
           + (f" with warm-up depth {plan.warmup_depth} (stage s runs {plan.warmup_depth} (S - s - 1) warm-up "
              f"forwards{held_text(plan.schedule, plan.warmup_depth)}: up to {in_flight} micro-batches in flight on "
              f"{'every stage' if plan.schedule == Schedule.ZERO_BUBBLE else 'stage 0'}, so that messages and the "
              "first backward's wait overlap compute)"
              if plan.warmup_depth > 1 else "")
           + (f" ({ZERO_BUBBLE_ERROR})" if plan.schedule == Schedule.ZERO_BUBBLE else "")
           + f", micro-batch size {plan.micro_batch_size}"
           + (f", in accumulation rounds of {plan.micro_batches_per_round} micro-batches (each its own fill and "
              f"drain)" if plan.micro_batches_per_round else "")
           + f", gradient sync: {plan.sync}"
           + (f" (servers: {', '.join(plan.server(s) for s in range(S))})" if plan.sync_servers else "")
           + (" (chosen by the search: fastest of " + ", ".join(f"{k} {v:.4g} s" for k, v in
                                                                  plan.search["sync_tried"].items())
              + ("; by the estimate over " + ", ".join(plan.search["sync_untried"]) + ", not simulated within "
                 "the search's budget" if plan.search.get("sync_untried") else "") + ")"
              if plan.search.get("sync_tried") else "")
           + (f" of parameter deltas every {plan.sync_every} iterations" if plan.sync_every > 1 else ""),
           *_local_steps_lines(plan, training),
           *_interleaving_lines(plan),
           *_compression_lines(plan),
           *_recompute_lines(plan, training),
           (f"Calibration: {plan.calibration['path']} (measured {plan.calibration['measured_at_utc']})"
            + "".join(f"; tensor-group block floor {name} {1e3 * floor_s:.3g} ms" for name, floor_s in
                      plan.calibration.get("tensor_block_issue_s", {}).items())
            + "".join(_timed_block_text(plan, topology))
            if plan.calibration else f"Calibration: none (the catalog's default efficiencies; {UNCALIBRATED_ERROR})"),
           ""]
    header = ["replica", "micro-batches"] + [f"stage {s} {_stage_layers(plan, s)}" for s in range(S)]
    cells = [[_cell(plan, name) for name in plan.assignment[r]] for r in range(R)]
    rows = [[r, plan.micro_batches[r]] + cells[r] for r in range(R)]
    if S > 8:
        header = ["replica", "micro-batches", "devices by stage"]
        rows = [[r, plan.micro_batches[r], " ".join(cells[r])] for r in range(R)]
        out.append("Stages (layers): " + ", ".join(f"{s}: {_stage_layers(plan, s)}" for s in range(S)))
    out += _table(header, rows)
    if plan.tensor_groups:
        out += ["", "Tensor groups (each splits its stage's blocks over its devices; named by the first):"]
        out += [f"  {g[0]}: {' '.join(g)}" for g in plan.tensor_groups]
    if plan.idle:
        out += ["", f"Idle devices ({_idle_reason(plan, topology.size)}): " + ", ".join(plan.idle)]
    if p is not None:
        out += ["", f"Predicted iteration time: {format_seconds(p.iteration_s)}"]
        total = p.iteration_s
        if p.cost_model == CostModel.ESTIMATE:
            out.append("  (the search's estimate: the time limit cut this plan's event simulation, which its size "
                       "predicts at " + f"{plan_simulation_s(plan):.1f} s; a longer --time-limit simulates it)")
        else:
            for key, label in (("compute_s", "compute"), ("pipeline_transfer_s", "pipeline transfers"),
                               ("bubble_s", "bubble"), ("gradient_sync_s", "gradient sync"),
                               ("optimizer_s", "optimizer step")):
                value = p.breakdown_s.get(key, 0.0)
                out.append(f"  {label:<20} {format_seconds(value):>12}  {100 * value / total:5.1f}%")
            out.append("  (along the critical device's timeline)")
        out.append(f"Throughput: {p.tokens_per_s:,.0f} tokens/s, {format_flops(p.achieved_flops)} achieved "
                   f"(MFU {100 * p.mfu:.1f}% of the used devices' peak)")
        sent = communication_bytes(plan, model, training)
        pipeline = sent["bytes_per_token"] - sent["data_parallel_bytes_per_token"]
        out.append(f"Communication: {format_bytes(sent['bytes_per_token'])} per token sent between workers "
                   f"(data-parallel sync {format_bytes(sent['data_parallel_bytes_per_token'])}"
                   + (f", averaged over its {plan.sync_every} iterations" if sent["sync_every"] > 1 else "")
                   + (f": {format_bytes(sent['within_groups_bytes_per_token'])} within groups, "
                      f"{format_bytes(sent['across_groups_bytes_per_token'])} across groups"
                      if "within_groups_bytes_per_token" in sent else "")
                   + f"; pipeline {format_bytes(pipeline)})")
        if result is not None:
            unit = (lambda usd: f"${usd:.4g}") if result.objective == "cost" else format_seconds  # dollars, or seconds
            on = "" if result.objective == "time" else f" on the {result.objective} objective " \
                f"({unit(result.objective_s)} for this plan)"
            pinned = (plan.search or {}).get("pinned") or {}
            if result.objective == "dtfm" and any(pinned.values()):  # the allocation engine's bound on those degrees
                on += " over the pinned " + " and ".join(f"{k} {v}" for k, v in pinned.items() if v)
            out.append(f"Lower bound{on}: {unit(result.lower_bound_s)}  gap {100 * result.gap:.1f}%  "
                       f"({result.evaluations} candidates in {result.wall_s:.2f} s)")
            cut = (plan.search or {}).get("clock_cut") or []
            if cut:  # the phases the clock ended before their work budget (the load may have changed the plan)
                out.append("Cut by the time limit: " + ", ".join(cut) + " (a longer --time-limit gives them their "
                           "work budget)")
            for shape in result.exact_shapes:
                found = ("no placement found in its time" if shape["status"].startswith("unknown") else "none fits"
                         if shape["estimate_s"] is None else f"estimate {format_seconds(shape['estimate_s'])}")
                out.append(f"CP-SAT, {shape['stages']} stages x {shape['replicas']} replicas, micro-batch "
                           f"{shape['micro_batch_size']}, {shape['schedule']}: {shape['status']}, {found} "
                           f"({shape['wall_s']:.2f} s)")
            # CP-SAT minimises time: only beside a plan chosen for time is its estimate comparable
            timed = result.objective == "time"
            below = [s["estimate_s"] for s in result.exact_shapes
                     if timed and s["estimate_s"] is not None and s["estimate_s"] < (1 - _DISAGREE) * p.iteration_s]
            if below:
                out.append(f"  (CP-SAT minimises the search's estimate, {format_seconds(min(below))} at best; the "
                           f"event simulator picked the plan above and predicts {format_seconds(p.iteration_s)} for "
                           "it: the two disagree here, and the simulator's time is the one to expect)")
        out += ["", "Memory (predicted peak / capacity):"]
        mem_rows = []
        degree = {m: len(g) for g in plan.tensor_groups for m in g}
        modes, plain = _recompute_memory(plan, topology, model, training)
        for name in sorted(p.memory_bytes, key=topology.index):
            used, cap = p.memory_bytes[name], p.capacity_bytes[name]
            mem_rows.append([name, topology.devices[topology.index(name)].type_name, format_bytes(used),
                             format_bytes(cap), f"{100 * used / cap:.0f}%"]
                            + ([degree.get(name, 1)] if plan.tensor_groups else [])
                            + ([modes[name], format_bytes(plain[name])] if modes else []))
        out += _table(["device", "type", "used", "capacity", "%"] + (["tensor"] if plan.tensor_groups else [])
                      + (["recompute", "without it"] if modes else []), mem_rows)
    return "\n".join(out)


def _pieces_text(pieces) -> str:
    """``embedding, blocks 0-11, head``: consecutive blocks as one range."""
    parts, run = [], []
    for piece in list(pieces) + [None]:
        if piece is not None and piece.startswith("block ") and (not run or int(piece.split()[1]) == run[-1] + 1):
            run.append(int(piece.split()[1]))
            continue
        if run:
            parts.append(f"block {run[0]}" if len(run) == 1 else f"blocks {run[0]}-{run[-1]}")
            run = []
        if piece is not None and piece.startswith("block "):
            run = [int(piece.split()[1])]
        elif piece is not None:
            parts.append(piece)
    return ", ".join(parts)


def render_moves(result, old_source: str) -> str:
    """The moves section of a re-plan (``planner.search.replan.ReplanResult``): what moves from
    where to where, bytes and seconds, and the options weighed."""
    moves = result.moves
    lost, added = ", ".join(result.lost) or "none", ", ".join(result.added) or "none"
    out = [f"Moves from {old_source}: lost {lost}; added {added}", f"  {result.why}"]
    if moves.moves:
        rows = [[m.receiver, m.source, _pieces_text(m.pieces), format_bytes(m.bytes),
                 format_seconds(m.seconds) if m.source != "checkpoint" else "not timed"] for m in moves.moves]
        out += ["  " + line for line in _table(["to", "from", "state (weights + optimizer state)", "bytes", "time"],
                                                rows)]
    out.append(f"  total {format_bytes(moves.bytes)} in {format_seconds(moves.seconds)} (receivers in parallel)"
               + (f"; {format_bytes(moves.checkpoint_bytes)} no surviving device holds, read from the last checkpoint"
                  if moves.checkpoint_bytes else ""))
    out.append(f"  objective: iteration + move / {result.move_weight:g} iterations (--move-weight) = "
               f"{format_seconds(result.score_s)}")
    rows = [[o.label, format_seconds(o.iteration_s) if o.problem == "" else "-",
             format_seconds(o.moves.seconds) if o.moves else "-",
             format_seconds(o.score_s) if o.problem == "" else o.problem] for o in result.options]
    out += ["", "Options weighed:"] + ["  " + line for line in _table(["option", "iteration", "move", "score"], rows)]
    return "\n".join(out)


def _stage_layers(plan, stage: int) -> str:
    """``[first, end)`` of the stage's layers, or of each of its chunks joined by ``+``."""
    return "+".join(f"[{first}, {end})" for first, end in plan.chunk_layers(stage))
