"""What is trained (``ModelSpec``) and how (``TrainingSpec``), read from YAML or a shipped preset."""

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from cost_models.compression import MAX_POWERSGD_RANK, GradientCompression, MessageCompression
from cost_models.network import Sync
from cost_models.schedule import AUTO_SCHEDULES, DEEPENED_SCHEDULES, Schedule
from planner.errors import InputError
from planner.fields import Fields
from planner.plan.sync import SYNC_CHOICES
from planner.plan.sync import _conflict as _sync_conflict
from planner.plan.sync_groups import SYNC_GROUPINGS

__all__ = ["ModelSpec", "TrainingSpec", "SCHEDULES", "HEADS", "MAX_GLOBAL_BATCH", "MAX_SYNC_EVERY", "MAX_VIRTUAL_STAGES", "MAX_WARMUP_DEPTH",
           "MODEL_LIMITS", "parse_model", "parse_training", "model_preset", "preset_names"]

SCHEDULES = tuple(s.value for s in Schedule)
HEADS = ("lm", "classification")
# Largest sizes planned (each search and simulation step stays bounded below them): 65,536 sequences is
# the largest published batch (LAMB's BERT pre-training); the model limits are well past today's models.
MAX_GLOBAL_BATCH = 2**16
MAX_SYNC_EVERY = 100_000  # local steps between syncs (DiLoCo's runs use up to 2,000)
MAX_VIRTUAL_STAGES = 16  # model chunks per device (Megatron-LM's runs interleave 2 to 8)
MAX_WARMUP_DEPTH = 64  # 1F1B warm-up forwards per stage downstream (the schema's maximum)
MODEL_LIMITS = {"layers": 4096, "hidden": 2**20, "heads": 2**16, "sequence": 2**22, "vocabulary": 2**22,
                "ffn_hidden": 2**22}
