"""Re-planning for a changed cluster: keep devices where they are unless moving state pays.

A running plan's devices hold state: each device the weights and optimizer state of its stage's
pieces (the embedding, blocks ``i``, the final norm and head; the last stage's copy of a tied
embedding counts as the embedding). A new plan for the changed topology needs, on each device, the
pieces of its new stage that it did not hold: their weights and its share of their optimizer state
(``1 / optimizer_shards`` of it, ``planner.prediction.stage_model``); a device keeping a piece
receives only the growth of its share when its stage has fewer shards. Each piece comes from the
surviving old holder with the quickest transfer on the topology's network model
(``cost_models.network``: latency + bytes / bandwidth per message, bandwidth capped by shared NICs);
a piece held only split over a tensor group comes from all the group's members, equal shares each;
it comes from the last checkpoint when no whole holder and no complete group survives (not on the
network model: its bytes are counted and its time is not). Receivers take their pieces one after
another and in parallel with each other; the move lasts the slowest receiver's sum, or a shared
NIC's busy time if longer.

``MoveAwareTime`` scores a plan ``iteration_s + move_s / move_weight`` (``move_weight``: iterations
the move is paid back over). ``replan`` scores the old layout kept with the least change (a spare in
each lost device's place; a replica holding a lost device dropped; a lost device's stage merged into
its neighbour) and the search's plan for the new topology, started from the best kept layout
(``search(..., objective=MoveAwareTime, x0=...)``), and keeps the lowest score. Devices of the old
plan that the new topology lacks are lost; devices the old plan did not name are added.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from cost_models import flops, memory
from cost_models.network import Sync
from cost_models.schedule import AUTO_WARMUP_DEPTHS, DEEPENED_SCHEDULES
from planner.errors import InputError
from planner.inputs.units import format_bytes
from planner.plan.plan import Plan, validate_plan
from planner.plan.sync_groups import kept_groups
from planner.prediction.predict import predict
from planner.prediction.stage_model import head_outputs, optimizer_shards
from planner.search.bounds import lower_bound_s
from planner.search.sync_choice import plan_with_sync
from planner.search.zero_bubble import measured_schedules, runnable_start

__all__ = ["DEFAULT_MOVE_WEIGHT", "Move", "Moves", "MoveAwareTime", "ReplanResult", "state_pieces", "holdings",
           "held_bytes", "plan_moves", "replan", "read_old_plan", "topology_without", "changed_topology"]

DEFAULT_MOVE_WEIGHT = 1000.0  # iterations over which a move's seconds are weighed against iteration time
CHECKPOINT = "checkpoint"  # the source of a piece no surviving device holds
_SPARES_TRIED = 8  # spares tried for each lost device (the quickest to receive its state)
EMBEDDING, HEAD = "embedding", "head"


@dataclass(frozen=True)
class Move:
    """State sent to ``receiver`` from ``source`` (a device, or ``CHECKPOINT``)."""

    receiver: str
    source: str
    pieces: tuple  # piece names, in model order
    bytes: float
    seconds: float  # 0 from the checkpoint (not on the network model)


@dataclass(frozen=True)
class Moves:
    moves: tuple = ()
    seconds: float = 0.0  # the whole move, receivers in parallel
    checkpoint_bytes: float = 0.0  # bytes no surviving device holds, read from the last checkpoint

    @property
    def bytes(self) -> float:
        return float(sum(m.bytes for m in self.moves))

    @property
    def receivers(self) -> set:
        return {m.receiver for m in self.moves}

    @property
    def pieces(self) -> set:
        return {p for m in self.moves for p in m.pieces}


def _block(i: int) -> str:
    return f"block {i}"


def state_pieces(model, training) -> dict:
    """piece -> (weight bytes, optimizer state bytes of the whole piece): the working weights (2 B per
    parameter in 16-bit, 4 in fp32) and what ZeRO stage 1 would shard (``cost_models.memory``)."""
    v, h = flops.padded_vocabulary(model.vocabulary), model.hidden
    working = memory.state_bytes_per_parameter(training.precision, training.optimizer) \
        - memory.optimizer_state_bytes_per_parameter(training.precision, training.optimizer)
    weight, state = working / 2.0, memory.optimizer_state_bytes_per_parameter(training.precision, training.optimizer)
    counts = {EMBEDDING: flops.embedding_parameters(v, h, model.sequence, learned_positions=model.learned_positions),
              HEAD: flops.head_parameters(head_outputs(model)[0], h, tied=model.tied_embeddings, biases=model.biases)}
    block = flops.layer_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp, biases=model.biases)
    counts.update({_block(i): block for i in range(model.layers)})
    return {piece: (n * weight, n * state) for piece, n in counts.items()}


def _block_share(model, tensor: int) -> float:
    """The fraction of a block's parameters each member of a tensor group of ``tensor`` holds."""
    whole = flops.layer_parameters(model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp, biases=model.biases)
    split = flops.tensor_split_parameters(model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp,
                                          biases=model.biases)
    return (whole - split * (1.0 - 1.0 / tensor)) / whole


