"""The plan: which device runs which (replica, stage), the layer split, the batch split, the
schedule, and the prediction; one ``validate_plan`` (the file format is ``planner.plan.document``)."""

import functools
from dataclasses import dataclass, field, replace
from enum import StrEnum

from planner.errors import InputError
from planner.inputs.model import SCHEDULES
from cost_models.schedule import DEEPENED_SCHEDULES, interleaving_problem, warmup_depth_problem
from planner.plan.dims import Compression, Degrees, Schedule, Sync
from planner.plan.precision import plan_precision_problem
from planner.plan.recompute import RELAXED_ORDER, mode_of, recompute_table_problem
from planner.plan.sync import sync_problem
from planner.plan.sync_groups import sync_groups_problem
from planner.plan.tensor import tensor_degree_problem

__all__ = ["Plan", "Prediction", "CostModel", "validate_plan", "interleave_plan", "chunk_sizes"]


class CostModel(StrEnum):
    """Which cost model timed a plan: the event simulator, or the search's estimate where the time
    limit left no room to simulate it (``planner.search.deadline``)."""

    SIMULATOR = "simulator"
    ESTIMATE = "estimate"

@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the cost model predicts for a plan (seconds, bytes, FLOP/s)."""

    iteration_s: float
    breakdown_s: dict
    tokens_per_s: float
    achieved_flops: float
    mfu: float
    memory_bytes: dict  # device name -> predicted peak bytes
    capacity_bytes: dict  # device name -> device memory
    cost_model: CostModel = CostModel.SIMULATOR

    @property
    def fits(self) -> bool:
        return all(self.memory_bytes[d] <= self.capacity_bytes[d] for d in self.memory_bytes)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """``assignment[r][s]`` names the device of replica r, stage s; stage s holds layers
    ``[layer_bounds[s], layer_bounds[s+1])``; replica r runs ``micro_batches[r]`` micro-batches of
    ``micro_batch_size`` sequences; ``ring_orders[s]`` orders stage s's replicas in its all-reduce ring.
    A cell whose device leads one of ``tensor_groups`` runs on that group (``planner.plan.tensor``).
    With ``virtual_stages`` v > 1 (interleaved 1F1B, ``cost_models.schedule``) ``layer_bounds`` splits
    the model into ``S * v`` pieces and chunk c of stage s holds piece ``c * S + s`` (``chunk_layers``)."""

    layer_bounds: tuple
    assignment: tuple
    micro_batches: tuple
    micro_batch_size: int
    schedule: Schedule
    ring_orders: tuple = ()
    sync: Sync = Sync.RING
    # With a parameter-server sync, stage s's server is replica ``sync_servers[s]`` (empty otherwise).
    sync_servers: tuple = ()
    topology_name: str = ""
    topology_sha256: str = ""
    idle: tuple = ()
    prediction: Prediction | None = None
    search: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)  # path, sha256, measured_at_utc (and tensor_block_issue_s
    # per device type, where it measured one) of the calibration used
    # Tensor groups of more than one device, each lead first; the lead names the group in ``assignment``.
    tensor_groups: tuple = ()
    # Iterations between data-parallel syncs (local steps, ``TrainingSpec.sync_every``; 1: every one).
    sync_every: int = 1
    # With local steps, replicas partitioned into sync groups (replica indices): gradients all-reduced
    # every iteration inside a group, deltas averaged across groups every ``sync_every``
    # (``planner.plan.sync_groups``); (): every replica alone.
    sync_groups: tuple = ()
    # Micro-batches per accumulation round (``TrainingSpec.micro_batches_per_round``; 0: one round).
    micro_batches_per_round: int = 0
    # What goes compressed on the wire (``TrainingSpec.compress_messages`` etc.; lossy).
    compression: Compression = Compression()
    # Model chunks per device (interleaved 1F1B; 1: each stage holds one contiguous range of layers).
    virtual_stages: int = 1
    # 1F1B's warm-up forwards per stage downstream (``cost_models.schedule.one_f_one_b_warmup``; 1:
    # PipeDream-Flush).
    warmup_depth: int = 1
    # Activation recomputation per worker, shaped as ``assignment``: "none", "selective" or "full"
    # (``planner.plan.recompute``); (): every worker in the training's mode.
    recompute: tuple = ()

    @property
    def stages(self) -> int:
        return (len(self.layer_bounds) - 1) // max(self.virtual_stages, 1)

    def chunk_layers(self, stage: int) -> list:
        """``[first, end)`` of each of ``stage``'s chunks, chunk 0 first (one range when v = 1)."""
        S = self.stages
        return [(self.layer_bounds[c * S + stage], self.layer_bounds[c * S + stage + 1])
                for c in range(self.virtual_stages)]

    @property
    def stage_bounds(self) -> tuple:
        """Bounds of a contiguous split with each stage's layer count (``layer_bounds`` when v = 1): what
        the per-stage cost and memory models read. Stage 0 holds the embedding and stage S - 1 the
        head in both, since piece 0 is chunk 0 of stage 0 and the last piece chunk v - 1 of stage S - 1."""
        counts = [sum(end - first for first, end in self.chunk_layers(s)) for s in range(self.stages)]
        bounds = [self.layer_bounds[0]]
        for count in counts:
            bounds.append(bounds[-1] + count)
        return tuple(bounds)

    @property
    def replicas(self) -> int:
        return len(self.assignment)

    @property
    def degrees(self) -> Degrees:
        return Degrees(pipeline=self.stages, data=self.replicas,
                       tensor=max((len(g) for g in self.tensor_groups), default=1))

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * sum(self.micro_batches)

    @property
    def used_devices(self) -> list:
        """Every device the plan runs on, tensor groups' members included."""
        return [m for row in self.assignment for d in row for m in self.members(d)]

    @functools.cached_property
    def _groups_by_lead(self) -> dict:
        return {group[0]: tuple(group) for group in reversed(self.tensor_groups)}  # the first of a lead wins

    def members(self, lead: str) -> tuple:
        """The devices of the cell ``lead`` names: its tensor group, or the device alone."""
        return self._groups_by_lead.get(lead, (lead,))

    def tensor_degree(self, replica: int, stage: int) -> int:
        return len(self.members(self.assignment[replica][stage]))

    @property
    def stage_tensor_degrees(self) -> tuple:
        """Each stage's largest tensor degree over its replicas (the runtime runs one per stage)."""
        return tuple(max(self.tensor_degree(r, s) for r in range(self.replicas)) for s in range(self.stages))

    def stage_devices(self, stage: int) -> list:
        return [self.assignment[r][stage] for r in range(self.replicas)]

    def ring(self, stage: int) -> list:
        order = self.ring_orders[stage] if self.ring_orders else range(self.replicas)
        return [self.assignment[r][stage] for r in order]

    def server(self, stage: int) -> str | None:
        """The device serving ``stage``'s gradients with a parameter-server sync (None otherwise)."""
        return self.assignment[self.sync_servers[stage]][stage] if self.sync_servers else None

    def with_prediction(self, prediction: Prediction) -> "Plan":
        return replace(self, prediction=prediction)