# "auto": bf16 where every used device has it, else fp16 (``planner.plan.precision``); 16-bit either way.
_PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "auto": 2}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT-style decoder: ``layers`` blocks of ``hidden`` width, ``heads`` heads, ``sequence`` tokens."""

    name: str
    layers: int
    hidden: int
    heads: int
    sequence: int
    vocabulary: int
    ffn_hidden: int = 0  # 0 means 4 * hidden
    gated_mlp: bool = False  # SwiGLU (LLaMA): three MLP matrices instead of two
    tied_embeddings: bool = True
    learned_positions: bool = True
    biases: bool = True
    # "lm": next-token logits at every position over the vocabulary; "classification": ``classes``
    # logits from the last position's hidden state (as GPT-2 sequence classification does).
    head: str = "lm"
    classes: int = 0

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "sequence", "vocabulary"):
            if getattr(self, name) < 1:
                raise InputError(f"must be at least 1, got {getattr(self, name)}", field=f"model.{name}")
        for name, most in MODEL_LIMITS.items():
            if getattr(self, name) > most:
                raise InputError(f"is {getattr(self, name):,}, above the {most:,} this planner handles: lower it",
                                 field=f"model.{name}")
        if self.hidden % self.heads:
            raise InputError(f"hidden {self.hidden} is not divisible by heads {self.heads}: "
                             "pick heads that divide it", field="model.heads")
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.head not in HEADS:
            raise InputError(f"{self.head!r} is not one of {', '.join(HEADS)}", field="model.head")
        if self.head == "classification":
            if self.classes < 2:
                raise InputError(f"a classification head needs classes >= 2, got {self.classes}: add classes: N",
                                 field="model.classes")
            if self.tied_embeddings:
                raise InputError("a classification head has no vocabulary rows to tie to the embedding: set "
                                 "tied_embeddings: false (or leave it out)", field="model.tied_embeddings")
        elif self.classes:
            raise InputError(f"classes {self.classes} is for a classification head: add head: classification or "
                             "drop classes", field="model.classes")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """The iteration: global batch in sequences, micro-batch size, precision, optimizer, schedule."""

    global_batch: int
    micro_batch_size: int = 0  # 0: the search picks it
    precision: str = "auto"
    optimizer: str = "adam"
    # True: full recomputation, "selective": the attention core only (``planner.plan.recompute``);
    # "auto": the search gives each worker the lightest that fits
    recompute: bool | str = False
    flash_attention: bool = False
    schedule: str = "auto"  # "auto": the search picks gpipe or 1f1b, and zb-h1 where its blocks were measured
    # ZeRO stage 1 over each stage's replicas: "auto" (and True) shard wherever a stage has two or
    # more replicas (same bytes on the wire as an all-reduce, less memory, a shorter step); False never.
    shard_optimizer: bool | str = "auto"
    # Local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105): each replica takes ``sync_every``
    # optimizer steps on its own, then the replicas average their parameter deltas and an outer
    # Nesterov step (``outer_learning_rate``, ``outer_momentum``; the paper's 0.7 and 0.9) applies them.
    # 1: every iteration's gradients are all-reduced, as without local steps. More than 1 changes the
    # optimisation (what is trained differs from the synchronous run).
    sync_every: int = 1
    # With sync_every > 1, which replicas all-reduce gradients every iteration as one DiLoCo worker
    # (``planner.plan.sync_groups``): replica (each alone), cluster (by regions), one, or "auto":
    # the fastest of these by the simulator.
    sync_groups: str = "auto"
    outer_learning_rate: float = 0.7
    outer_momentum: float = 0.9
    # Accumulation rounds: a replica's micro-batches run in rounds of this many, each its own pipeline
    # fill and drain (DTFM's runs: 64), keeping at most a round's activations; 0: one round of all.
    micro_batches_per_round: int = 0
    # Compression on the wire (``cost_models.compression``): messages between stages in block-wise
    # int8, the data-parallel sync by PowerSGD of rank ``powersgd_rank``; "auto": the search
    # compresses where the cost model says it is faster. Lossy: it changes the optimisation.
    compress_messages: str = "off"
    compress_gradients: str = "off"
    powersgd_rank: int = 4
    # The data-parallel gradient sync (``cost_models.network.Sync``): ring, hierarchical,
    # parameter-server, sharded, or "auto": the search picks the fastest for each plan.
    sync: str = "ring"
    # Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2): model chunks per device; 1: plain 1F1B;
    # "auto": the search chooses per plan among the values that can run (``planner.search.interleave``).
    virtual_stages: int | str = 1
    # 1F1B's warm-up forwards per stage downstream (``cost_models.schedule.one_f_one_b_warmup``): 1
    # is PipeDream-Flush; k > 1 keeps k - 1 more micro-batches in flight per stage downstream, so
    # messages over slow links overlap compute; "auto": the search chooses per 1F1B plan
    # (``planner.search.warmup``).
    warmup_depth: int | str = 1
    # Not an input: set by the search from the topology (``planner.search.zero_bubble.measured_schedules``)
    # where a calibration measured every device's split-backward block, so ``schedule: auto`` runs
    # ZB-H1 too; plan files leave it out (``planner.plan.document``).
    split_backward_measured: bool = False

    def __post_init__(self):
        if self.global_batch < 1:
            raise InputError("must be at least 1", field="training.global_batch")
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise InputError(f"is {self.global_batch:,} sequences, above the {MAX_GLOBAL_BATCH:,} this planner handles "
                             "(the largest published batches): lower it", field="training.global_batch")
        if self.micro_batch_size and self.global_batch % self.micro_batch_size:
            raise InputError(f"global_batch {self.global_batch} is not a multiple of micro_batch_size "
                             f"{self.micro_batch_size}: change either", field="training.micro_batch_size")
        if self.precision not in _PRECISION_BYTES:
            raise InputError(f"{self.precision!r} is not one of {', '.join(_PRECISION_BYTES)}", field="training.precision")
        if self.optimizer not in ("adam", "sgd"):
            raise InputError(f"{self.optimizer!r} is not one of adam, sgd", field="training.optimizer")
        if not (isinstance(self.recompute, bool) or self.recompute in ("selective", "auto")):
            raise InputError(f"{self.recompute!r} is not one of true, false, selective, auto",
                             field="training.recompute")
        if not (isinstance(self.shard_optimizer, bool) or self.shard_optimizer == "auto"):
            raise InputError(f"{self.shard_optimizer!r} is not one of true, false, auto", field="training.shard_optimizer")
        if self.schedule not in SCHEDULES + ("auto",):
            raise InputError(f"{self.schedule!r} is not one of {', '.join(SCHEDULES)}, auto", field="training.schedule")
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or not \
                1 <= self.sync_every <= MAX_SYNC_EVERY:
            raise InputError(f"{self.sync_every!r} is not a whole number from 1 to {MAX_SYNC_EVERY:,}",
                             field="training.sync_every")
        if self.sync_groups not in SYNC_GROUPINGS:
            raise InputError(f"{self.sync_groups!r} is not one of {', '.join(SYNC_GROUPINGS)}",
                             field="training.sync_groups")
        if self.sync_groups in ("cluster", "one") and self.sync_every == 1:
            raise InputError(f"is {self.sync_groups}, but sync_every is 1 (every replica syncs every iteration): set "
                             "sync_every above 1, or sync_groups auto", field="training.sync_groups")
        if self.sync_every > 1 and self.shard_optimizer is True:
            raise InputError(f"is true, but sync_every {self.sync_every} keeps each replica's whole optimizer state "
                             "between syncs: set shard_optimizer to auto or false", field="training.shard_optimizer")
        if isinstance(self.micro_batches_per_round, bool) or not isinstance(self.micro_batches_per_round, int) \
                or not 0 <= self.micro_batches_per_round <= MAX_GLOBAL_BATCH:
            raise InputError(f"{self.micro_batches_per_round!r} is not a whole number from 0 (one round) to "
                             f"{MAX_GLOBAL_BATCH:,}", field="training.micro_batches_per_round")
        for name, kind in (("compress_messages", MessageCompression), ("compress_gradients", GradientCompression)):
            if getattr(self, name) not in tuple(kind) + ("auto",):
                raise InputError(f"{getattr(self, name)!r} is not one of {', '.join(kind)}, auto",
                                 field=f"training.{name}")
        if isinstance(self.powersgd_rank, bool) or not isinstance(self.powersgd_rank, int) \
                or not 1 <= self.powersgd_rank <= MAX_POWERSGD_RANK:
            raise InputError(f"{self.powersgd_rank!r} is not a whole number from 1 to {MAX_POWERSGD_RANK}",
                             field="training.powersgd_rank")
        if self.compress_gradients != "off" and self.sync_every > 1:
            raise InputError(f"is {self.compress_gradients}, but sync_every {self.sync_every} syncs parameter deltas, "
                             "not gradients: set one of them off (compress_gradients off or sync_every 1)",
                             field="training.compress_gradients")
        if self.compress_gradients != "off" and self.shard_optimizer is True:
            raise InputError(f"is true, but compress_gradients {self.compress_gradients} all-reduces whole "
                             "(compressed) gradients: set shard_optimizer to auto or false",
                             field="training.shard_optimizer")
        if self.sync not in SYNC_CHOICES:
            raise InputError(f"{self.sync!r} is not one of {', '.join(SYNC_CHOICES)}", field="training.sync")
        if self.sync != "auto":
            conflict = _sync_conflict(Sync(self.sync), self, 2)
            if conflict:
                raise InputError(conflict[1], field="training.sync")
        if self.virtual_stages != "auto" and (isinstance(self.virtual_stages, bool)
                                               or not isinstance(self.virtual_stages, int)
                                               or not 1 <= self.virtual_stages <= MAX_VIRTUAL_STAGES):
            raise InputError(f"{self.virtual_stages!r} is not a whole number from 1 to {MAX_VIRTUAL_STAGES} or auto",
                             field="training.virtual_stages")
        if self.virtual_stages == "auto" and self.schedule not in (Schedule.ONE_F_ONE_B, "auto"):
            raise InputError(f"is auto, which chooses chunks for interleaved 1F1B, but the schedule is {self.schedule}: "
                             "set schedule 1f1b or auto, or virtual_stages 1", field="training.virtual_stages")
        if self.fixed_virtual_stages > 1 and self.schedule not in (Schedule.ONE_F_ONE_B, "auto"):
            raise InputError(f"is {self.virtual_stages}, which interleaves 1F1B, but the schedule is {self.schedule}: "
                             "set schedule 1f1b or virtual_stages 1", field="training.virtual_stages")
        if self.fixed_virtual_stages > 1 and self.compress_messages != "off":
            raise InputError(f"is {self.virtual_stages}, but interleaved 1F1B sends no int8 messages: set "
                             "compress_messages off or virtual_stages 1", field="training.virtual_stages")
        self._check_warmup_depth()
        if not 0.0 < self.outer_learning_rate <= 10.0:
            raise InputError(f"{self.outer_learning_rate!r} is not in (0, 10]", field="training.outer_learning_rate")
        if isinstance(self.outer_momentum, bool) or not isinstance(self.outer_momentum, (int, float)) \
                or not 0.0 <= self.outer_momentum < 1.0:
            raise InputError(f"{self.outer_momentum!r} is not in [0, 1)", field="training.outer_momentum")

    def _check_warmup_depth(self) -> None:
        k, field = self.warmup_depth, "training.warmup_depth"
        if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_WARMUP_DEPTH):
            raise InputError(f"{k!r} is not a whole number from 1 to {MAX_WARMUP_DEPTH} or auto", field=field)
        if k == 1:
            return
        if self.schedule not in ("auto", *DEEPENED_SCHEDULES):  # under auto: its 1F1B and ZB-H1 plans
            raise InputError(f"is {k}, which deepens the warm-up of 1F1B or ZB-H1, but the schedule is "
                             f"{self.schedule}: set schedule 1f1b, zb-h1 or auto, or warmup_depth 1", field=field)
        if k != "auto" and self.virtual_stages != 1:
            raise InputError(f"is {k}, but virtual_stages is {self.virtual_stages}: interleaved 1F1B has its own "
                             "warm-up; set virtual_stages 1 or warmup_depth 1", field=field)

    @property
    def fixed_warmup_depth(self) -> int:
        """``warmup_depth`` when it is a number, 1 when the search chooses it (auto)."""
        return 1 if self.warmup_depth == "auto" else self.warmup_depth

    @property
    def fixed_virtual_stages(self) -> int:
        """``virtual_stages`` when it is a number, 1 when the search chooses it (auto)."""
        return 1 if self.virtual_stages == "auto" else self.virtual_stages

    @property
    def schedules(self) -> tuple:
        """The schedules a plan may run: the one asked, or under ``auto`` 1F1B and GPipe
        (``AUTO_SCHEDULES``, 1F1B first), then ZB-H1 where its split backward was measured
        (``split_backward_measured``)."""
        if self.schedule != "auto":
            return (Schedule(self.schedule),)
        return AUTO_SCHEDULES + ((Schedule.ZERO_BUBBLE,) if self.split_backward_measured else ())

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element at the training precision."""
        return _PRECISION_BYTES[self.precision]