def _stage_pieces(plan: Plan, stage: int, model, tensor: int = 1) -> dict:
    """piece -> the fraction of it each device of stage ``stage`` holds (blocks split over a tensor
    group; the embeddings and the head whole on every member)."""
    block = _block_share(model, tensor)
    pieces = {_block(i): block for i in range(plan.layer_bounds[stage], plan.layer_bounds[stage + 1])}
    if stage == 0:
        pieces[EMBEDDING] = 1.0
    if stage == plan.stages - 1:
        pieces[HEAD] = 1.0
        if model.tied_embeddings:
            pieces[EMBEDDING] = 1.0  # the last stage's copy (or the same table when there is one stage)
    return pieces


def holdings(plan: Plan, model, training) -> dict:
    """device -> {piece: (fraction of its weights, fraction of its optimizer state)} that the device
    holds under ``plan``: a tensor group's member holds its share of each block, and of the state
    its share divided by the stage's optimizer shards."""
    shards = optimizer_shards(training, plan.replicas)
    held = {}
    for row in plan.assignment:
        for s, lead in enumerate(row):
            members = plan.members(lead)
            pieces = _stage_pieces(plan, s, model, len(members))
            for member in members:
                held[member] = {piece: (f, f / shards) for piece, f in pieces.items()}
    return held


def held_bytes(plan: Plan, model, training, held: dict | None = None) -> dict:
    """device -> bytes of state it holds under ``plan``: of each piece it holds, its fraction of the
    weights and its fraction of the optimizer state (``held``: the plan's ``holdings`` where the
    caller has them; ``state_pieces``)."""
    pieces = state_pieces(model, training)
    held = held if held is not None else holdings(plan, model, training)
    return {device: float(sum(pieces[p][0] * w + pieces[p][1] * s for p, (w, s) in mine.items()))
            for device, mine in held.items()}