def chunk_sizes(layers: int, chunks: int) -> tuple:
    """A stage's ``layers`` blocks in ``chunks`` near-even chunks, the larger first (chunk 0 first):
    how ``interleave_plan`` splits a stage, and what the search's memory check counts."""
    whole, rest = divmod(int(layers), chunks)
    return tuple(whole + (c < rest) for c in range(chunks))


def interleave_plan(plan: Plan, virtual_stages: int) -> Plan:
    """``plan`` (one chunk per device) with each stage's layers split into ``virtual_stages`` chunks of
    near-even size (the larger first), chunk c of stage s the model's piece ``c * S + s``; each
    stage keeps its layer count. The prediction is dropped (predict again)."""
    S, v = plan.stages, virtual_stages
    if plan.virtual_stages != 1:
        raise ValueError("the plan is interleaved already")
    sizes = [chunk_sizes(plan.layer_bounds[s + 1] - plan.layer_bounds[s], v) for s in range(S)]
    bounds = [plan.layer_bounds[0]]
    for piece in range(S * v):
        c, s = divmod(piece, S)
        bounds.append(bounds[-1] + sizes[s][c])
    return replace(plan, layer_bounds=tuple(bounds), virtual_stages=v, warmup_depth=1, prediction=None)


def validate_plan(plan: Plan, topology, model, training) -> None:
    """Check every invariant of ``plan`` against its inputs; raise ``InputError`` naming the broken one.

    Each device at most once and known to the topology; tensor groups of one host and one type, of a
    degree that divides the heads and the MLP width; stages contiguous and covering all layers;
    micro-batch counts positive and adding up to the global batch; ring orders permutations; the
    topology hash matching; and, where the plan carries a prediction, memory fitting on every device.
    """
    S, R = plan.stages, plan.replicas
    bounds = list(plan.layer_bounds)
    if S < 1 or bounds[0] != 0 or bounds[-1] != model.layers:
        raise InputError(f"stages must cover layers 0..{model.layers}, got bounds {bounds}", field="stages")
    if any(b >= c for b, c in zip(bounds, bounds[1:])):
        what = "chunk" if plan.virtual_stages > 1 else "stage"
        raise InputError(f"every {what} needs at least one layer, in order; got bounds {bounds}", field="stages")
    _check_virtual_stages(plan, model, training)
    _check_warmup_depth(plan, training)
    if R < 1 or any(len(row) != S for row in plan.assignment):
        raise InputError(f"every replica needs exactly {S} devices, one per stage", field="replicas")
    leads = [d for row in plan.assignment for d in row]
    for k, group in enumerate(plan.tensor_groups):
        for name in group:
            if not topology.has_device(name):
                raise InputError(f"device {name!r} is not in topology {topology.name}", field=f"tensor_groups[{k}]")
        if group[0] not in leads:
            raise InputError(f"its lead {group[0]} runs no stage: list the group with its lead in a replica's "
                             "devices, or drop it", field=f"tensor_groups[{k}]")
        problem = tensor_degree_problem(topology, model, group)
        if problem:
            raise InputError(problem, field=f"tensor_groups[{k}]")
    used = plan.used_devices
    for name in used:
        if not topology.has_device(name):
            raise InputError(f"device {name!r} is not in topology {topology.name}", field="replicas")
    if len(set(used)) != len(used):
        twice = sorted({d for d in used if used.count(d) > 1})
        raise InputError(f"device {twice[0]} is used more than once", field="replicas")
    _check_recompute(plan, training)
    problem = plan_precision_problem(topology, used, training.precision)
    if problem:
        raise InputError(problem, field="training.precision")
    if len(plan.micro_batches) != R or any(m < 1 for m in plan.micro_batches):
        raise InputError("every replica needs a positive micro-batch count", field="replicas.micro_batches")
    if plan.micro_batch_size < 1 or plan.global_batch != training.global_batch:
        raise InputError(f"micro-batches x size = {plan.global_batch} sequences, but the global batch is "
                         f"{training.global_batch}", field="micro_batch_size")
    if plan.schedule not in SCHEDULES:
        raise InputError(f"schedule {plan.schedule!r} is not one of {', '.join(SCHEDULES)}", field="schedule")
    if plan.ring_orders and (len(plan.ring_orders) != S or
                             any(sorted(order) != list(range(R)) for order in plan.ring_orders)):
        raise InputError("each stage's ring must list each of its replicas once", field="stages.ring")
    problem = sync_problem(plan, training)
    if problem:
        raise InputError(problem[1], field=problem[0])
    if plan.sync_every != getattr(training, "sync_every", 1):
        raise InputError(f"is {plan.sync_every} but training.sync_every is {training.sync_every}: make both agree "
                         "or plan again", field="sync_every")
    problem = sync_groups_problem(plan.sync_groups, R, plan.sync_every, plan.sync, training.shard_optimizer)
    if problem:
        raise InputError(problem, field="sync_groups")
    if plan.micro_batches_per_round != getattr(training, "micro_batches_per_round", 0):
        raise InputError(f"is {plan.micro_batches_per_round} but training.micro_batches_per_round is "
                         f"{training.micro_batches_per_round}: make both agree or plan again",
                         field="micro_batches_per_round")
    for name, key, value in (("messages", "compress_messages", plan.compression.messages),
                             ("gradients", "compress_gradients", plan.compression.gradients)):
        asked = getattr(training, key, "off")
        if asked != value:
            fix = "plan again (the search resolves auto)" if asked == "auto" else "make both agree or plan again"
            raise InputError(f"is {value} but training.{key} is {asked}: {fix}", field=f"compression.{name}")
    boundaries = plan.compression.boundaries
    if boundaries is not None and (plan.compression.messages == "off" or any(b >= S - 1 for b in boundaries)):
        raise InputError(f"lists {list(boundaries)}, but the plan has {S - 1} stage boundaries (0 to {S - 2}) with "
                         f"messages {plan.compression.messages}: list boundaries of int8 messages only, or drop it",
                         field="compression.boundaries")
    if plan.compression.gradients != "off" and plan.compression.rank != training.powersgd_rank:
        raise InputError(f"is {plan.compression.rank} but training.powersgd_rank is {training.powersgd_rank}: make "
                         "both agree or plan again", field="compression.rank")
    if plan.topology_sha256 and plan.topology_sha256 != topology.sha256:
        raise InputError("the plan was made for another topology (hash differs): plan again", field="topology.sha256")
    if plan.prediction is not None and not plan.prediction.fits:
        worst = max(plan.prediction.memory_bytes,
                    key=lambda d: plan.prediction.memory_bytes[d] / plan.prediction.capacity_bytes[d])
        raise InputError(f"device {worst} needs {plan.prediction.memory_bytes[worst] / 1e9:.2f} GB of "
                         f"{plan.prediction.capacity_bytes[worst] / 1e9:.2f} GB", field="memory")