def parse_model(document, *, where: str = "model") -> ModelSpec:
    """A model mapping, or a preset name (optionally a mapping with ``preset:`` plus overrides)."""
    if isinstance(document, str):
        return model_preset(document)
    f = Fields(document, where)
    base = {}
    if f.has("preset"):
        preset = model_preset(f.str("preset"))
        base = {k: getattr(preset, k) for k in preset.__dataclass_fields__}
    need = (lambda key: base[key]) if base else (lambda key: f.raw(key))
    values = dict(
        name=f.str("name", base.get("name", "custom")),
        layers=f.int("layers", need("layers")),
        hidden=f.int("hidden", need("hidden")),
        heads=f.int("heads", need("heads")),
        sequence=f.int("sequence", need("sequence")),
        vocabulary=f.int("vocabulary", need("vocabulary")),
        ffn_hidden=f.int("ffn_hidden", base.get("ffn_hidden", 0), minimum=0),
        gated_mlp=f.bool("gated_mlp", base.get("gated_mlp", False)),
        head=f.str("head", base.get("head", "lm"), choices=HEADS),
        classes=f.int("classes", base.get("classes", 0), minimum=0),
        learned_positions=f.bool("learned_positions", base.get("learned_positions", True)),
        biases=f.bool("biases", base.get("biases", True)),
    )
    lm = values["head"] == "lm"  # a classification head has nothing to tie: untied unless the file says otherwise
    values["tied_embeddings"] = f.bool("tied_embeddings", base.get("tied_embeddings", True) if lm else False)
    f.raw("source", "")
    f.finish()
    return ModelSpec(**values)