def plan_moves(old: Plan, new: Plan, topology, model, training) -> Moves:
    """The state ``new``'s devices must receive to run on from ``old`` (see the module's description).

    A device receives, of each piece, the weights it will hold beyond those it holds, and likewise
    the optimizer state (a kept part is assumed to be the part it needs: the same tensor slice and
    shard where the degrees are unchanged)."""
    pieces = state_pieces(model, training)
    before, after = holdings(old, model, training), holdings(new, model, training)
    network = topology.network
    group_of = {m: old.members(lead) for row in old.assignment for lead in row for m in old.members(lead)}
    holders = {}  # piece -> [(device index, its weight fraction, its tensor group)]
    for device, held in before.items():
        if topology.has_device(device):
            for piece, (fraction, _) in held.items():
                holders.setdefault(piece, []).append((topology.index(device), fraction, group_of[device]))
    transfers = {}  # (receiver, source) -> [pieces, bytes]
    for device, need in after.items():
        had = before.get(device, {})
        receiver = topology.index(device)
        for piece in sorted(need, key=_order):
            weight, state = pieces[piece]
            (w_new, s_new), (w_old, s_old) = need[piece], had.get(piece, (0.0, 0.0))
            amount = weight * max(0.0, w_new - w_old) + state * max(0.0, s_new - s_old)
            if amount <= 1e-9 * (weight + state):
                continue
            senders = _senders(holders.get(piece, []), receiver, amount, network)
            for source, share in senders or [(CHECKPOINT, 1.0)]:
                name = source if source == CHECKPOINT else topology.names[source]
                entry = transfers.setdefault((device, name), [[], 0.0])
                entry[0].append(piece)
                entry[1] += amount * share
    moves, per_receiver, senders, receivers, sizes = [], {}, [], [], []
    for (device, source), (moved, amount) in sorted(transfers.items(), key=lambda kv: (topology.index(kv[0][0]),
                                                                                       kv[0][1])):
        seconds = 0.0
        if source != CHECKPOINT:
            a, b = topology.index(source), topology.index(device)
            seconds = float(network.transfer_s(a, b, amount))
            senders.append(a)
            receivers.append(b)
            sizes.append(amount)
        per_receiver[device] = per_receiver.get(device, 0.0) + seconds
        moves.append(Move(receiver=device, source=source, pieces=tuple(moved), bytes=float(amount), seconds=seconds))
    longest = max(per_receiver.values(), default=0.0)
    if senders:
        egress, ingress = network.nic_busy_s(senders, receivers, sizes)
        longest = max(longest, float(egress.max()), float(ingress.max()))
    return Moves(moves=tuple(moves), seconds=longest,
                 checkpoint_bytes=float(sum(m.bytes for m in moves if m.source == CHECKPOINT)))


def _senders(holders: list, receiver: int, amount: float, network) -> list:
    """[(device index, share of ``amount``)] that send a piece to ``receiver``: the quickest whole
    holder; else the tensor group (all of its members surviving) whose slowest member is quickest,
    each member sending an equal share; else none (the piece comes from the checkpoint)."""
    whole = [h for h, fraction, _ in holders if fraction >= 1.0 - 1e-9 and h != receiver]
    if whole:
        return [(min(whole, key=lambda h: float(network.transfer_s(h, receiver, amount))), 1.0)]
    groups = {}
    for h, _, group in holders:
        groups.setdefault(group, []).append(h)
    complete = [[h for h in members if h != receiver] for group, members in groups.items()
                if len(members) == len(group)]
    complete = [members for members in complete if members]
    if not complete:
        return []
    best = min(complete, key=lambda members: max(float(network.transfer_s(h, receiver, amount / len(members)))
                                                 for h in members))
    return [(h, 1.0 / len(best)) for h in best]


def _order(piece: str) -> tuple:
    if piece == EMBEDDING:
        return (0, 0)
    if piece == HEAD:
        return (2, 0)
    return (1, int(piece.split()[1]))


class MoveAwareTime:
    """``iteration_s + move_s / move_weight``: the simulator's iteration time plus the move from
    ``old`` to the plan, paid back over ``move_weight`` iterations (seconds)."""

    name = "replan"
    engine = "placement"
    unit = "s"

    def __init__(self, old: Plan, *, move_weight: float = DEFAULT_MOVE_WEIGHT):
        self.old, self.move_weight = old, move_weight

    def moves(self, plan, topology, model, training) -> Moves:
        return plan_moves(self.old, plan, topology, model, training)

    def score(self, plan, topology, model, training) -> float:
        prediction = plan.prediction or predict(plan, topology, model, training)[0]
        return float(prediction.iteration_s) + self.moves(plan, topology, model, training).seconds / self.move_weight

    def lower_bound(self, topology, model, training) -> float:
        return lower_bound_s(topology, model, training)  # a move takes 0 s or more


@dataclass(frozen=True)
class Option:
    """One plan ``replan`` weighed: how it was made, its iteration time, its move and its score."""

    label: str
    plan: Plan | None
    iteration_s: float
    moves: Moves | None
    score_s: float
    problem: str = ""  # why it cannot run (memory), where it cannot