def _check_recompute(plan: Plan, training) -> None:
    """One known mode per worker, none heavier than the training's (a resolved training names the
    heaviest mode the plan's workers run; ``auto`` allows any)."""
    problem = recompute_table_problem(plan)
    if problem:
        raise InputError(problem, field="replicas.recompute")
    if not plan.recompute or training.recompute == "auto":
        return
    most = RELAXED_ORDER.index(mode_of(training.recompute))
    for r, row in enumerate(plan.recompute):
        for s, mode in enumerate(row):
            if RELAXED_ORDER.index(mode_of(mode)) > most:
                asked = str(training.recompute).lower()  # as the YAML spells it
                raise InputError(f"stage {s} runs {mode} recomputation, more than training.recompute {asked} "
                                 "allows: make both agree or plan again",
                                 field=f"replicas[{r}].recompute")


def _check_warmup_depth(plan: Plan, training) -> None:
    """A warm-up depth that the training asks for and the plan's schedule runs
    (``cost_models.schedule.warmup_depth_problem``)."""
    k, asked = plan.warmup_depth, getattr(training, "warmup_depth", 1)
    if k != asked and asked != "auto" and plan.schedule in DEEPENED_SCHEDULES and plan.virtual_stages == 1:
        raise InputError(f"is {k} but training.warmup_depth is {asked}: make both agree or plan again",
                         field="warmup_depth")
    problem = warmup_depth_problem(plan.schedule, k, plan.virtual_stages)
    if problem:
        raise InputError(problem, field="warmup_depth")