def parse_training(document, *, where: str = "training") -> TrainingSpec:
    f = Fields(document, where)
    schedule = f.str("schedule", "auto", choices=SCHEDULES + ("auto",))
    micro = f.raw("micro_batch_size", 0)
    if micro == "auto":
        micro = 0
    elif isinstance(micro, bool) or not isinstance(micro, int) or micro < 0:
        raise InputError(f"expected a whole number or 'auto', got {micro!r}", field=f.path("micro_batch_size"))
    result = TrainingSpec(
        global_batch=f.int("global_batch"),
        micro_batch_size=micro,
        precision=f.str("precision", "auto", choices=tuple(_PRECISION_BYTES)),
        optimizer=f.str("optimizer", "adam", choices=("adam", "sgd")),
        recompute=f.raw("recompute", False),
        flash_attention=f.bool("flash_attention", False),
        schedule=schedule,
        shard_optimizer=f.raw("shard_optimizer", "auto"),
        sync_every=f.int("sync_every", 1),
        sync_groups=f.str("sync_groups", "auto", choices=SYNC_GROUPINGS),
        outer_learning_rate=f.float("outer_learning_rate", 0.7, high=10.0),
        outer_momentum=f.raw("outer_momentum", 0.9),
        micro_batches_per_round=f.raw("micro_batches_per_round", 0),
        compress_messages=_switch(f, "compress_messages", MessageCompression),
        compress_gradients=_switch(f, "compress_gradients", GradientCompression),
        powersgd_rank=f.raw("powersgd_rank", 4),
        sync=f.str("sync", "ring", choices=SYNC_CHOICES),
        virtual_stages=f.raw("virtual_stages", 1),
        warmup_depth=f.raw("warmup_depth", 1),
    )
    f.finish()
    return result


def _switch(f: Fields, key: str, kind) -> str:
    """A compression choice: one of ``kind`` or auto; YAML reads a bare ``off`` as false."""
    value = f.raw(key, "off")
    return "off" if value is False else f.str(key, "off", choices=tuple(kind) + ("auto",))


@functools.cache
def _presets() -> dict:
    folder = resources.files("topologies") / "models"
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            document = yaml.safe_load(entry.read_text())
            found[entry.name[:-5]] = document
    return found


def preset_names() -> list:
    return sorted(_presets())


def model_preset(name: str) -> ModelSpec:
    presets = _presets()
    if name not in presets:
        raise InputError(f"unknown model preset {name!r}: use one of {', '.join(sorted(presets))} "
                         "or describe the model (layers, hidden, heads, sequence, vocabulary)", field="model")
    document = dict(presets[name])
    document.setdefault("name", name)
    return parse_model(document, where=f"topologies/models/{name}.yaml")