@dataclass(frozen=True)
class ReplanResult:
    plan: Plan
    training: object
    moves: Moves
    score_s: float
    move_weight: float
    lost: tuple  # devices of the old plan missing from the new topology
    added: tuple  # devices of the new topology the old plan did not name
    chosen: str  # the label of the chosen option
    why: str  # why this plan, and why more state moves than the lost devices held where it does
    options: tuple = field(default_factory=tuple)
    search: object = None  # the search's result


def read_old_plan(path) -> tuple:
    """(plan, model, training) of the plan file ``path`` as it runs (``plan TOPOLOGY -o`` writes them)."""
    from planner.inputs.model import parse_model, parse_training
    from planner.plan.document import read_plan

    plan, document = read_plan(path)
    source = str(path)
    for key in ("model", "training"):
        if not isinstance(document.get(key), dict):
            raise InputError("is missing: re-plan from a plan written by 'plan TOPOLOGY -o FILE'", source=source,
                             field=key)
    try:
        model = parse_model(document["model"], where="model")
        training = parse_training(document["training"], where="training")
    except InputError as error:
        raise error.located(source=source) from None
    if training.recompute == "auto":
        raise InputError("is 'auto', which 'plan' decides: re-plan from the plan it wrote", source=source,
                         field="training.recompute")
    if plan.virtual_stages > 1:
        raise InputError(f"is {plan.virtual_stages}: a re-plan moves whole stages, not interleaved chunks; plan the new "
                         "devices afresh", source=source, field="virtual_stages")
    return plan, model, training


def topology_without(document: dict, lost) -> dict:
    """A topology document (as its file holds it) without the devices ``lost``: entries with a
    ``count`` are written out one device each (same names and hosts as the parser gives them), the
    devices' rows and columns leave a network matrix, and pairs naming them are dropped."""
    lost = set(lost)
    devices = []
    for entry in document.get("devices", []):
        count, per_host = entry.get("count", 1), entry.get("gpus_per_host", 0)
        base = entry.get("name") or entry.get("type")
        rest = {k: v for k, v in entry.items() if k not in ("count", "gpus_per_host", "name", "host")}
        for i in range(count):
            name = f"{base}-{i}" if count > 1 else base
            host = f"{entry.get('host') or base}-h{i // per_host}" if per_host else (entry.get("host") or name)
            devices.append({"name": name, **rest, "host": host})
    order = [d["name"] for d in devices]
    keep = [i for i, name in enumerate(order) if name not in lost]
    network = dict(document.get("network", {}))
    if isinstance(network.get("matrix"), dict):
        matrix = dict(network["matrix"])
        for key in ("latency", "bandwidth"):
            matrix[key] = [[matrix[key][i][j] for j in keep] for i in keep]
        network["matrix"] = matrix
    if "pairs" in network:
        network["pairs"] = [p for p in network["pairs"] if p.get("from") not in lost and p.get("to") not in lost]
    name = f"{document.get('name', 'topology')}-without-{'-'.join(sorted(lost))}"
    return {**document, "name": name, "devices": [devices[i] for i in keep], "network": network}


def changed_topology(document: dict, *, lost=(), added: dict | None = None, source: str = "--lost") -> dict:
    """The topology document ``document`` without the devices ``lost`` and with ``added``'s devices
    (a document with ``devices`` entries in the topology's format and, optionally, ``network.pairs``
    for their links). Names that are not devices of ``document`` are refused in one line, as are
    added devices on a network given as a matrix (a matrix has a row per device: name the links
    in ``pairs`` or describe the network by levels)."""
    names = [d["name"] for d in topology_without(document, ())["devices"]]
    unknown = [name for name in lost if name not in names]
    if unknown:
        raise InputError(f"names {', '.join(unknown)}, not a device of the topology ({len(names)} devices: "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}): name the lost devices as "
                         "the plan names them", field="--lost")
    changed = topology_without(document, lost)
    if not added:
        return changed
    entries = added.get("devices")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise InputError("needs a 'devices' list of device entries as a topology file writes them", source=source,
                         field="devices")
    network = dict(changed["network"])
    if "matrix" in network:
        raise InputError("the topology's network is a matrix, a row per device: give the added devices' links as "
                         "'network: pairs:' in this file or describe the topology's network by levels",
                         source=source, field="network")
    pairs = (added.get("network") or {}).get("pairs") or []
    if pairs:
        network["pairs"] = list(network.get("pairs") or []) + list(pairs)
    name = changed["name"] + "-with-" + "-".join(str(e.get("name") or e.get("type")) for e in entries)
    return {**changed, "name": name, "devices": changed["devices"] + list(entries), "network": network}