def _check_virtual_stages(plan: Plan, model, training) -> None:
    """Interleaved 1F1B's limits (``cost_models.schedule.interleaving_problem``), and the plan
    dimensions it does not combine with."""
    v = plan.virtual_stages
    if v != getattr(training, "virtual_stages", 1) and getattr(training, "virtual_stages", 1) != "auto":
        raise InputError(f"is {v} but training.virtual_stages is {training.virtual_stages}: make both agree or plan "
                         "again", field="virtual_stages")
    if v == 1:
        return
    if len(plan.layer_bounds) - 1 != plan.stages * v or model.layers < plan.stages * v:
        raise InputError(f"{v} chunks on each of {plan.stages} stages need {plan.stages * v} pieces of at least one "
                         f"layer each ({model.layers} layers): give each stage {v} chunks or fewer virtual stages",
                         field="virtual_stages")
    problem = interleaving_problem(plan.schedule, plan.stages, plan.micro_batches, plan.micro_batches_per_round, v)
    if problem:
        raise InputError(problem, field="virtual_stages")
    if plan.tensor_groups:
        raise InputError(f"is {v} with tensor groups, which interleaved 1F1B does not run: drop the tensor groups "
                         "or set virtual_stages 1", field="virtual_stages")
    if plan.compression.messages != "off":
        raise InputError(f"is {v} with int8 messages, which interleaved 1F1B does not send: set compression.messages "
                         "off or virtual_stages 1", field="virtual_stages")