def _with_topology(plan: Plan, topology, **changes) -> Plan:
    """``plan`` with ``changes`` on ``topology``; a parameter server's or a hierarchical sync's route
    chosen again (``sync_choice.plan_with_sync``): dropped replicas or stages leave the old servers'
    replica indices pointing elsewhere or past the end. Every worker runs the training's
    recomputation (the heaviest any worker of the old plan ran, ``planner.plan.recompute``): the
    old per-worker modes belong to the old cells."""
    plan = replace(plan, topology_name=topology.name, topology_sha256=topology.sha256, prediction=None, search={},
                   recompute=(), **changes)
    used = set(plan.used_devices)
    plan = replace(plan, idle=tuple(d for d in topology.names if d not in used))
    if plan.sync in (Sync.PARAMETER_SERVER, Sync.HIERARCHICAL):
        plan = plan_with_sync(plan, topology, plan.sync)
    return plan


def _without_groups_of(plan: Plan, leads: set) -> tuple:
    return tuple(g for g in plan.tensor_groups if g[0] not in leads)


def _drop_rows(plan: Plan, rows: set) -> dict | None:
    """Changes that drop the replicas ``rows``: their micro-batches go to the others, fewest first."""
    keep = [r for r in range(plan.replicas) if r not in rows]
    if not keep:
        return None
    counts = [plan.micro_batches[r] for r in keep]
    for _ in range(sum(plan.micro_batches[r] for r in rows)):
        counts[int(np.argmin(counts))] += 1
    leaving = {d for r in rows for d in plan.assignment[r]}
    return dict(assignment=tuple(plan.assignment[r] for r in keep), micro_batches=tuple(counts), ring_orders=(),
                tensor_groups=_without_groups_of(plan, leaving), sync_groups=kept_groups(plan.sync_groups, keep))


def _merge_stage(plan: Plan, stage: int, into: int) -> dict | None:
    """Changes that give stage ``stage``'s layers to its neighbour ``into`` (in every replica); the
    devices of ``stage`` leave the plan."""
    if not 0 <= into < plan.stages or plan.stages < 2:
        return None
    bounds = list(plan.layer_bounds)
    del bounds[max(stage, into)]  # the boundary between the two
    assignment = tuple(tuple(d for s, d in enumerate(row) if s != stage) for row in plan.assignment)
    return dict(layer_bounds=tuple(bounds), assignment=assignment, ring_orders=(),
                tensor_groups=_without_groups_of(plan, set(plan.stage_devices(stage))))


def _substitute(plan: Plan, mapping: dict) -> dict:
    return dict(assignment=tuple(tuple(mapping.get(d, d) for d in row) for row in plan.assignment),
                tensor_groups=tuple(tuple(mapping.get(m, m) for m in g) for g in plan.tensor_groups))


class _Scorer:
    def __init__(self, old, topology, model, training, objective: MoveAwareTime):
        self.old, self.topology, self.model, self.training, self.objective = old, topology, model, training, objective

    def option(self, label: str, plan: Plan) -> Option:
        try:
            validate_plan(plan, self.topology, self.model, self.training)
        except InputError as error:
            return Option(label, None, float("inf"), None, float("inf"), error.detail)
        prediction = predict(plan, self.topology, self.model, self.training)[0]
        plan = plan.with_prediction(prediction)
        if not prediction.fits:
            used, capacity = prediction.memory_bytes, prediction.capacity_bytes
            worst = max(used, key=lambda d: used[d] / capacity[d])
            problem = (f"{worst} would need {format_bytes(prediction.memory_bytes[worst])} of its "
                       f"{format_bytes(prediction.capacity_bytes[worst])}")  # in the memory table's units
            return Option(label, plan, prediction.iteration_s, None, float("inf"), problem)
        if not np.isfinite(prediction.iteration_s):
            return Option(label, plan, prediction.iteration_s, None, float("inf"), "no finite iteration time")
        moves = self.objective.moves(plan, self.topology, self.model, self.training)
        score = prediction.iteration_s + moves.seconds / self.objective.move_weight
        return Option(label, plan, prediction.iteration_s, moves, score)


def _quickest_from(topology, senders: list, receiver: str) -> float:
    """Seconds of a 1 GB message to ``receiver`` from the quickest of ``senders`` (0 without any)."""
    j = topology.index(receiver)
    return min((float(topology.network.transfer_s(i, j, 1e9)) for i in senders), default=0.0)


def _kept_layouts(old: Plan, topology, lost: list, spares: list, scorer: _Scorer) -> list:
    """The old layout with the least change that runs without ``lost``: each as an ``Option``."""
    lost_used = [d for d in lost if d in set(old.used_devices)]
    if not lost_used:
        return [scorer.option("old layout, unchanged", _with_topology(old, topology))]
    where = {m: (r, s) for r, row in enumerate(old.assignment) for s, d in enumerate(row) for m in old.members(d)}
    options = []
    # A spare in each lost device's place: the spare quickest to receive the lost device's state
    # first; greedily, one lost device at a time.
    if len(spares) >= len(lost_used):
        mapping, free = {}, list(spares)
        for device in lost_used:
            r, s = where[device]
            peers = [topology.index(m) for row in old.assignment for m in old.members(row[s]) if m not in lost]
            best = None
            for spare in sorted(free, key=lambda name: _quickest_from(topology, peers, name))[:_SPARES_TRIED]:
                trial = scorer.option("", _with_topology(old, topology, **_substitute(old, {**mapping, device: spare})))
                if best is None or trial.score_s < best[0].score_s:
                    best = (trial, spare)
            mapping[device] = best[1]
            free.remove(best[1])
        names = ", ".join(f"{spare} for {device}" for device, spare in mapping.items())
        options.append(scorer.option(f"old layout with {names}",
                                     _with_topology(old, topology, **_substitute(old, mapping))))
    rows = {where[d][0] for d in lost_used if d in where}
    dropped = _drop_rows(old, rows)
    if dropped and all(d not in lost for row in dropped["assignment"] for d in row):
        options.append(scorer.option(f"old layout without replica(s) {', '.join(map(str, sorted(rows)))}",
                                     _with_topology(old, topology, **dropped)))
    stages = sorted({where[d][1] for d in lost_used if d in where})
    if len(stages) == 1:
        s = stages[0]
        for into in (s - 1, s + 1):
            merged = _merge_stage(old, s, into)
            if merged and all(d not in lost for row in merged["assignment"] for d in row):
                options.append(scorer.option(f"old layout with stage {s}'s layers on stage {into}'s devices",
                                             _with_topology(old, topology, **merged)))
    return options


def _depth_searched_again(old: Plan, training):
    """``training`` with ``warmup_depth: auto`` where ``old`` runs 1F1B at a depth the search may pick
    (``AUTO_WARMUP_DEPTHS``): a plan file writes the depth its search chose, and the changed cluster
    (more layers a stage, other links) may need another; the old layout's own depth stays allowed."""
    depth = training.warmup_depth
    if (old.schedule in DEEPENED_SCHEDULES and old.virtual_stages == 1 and depth != "auto" and depth > 1
            and depth in AUTO_WARMUP_DEPTHS):
        return replace(training, warmup_depth="auto")
    return training


def replan(old: Plan, topology, model, training, options, *, move_weight: float = DEFAULT_MOVE_WEIGHT, rng=None,
           callback=None) -> ReplanResult:
    """A plan for ``topology`` (the changed cluster) that ``old`` is running on: the lowest
    ``iteration_s + move_s / move_weight`` among the old layout kept with the least change and the
    search's plan, started from the best kept layout."""
    from planner.search.front import search

    if not (np.isfinite(move_weight) and move_weight > 0):
        raise InputError(f"must be a finite number of iterations above 0, got {move_weight}", field="--move-weight")
    named = [d for row in old.assignment for d in row] + [m for g in old.tensor_groups for m in g] + list(old.idle)
    lost = tuple(d for d in dict.fromkeys(named) if not topology.has_device(d))
    added = tuple(d for d in topology.names if d not in set(named))
    used = set(old.used_devices)
    spares = [d for d in topology.names if d not in used]
    training = _depth_searched_again(old, training)
    objective = MoveAwareTime(old, move_weight=move_weight)
    scorer = _Scorer(old, topology, model, training, objective)
    # the old plan's schedule as auto may run it here (ZB-H1 only where every split backward is measured)
    kept = _kept_layouts(runnable_start(old, measured_schedules(training, topology)), topology, list(lost), spares,
                         scorer)
    runnable = sorted((o for o in kept if np.isfinite(o.score_s)), key=lambda o: o.score_s)
    start = runnable[0].plan if runnable else None
    try:
        result = search(topology, model, training, options, objective=objective, x0=start, rng=rng, callback=callback)
    except InputError:
        if not runnable:
            raise  # nothing runs on the new topology: the search says why
        result, found = None, Option("the search's plan for the new topology", None, float("inf"), None,
                                     float("inf"), "the search found none")
    else:
        found = replace(scorer.option("the search's plan for the new topology", result.plan), plan=result.plan)
    choices = runnable + ([found] if np.isfinite(found.score_s) else [])
    best = min(choices, key=lambda o: (o.score_s, o.moves.bytes))
    why = _why(best, kept, found, lost, old, model, training, move_weight)
    if best is found:
        training = result.training
    record = {"from_topology": old.topology_name, "move_weight": move_weight, "move_s": best.moves.seconds,
              "move_bytes": best.moves.bytes, "checkpoint_bytes": best.moves.checkpoint_bytes,
              "objective_s": best.score_s, "chosen": best.label, "why": why, "lost": list(lost), "added": list(added),
              "moves": [{"to": m.receiver, "from": m.source, "pieces": list(m.pieces), "bytes": m.bytes,
                         "seconds": m.seconds} for m in best.moves.moves]}
    plan = replace(best.plan, search={**best.plan.search, "replan": record})
    return ReplanResult(plan=plan, training=training, moves=best.moves, score_s=best.score_s,
                        move_weight=move_weight, lost=lost, added=added, chosen=best.label, why=why,
                        options=tuple(kept) + (found,), search=result)


def _why(best: Option, kept: list, found: Option, lost: tuple, old: Plan, model, training, weight: float) -> str:
    before = holdings(old, model, training)
    held = held_bytes(old, model, training, before)
    lost_pieces = {piece for device in lost for piece in before.get(device, {})}
    lost_bytes = sum(held.get(device, 0.0) for device in lost)
    only_lost = best.moves.pieces <= lost_pieces and best.moves.bytes <= lost_bytes * (1 + 1e-9)
    if not best.moves.moves:
        what = "moves no state"
    elif only_lost:
        what = "moves only the state the lost device(s) held" if lost else "moves state within the plan's devices"
    else:
        what = "moves more state than the lost device(s) held"
    if best is not found:
        return f"{best.label}: {what}"
    runnable = [o for o in kept if np.isfinite(o.score_s)]
    if not runnable:
        problems = "; ".join(f"{o.label}: {o.problem}" for o in kept)
        return f"the old layout cannot run without {', '.join(lost)} ({problems}); the search's plan {what}"
    other = min(runnable, key=lambda o: o.score_s)
    return (f"the search's plan runs {best.iteration_s:.4g} s per iteration, {other.label} {other.iteration_s:.4g} s: "
            f"over {weight:g} iterations (--move-weight) {other.iteration_s - best.iteration_s:.3g} s faster repays "
            f"{best.moves.seconds - other.moves.seconds:.3g} s of moves more; it {what}")
